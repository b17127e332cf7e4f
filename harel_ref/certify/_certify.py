"""The entry point, :func:`certify`: check the options, open the transport once to see that
its factory works (:func:`preflight`), fit the profile to its speed, tell the plan, start the
search and branch processes, run the searches (:mod:`._engine`), and leave nothing behind,
whatever stops the run."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harel_ref.stateful import Capabilities
from harel_ref.stateful._async import limit_calls, open_transport
from harel_ref.stateful._forking import fork_server_of_its_own, kill_fork_server
from harel_ref.stateful._machine import FakeClock
from harel_ref.stateful._properties import PROPERTIES
from harel_ref.stateful._processes import BranchProcesses
from harel_ref.stateful.parallel import close_all

from ._engine import Certification, jobs_for
from ._focus import shared_properties
from ._jobs import SearchProcesses
from ._memory import DEFAULT_MEMORY_LIMIT, MemoryLimitReached, memory_limit as limit_memory
from ._passes import clean_up_process, run_task
from ._profiles import DEFAULT_CALL_DEADLINE, DEFAULT_SHRINK_LIMIT, SHARED_FACTOR, Profile, default_level
from ._progress import CallbackProgress, Plan, Progress, Speed, estimate_seconds
from ._report import LEVELS, PropertyVerdict, Report
from ._search_lanes import MAX_LANES, lanes_for
from ._signals import STUCK_AFTER, describe, last_resort, raise_if_stopped, signals_deferred, stop_on_signals, stopping
from ._target import CertificationError, Target, detect_protocol
from ._tasks import SOAK_PROPERTIES, Task, ordered_tasks

__all__ = ["certify", "preflight"]


def certify(
    factory: Callable,
    capabilities: Capabilities | None = None,
    *,
    profile: str | Profile = "standard",
    is_async: bool | None = None,
    seed: int = 0,
    properties: Iterable[str] | None = None,
    time_budget: float | None = None,
    processes: bool | None = None,
    soak: float | None = None,
    level: str | None = None,
    call_deadline: float | None = DEFAULT_CALL_DEADLINE,
    shrink_limit: float | None = DEFAULT_SHRINK_LIMIT,
    memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
    progress: Progress | Callable[[str, PropertyVerdict | None], None] | None = None,
    name: str | None = None,
    jobs: int | None = None, lanes: int | None = None,
    _target: Target | None = None,
) -> Report:
    """Certify the transport ``factory`` opens against the specification; return a Report.

    - ``factory(clock, namespace)`` returns a fresh, isolated transport for a new
      ``namespace``, and the same storage again for a namespace it has seen (reopen, second
      instance).  Async transports: an ``async def`` factory, or ``is_async=True``.
    - ``capabilities``: what the transport supports; by default what the factory declares
      (``factory.capabilities``, else the module's ``HAREL_CAPABILITIES``), else the defaults.
    - ``profile``: ``"quick"``, ``"standard"``, ``"thorough"`` (or one divided, ``"quick/3"``)
      or a :class:`Profile`.  Quick aims at :attr:`Profile.target` seconds: for a transport
      too slow for that (a networked store) it runs fitted (:meth:`Profile.fitted`), unless a
      ``time_budget`` is given; the report names the profile that ran.
    - ``seed``: every search is seeded with it, so the same call finds the same examples.
    - ``properties``: certify only these (names from :data:`PROPERTIES`).
    - ``time_budget``: seconds for the whole run, shared fairly among the searches left;
      a search cut short or never started is "unknown".  A soak takes its own time on top.
    - ``processes``: where the concurrent search runs the branches of its programs.  True: in
      separate processes (the factory must be importable by name, and its storage shared
      across processes).  False: in threads (tasks, for an asyncio transport).  None (the
      default): every other run in processes where that can be done (a ``shared`` transport
      whose factory other processes import and whose storage they see), else in threads.
    - ``soak``: also run a soak of this many seconds (several workers, the wall clock), whose
      history counts for single-in-flight, fencing, no-loss and contention.
    - ``level``: the conformance level the report's outcome and exit code follow,
      ``"contract"`` (what harel promises) or ``"strict"`` (all of harel-ref's spec); by
      default ``contract`` for a transport of harel's Protocol, else ``strict`` (SPEC.md R21).
      Both levels are always reported.
    - ``call_deadline``: seconds each call of the transport may take (opening it too) before
      it is declared hung, a failure of the property being searched (default
      :data:`DEFAULT_CALL_DEADLINE`; None: no deadline, calls run on the caller's thread).
    - ``shrink_limit``: seconds each search may spend shrinking a failure it found (default
      :data:`DEFAULT_SHRINK_LIMIT`; None: as long as Hypothesis takes).  When it is reached the
      failure is shown as it was found, and the report says why.
    - ``memory_limit``: bytes the certification's processes may take beyond what they held
      as it began (default :data:`DEFAULT_MEMORY_LIMIT`; None: no limit).  Past it the run stops
      as a signal stops it, by :class:`MemoryLimitReached`, with the report so far (SPEC.md C11).
    - ``progress``: a :class:`Progress` told what happens as it happens (or a callable
      ``progress(property, verdict)``, called with None as a property's searches start and
      with its verdict when they end).
    - ``jobs``: how many searches run at once, each in a process of its own (default
      :func:`default_jobs`: the cores available).  The report is the one a serial run gives
      with the same seed; with a ``time_budget`` the shares are cut as if the searches ran
      ``jobs`` at a time.  Other processes build the factory again by its name, so a factory
      that cannot be imported by name (a closure) runs its searches one at a time, and the
      plan says so.
    - ``lanes``: examples of a lockstep search run at once, each lane a thread with transports
      of its own (SPEC.md C2a; the replay asks for them again): by default 8 on a wall clock
      (its examples mostly sleep), else 1, and 4 for the bundled rqlite transports certified
      by name (``--bundled``); a transport that answers over a network gains from a few.

    Whatever the transport does, the certification goes on (see the module docstring).  If it
    is stopped (KeyboardInterrupt, SystemExit) or the certifier itself fails, the exception is
    raised again carrying the report so far as its ``report`` attribute: the verdicts reached,
    the property being searched and those not reached ``unknown``.

    A transport of harel's own Protocol (``harel.engine.transport``) is certified as it is:
    declare ``Capabilities(protocol="harel")`` (or ``Capabilities.harel()``), or let the
    certifier see it (a ``claim`` without ``routing_keys``).  Its factory may be harel.testing's
    ``make(clock)``, which must open a fresh queue on every call (SPEC.md R20).
    """
    profile, chosen, progress = _checked(profile, properties, progress, time_budget=time_budget, soak=soak,
                                         call_deadline=call_deadline, shrink_limit=shrink_limit,
                                         memory_limit=memory_limit, jobs=jobs, level=level, lanes=lanes)
    held = _Held()
    with fork_server_of_its_own(), stop_on_signals(), last_resort(held.stuck), \
            limit_memory(memory_limit) as end_memory_watch, limit_calls(call_deadline) as limits:
        target = _target if _target is not None else Target.from_factory(factory, capabilities, is_async)
        target = detect_protocol(target) if lanes is None else dataclasses.replace(detect_protocol(target), lanes=lanes)
        layout = _Layout.of(target, chosen, soak, processes, jobs)
        held.hypothesis_home = tempfile.mkdtemp(prefix="harel-ref-hypothesis-")

        def certification(profile: Profile, progress: Progress) -> Certification:
            return Certification(target, profile, seed, chosen, layout.tasks, time_budget, held.pool, soak, limits,
                                 progress, name, level or default_level(target.capabilities), layout.jobs,
                                 held.searchers, held.hypothesis_home, layout.branches, shrink_limit)

        held.run = certification(profile, progress)  # the report of a run stopped before it begins
        searching = False
        try:
            speed = _started(held, target, layout, call_deadline)
            plan = _plan(target, layout, profile, speed, seed=seed, name=name, time_budget=time_budget,
                         call_deadline=call_deadline, soak=soak)
            progress.planned(plan)
            held.run = certification(plan.profile, progress)
            searching = True
            report = held.run.all()
        except BaseException as stop:
            if searching or isinstance(stop, (KeyboardInterrupt, SystemExit)):  # else refused before searching
                _give_report(stop, held.run)
            raise
        finally:
            with signals_deferred():  # a signal now is raised once all is closed and removed
                end_memory_watch()  # a limit crossed until now is raised just below, with the report
                _close_all(held.pool, held.searchers, held.hypothesis_home)
        try:
            raise_if_stopped()  # one that came during the clean-up
        except KeyboardInterrupt as stop:
            _give_report(stop, held.run)
            raise
        return report


def _checked(profile: str | Profile, properties: Iterable[str] | None,
             progress: Progress | Callable[[str, PropertyVerdict | None], None] | None, *,
             time_budget: float | None, soak: float | None, call_deadline: float | None,
             shrink_limit: float | None, memory_limit: int | None, jobs: int | None,
             level: str | None, lanes: int | None = None) -> tuple[Profile, list[str], Progress]:
    """:func:`certify`'s options checked, each bad one refused by name: the profile, the chosen
    properties in order, and a :class:`Progress` to tell."""
    if isinstance(profile, str):
        profile = Profile.named(profile)
    chosen = list(PROPERTIES) if properties is None else list(dict.fromkeys(properties))
    unknown = [p for p in chosen if p not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; choose from {list(PROPERTIES)}")
    for option, value in (("time_budget", time_budget), ("soak", soak), ("call_deadline", call_deadline),
                          ("shrink_limit", shrink_limit)):
        if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{option} must be a positive number of seconds (or None), got {value!r}")
    if memory_limit is not None and (type(memory_limit) is not int or memory_limit < 1):
        raise ValueError(f"memory_limit must be a whole number of bytes >= 1 (or None), got {memory_limit!r}")
    if jobs is not None and (type(jobs) is not int or jobs < 1):
        raise ValueError(f"jobs must be a whole number >= 1 (or None: the cores available), got {jobs!r}")
    if lanes is not None and (type(lanes) is not int or not 1 <= lanes <= MAX_LANES):
        raise ValueError(f"lanes must be a whole number from 1 to {MAX_LANES} (or None: 4 on a bundled "
                         f"rqlite, 8 on a wall clock, else 1), got {lanes!r}")
    if level is not None and level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose from {list(LEVELS)}")
    if soak is not None and not SOAK_PROPERTIES & set(chosen):
        raise ValueError(f"a soak counts for {sorted(SOAK_PROPERTIES)}: select one of them, or drop the soak")
    if progress is None:
        return profile, chosen, Progress()
    if not isinstance(progress, Progress):
        if not callable(progress):
            raise TypeError(f"progress must be a harel_ref.certify.Progress or a callable, got {progress!r}")
        progress = CallbackProgress(progress)
    return profile, chosen, progress


@dataclass
class _Held:
    """What a certification holds while it runs (its processes and scratch directory), and the
    certification itself, for whatever ends it to let go of."""

    hypothesis_home: str = ""
    run: Certification | None = None
    pool: BranchProcesses | None = None  # the branch processes
    searchers: SearchProcesses | None = None

    def stuck(self, stop: KeyboardInterrupt, handed: dict[str, Any]) -> None:
        """The last resort of a run that did not stop (harel_ref.certify._signals): the report
        so far for the caller, and no process or scratch left behind."""
        if self.run is not None:
            handed["report"] = self.run.report(
                f"the certification was stopped by {describe(stop)}, and had not stopped by itself "
                f"{STUCK_AFTER:g} s later (a transport's call that let no signal through)")
        if self.pool is not None:
            self.pool.kill()
        if self.searchers is not None:
            self.searchers.terminate()
        if self.hypothesis_home:
            shutil.rmtree(self.hypothesis_home, ignore_errors=True)
        kill_fork_server()  # the process ends with os._exit: nothing else would stop it


@dataclass
class _Layout:
    """Where a certification's searches run: its tasks, the properties that apply, where the
    concurrent search's branches run (``threads``, ``processes`` or ``both``: see BRANCHES),
    and how many searches run at once (with a note when fewer than asked)."""

    chosen: list[str]
    applicable: list[str]
    tasks: list[Task]
    branches: str
    jobs: int
    jobs_note: str = ""
    branches_note: str = ""

    @classmethod
    def of(cls, target: Target, chosen: list[str], soak: float | None, processes: bool | None,
           jobs: int | None) -> _Layout:
        caps = target.capabilities
        applicable = [p for p in chosen if PROPERTIES[p].needs(caps) is None]
        tasks = ordered_tasks(chosen, applicable, soak, shared_properties(caps))
        concurrent = any(PROPERTIES[p].concurrent for p in applicable)
        branches = "threads" if processes is False or not concurrent else "processes" if processes else "both"
        if branches == "both" and (not caps.shared or target.in_process):
            branches = "threads"  # instances do not share its storage, or only in one process
        jobs, jobs_note = jobs_for(target, jobs, tasks, processes=branches != "threads")
        return cls(chosen, applicable, tasks, branches, jobs, jobs_note)


def _started(held: _Held, target: Target, layout: _Layout, call_deadline: float | None) -> Speed:
    """Start the search processes (they import while the preflight runs) and the branch
    processes, where they can run; ``layout`` says where they could not.  The preflight's
    speed."""
    if layout.jobs > 1:
        held.searchers = SearchProcesses(target, layout.jobs, run_task, clean_up_process)
    speed = preflight(target)
    if held.searchers is not None and (why := held.searchers.ready()) is not None:
        held.searchers.close()
        held.searchers, layout.jobs, layout.jobs_note = None, 1, f"searches run one at a time: {why}"
    if layout.branches == "both" and target.recipe is None:
        layout.branches = "threads"
        layout.branches_note = "the factory cannot be imported by name (a module-level one can)"
    if layout.branches != "threads":
        try:
            held.pool = _branch_processes(target, call_deadline)
        except CertificationError as exc:
            if layout.branches == "processes":  # asked for: the user must hear why it cannot be
                raise
            layout.branches, layout.branches_note = "threads", str(exc).removeprefix("--processes: ")
    return speed


def _plan(target: Target, layout: _Layout, asked: Profile, speed: Speed, *, seed: int, name: str | None,
          time_budget: float | None, call_deadline: float | None, soak: float | None) -> Plan:
    """What the certification is about to do: the profile ``asked`` fitted to the transport's
    ``speed`` (unless the time is the caller's to share: a ``time_budget``), and an estimate."""
    caps, tasks = target.capabilities, layout.tasks
    standby = sum(task.standby for task in tasks)  # if the shared search passes, they do not run
    lockstep = sum(PROPERTIES[p].search == "lockstep" for p in layout.applicable)
    searches = dict(lockstep=lockstep - standby + (SHARED_FACTOR if standby else 0),
                    parallel=int(any(PROPERTIES[p].concurrent for p in layout.applicable)),
                    branches=layout.branches, soak=soak)
    lanes = target.lanes if target.lanes is not None else lanes_for(caps)
    searches.update(jobs=min(layout.jobs, len(tasks) - standby), largest=SHARED_FACTOR if standby else 1, lanes=lanes)
    profile = asked if time_budget is not None else asked.fitted(lambda p: estimate_seconds(p, caps, speed, **searches))
    estimate = estimate_seconds(profile, caps, speed, **searches)
    if time_budget is not None:
        estimate = min(estimate, time_budget + (soak or 0.0))
    chosen = layout.chosen
    return Plan(
        transport=name or target.name, capabilities=caps, is_async=target.is_async, profile=profile,
        fitted_from=asked if profile is not asked else None, seed=seed, properties=tuple(chosen),
        not_applicable=tuple(p for p in chosen if p not in layout.applicable), branches=layout.branches, soak=soak,
        time_budget=time_budget, call_deadline=call_deadline, estimate=estimate, jobs=layout.jobs,
        jobs_note=layout.jobs_note, shared=tuple(task.prop for task in tasks if task.standby), branches_note=layout.branches_note,
        lanes=lanes,
    )


def _close_all(pool: BranchProcesses | None, searchers: SearchProcesses | None, hypothesis_home: str) -> None:
    """End a certification's branch and search processes, and remove its Hypothesis home.  A
    run stopped by a signal gives a branch 2 s, not 10, to finish: it stops within seconds."""
    if pool is not None:
        pool.close(grace=2.0 if stopping() else 10.0)
    if searchers is not None:
        searchers.close()
    shutil.rmtree(hypothesis_home, ignore_errors=True)


def _give_report(stop: BaseException, run: Certification) -> None:
    """Give the exception that stopped a certification (a signal, or a failure of the certifier)
    the report so far, as its ``report``: the verdicts reached, the property being searched and
    those after it unknown.  Made with signals deferred, so that a second one cannot cut it."""
    with signals_deferred():
        why = f"the certification was stopped by {type(stop).__name__}"
        if isinstance(stop, MemoryLimitReached):
            why = f"the certification was stopped by {describe(stop)}"
        elif not isinstance(stop, (KeyboardInterrupt, SystemExit)):
            why = f"the certifier failed: {type(stop).__name__}: {stop}"
        stop.report = run.report(why)


def _branch_processes(target: Target, call_deadline: float | None) -> BranchProcesses:
    """Worker processes for the branches, once it is known that they can share the queue."""
    if target.recipe is None:
        raise CertificationError(
            f"--processes needs a factory other processes can import by name (module:factory); "
            f"{target.name} cannot be"
        )
    pool = BranchProcesses(target.recipe, is_async=target.is_async, protocol=target.capabilities.protocol,
                           deadline=call_deadline)
    try:
        pool.probe(target.factory, open_transport)
    except Exception as exc:
        pool.close()
        raise CertificationError(f"--processes: {exc}") from exc
    return pool


def _round_trip(transport: Any) -> float:
    """Seconds for a publish, a claim and an ack (three calls) on ``transport``."""
    began = time.perf_counter()
    transport.publish("harel-ref-preflight", "timing")
    lease = transport.claim("harel-ref-preflight", 60.0)
    if lease is not None:
        transport.ack(lease)
    return time.perf_counter() - began


def preflight(target: Target) -> Speed:
    """Open and close one transport, so a factory that cannot work fails with a clear error
    instead of thirteen failed searches; then time opening three more, each on a fresh namespace
    as an example does, and a dozen calls (publish, claim, ack), for the estimate of how long
    the searches take (the first opening pays for what happens once: imports, connections).
    Each is the fastest of its tries: the search processes start at the same time, and on two
    cores their imports made an in-memory call seem 18 times slower (197 µs), which the
    estimate multiplies by the calls of every step."""
    loop = asyncio.new_event_loop() if target.is_async else None
    clock = time.time if target.capabilities.clock == "wall" else FakeClock()
    opened = []
    try:
        try:
            opened.append(open_transport(target.factory, clock, "harel_ref_preflight", loop, target.capabilities.protocol))
            opened.pop().close()
        except Exception as exc:
            raise CertificationError(
                f"the factory {target.name} could not open and close a transport: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        speed = Speed(open=0.0, call=0.0)
        try:
            opens = []
            for _ in range(3):  # each on a namespace of its own, as every example's is
                began = time.perf_counter()
                opened.append(open_transport(target.factory, clock, f"harel_ref_preflight_{uuid.uuid4().hex[:8]}",
                                             loop, target.capabilities.protocol))
                opens.append(time.perf_counter() - began)
            speed = Speed(open=min(opens), call=0.0)
            return dataclasses.replace(speed, call=min(_round_trip(opened[0]) for _ in range(8)) / 3)
        except Exception:
            return speed  # the searches will say what is wrong
    finally:
        close_all(opened, loop)
