"""The certification engine: one shared lockstep search, and focused ones where it finds anything.

A single lockstep search stops at the first divergence, so it can say "something is wrong"
but not which of the thirteen lockstep properties hold.  The engine therefore has one focused search per
property, each with the machine narrowed to what that property needs:

- only the rules that exercise it (bad input is sent only when checking bad input, stale
  leases are acked only when checking fencing, reopen happens only when checking durability);
- the other properties' fine print relaxed: outside the fairness search the model accepts any
  claimable group, outside the lease-expiry search a claim is judged as if it happened anywhere
  within one tick of the clock (so an off-by-one-tick lease end does not stop the FIFO search),
  and priority and routing are exercised only by their own searches.

Most transports that are certified pass, and for them thirteen searches are twelve too many.  So
a full certification first runs the *shared* lockstep search (SPEC.md C5): every rule, every
check, four times a focused search's examples.  If it passes, it stands for the thirteen; if it
finds anything, the focused searches run ("stand by") and decide the verdicts, and what the
shared search found is weighed after them.

What each search runs is the property table's to say (:mod:`harel_ref.stateful._properties`):
the checkers report facts (:mod:`harel_ref.stateful._facts`), and one pure function
(:mod:`harel_ref.certify._verdicts`) turns what the searches found into verdicts: whom each fact
counts against, which failures are consequences of another, and every verdict.  This module only
runs the searches.  Each search is seeded, so a failure replays exactly.

Concurrency (SPEC.md R19) has one search of its own (:mod:`harel_ref.stateful.parallel`): the
*concurrent* search runs programs of a sequential prefix and two to six branches at once,
each ``repeats`` times, and judges every run twice (SPEC.md C6):

- for ``contention``: no call may fail only because others run at the same time;
- by the linearizability checker, for ``single-in-flight``, ``fencing`` and ``no-loss``, whose
  verdicts need both their lockstep search and it.

It runs once, for the first property that needs it; once it finds something it goes on with
what it found taken as known, so that the other properties it judges get verdicts of their own.  With ``soak=SECONDS``, a soak
(:mod:`harel_ref.stateful.soak`) is shared the same way by those four.

Every search is a task (:class:`Task`) that reports what it found as data (:class:`Found`).
Tasks run one at a time here or ``jobs`` at a time in search processes
(:mod:`harel_ref.certify._jobs`); either way the verdicts are made from the searches in the order
a serial run makes them, so the report does not depend on which search finished first (SPEC.md
C1, C2).

The certifier survives anything a transport does (:mod:`harel_ref.stateful._async`): every call is made
under a deadline (``call_deadline``), and a call that panics, crashes its thread or its branch
process, or hangs is a failure of the property being searched, named by what happened
(``panicked: PanicException: ...``, ``hung: claim did not return within 30 s``).  A hang or a
dead branch process stops that search at once (the transport is not called again), so its
example is reported as found, not shrunk.  A run stopped by KeyboardInterrupt or SystemExit, or
by a failure of the certifier itself, still has a report: the exception carries it.

The engine is in parts, each a module: the profiles (:mod:`._profiles`), which machine each
search runs (:mod:`._focus`), the Hypothesis driver that runs one search and watches its
examples (:mod:`._driver`), a search's passes (:mod:`._passes`), the searches a run makes and
what each found (:mod:`._tasks`), the report's account of a failure (:mod:`._entries`), the
plan and progress told to a front-end (:mod:`._progress`), and the entry point
(:mod:`._certify`).  This module schedules: it runs the tasks here or in search processes, and
weighs what they found in the order a serial run makes them."""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing
import os
import time
from collections.abc import Iterable
from typing import Any

from harel_ref.stateful._async import CallLimits
from harel_ref.stateful._facts import raised_error
from harel_ref.stateful._properties import PROPERTIES, SHARED, unreached
from harel_ref.stateful._processes import BranchProcesses

from ._jobs import SearchProcesses
from ._passes import run_task
from ._profiles import Profile
from ._progress import Progress
from ._report import PropertyVerdict, Report
from ._search_lanes import lanes_for
from ._signals import raise_if_stopped
from ._target import Target
from ._tasks import Found, Task
from ._verdicts import Searched, blame, fault_owners, verdicts

__all__ = ["default_jobs"]


def default_jobs() -> int:
    """How many searches run at once unless told: ``HAREL_REF_JOBS`` if set (a test suite that
    runs many certifications side by side sets it to 1), else the cores this process may use."""
    text = os.environ.get("HAREL_REF_JOBS", "").strip()
    if text:
        if not (text.isdigit() and int(text) >= 1):
            raise ValueError(f"HAREL_REF_JOBS must be a whole number >= 1, got {text!r}")
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def jobs_for(target: Target, jobs: int | None, tasks: list[Task], *, processes: bool) -> tuple[int, str]:
    """The number of search processes to use, and a note when it is fewer than asked."""
    asked = default_jobs() if jobs is None else jobs
    in_processes = [task for task in tasks if not _runs_at_home(task, processes)]
    if asked <= 1 or len(in_processes) <= 1:
        return 1, ""
    if target.recipe is None:
        return 1, (f"searches run one at a time: {target.name} cannot be imported by name, so other "
                   "processes cannot build it (a module-level factory can)")
    return min(asked, len(in_processes)), ""


def _runs_at_home(task: Task, processes: bool) -> bool:
    """Whether ``task`` runs in the certifying process even with jobs: the soak (it keeps its
    own wall-clock time), and with ``processes`` the concurrent search (it owns the branch
    processes)."""
    return task.kind == "soak" or (processes and _search_of(task.kind) not in ("lockstep", SHARED))


def _search_of(kind: str) -> str:
    """What kind of search a task runs: ``lockstep`` (a property's own), ``shared`` (the
    shared lockstep search), ``concurrent`` or ``soak`` (shared parallel ones)."""
    return PROPERTIES[kind].search if kind in PROPERTIES else kind


class Certification:
    """One certification under way: its searches, run one at a time or in search processes,
    and what they found, weighed in the order of the searches (so the report does not depend
    on which finished first)."""

    def __init__(self, target: Target, profile: Profile, run_seed: int, chosen: list[str], tasks: list[Task],
                 time_budget: float | None, pool: BranchProcesses | None, soak_seconds: float | None,
                 limits: CallLimits, progress: Progress, name: str | None, level: str, jobs: int,
                 searchers: SearchProcesses | None, hypothesis_home: str, branches: str = "threads",
                 shrink_limit: float | None = None) -> None:
        self.target, self.caps, self.profile, self.seed = target, target.capabilities, profile, run_seed
        self.chosen, self.tasks, self.pool, self.soak_seconds = chosen, tasks, pool, soak_seconds
        self.progress, self.name, self.level, self.searchers = progress, name, level, searchers
        self.started = time.monotonic()
        self.context = dict(
            profile=profile, seed=run_seed, soak=soak_seconds, call_deadline=limits.deadline, jobs=jobs,
            hypothesis_home=hypothesis_home, branches=branches if pool is not None else "threads",
            shrink_limit=math.inf if shrink_limit is None else shrink_limit,
            end=math.inf if time_budget is None else self.started + time_budget,
            budgeted=sum(task.kind != "soak" and not task.standby for task in tasks),
            lanes=target.lanes if target.lanes is not None else lanes_for(target.capabilities),
        )
        self.shared = next((n for n, task in enumerate(tasks) if task.kind == SHARED), None)
        self.standby = [n for n, task in enumerate(tasks) if task.standby]
        self.covered = {tasks[n].prop for n in self.standby}  # the properties the shared search covers
        self.found: dict[int, Found] = {}  # task number -> what that search found
        self.running: set[int] = set()
        self.unshrunk: dict[int, Found] = {}  # task number -> the failure it found, before shrinking
        self.told = 0  # verdicts told to progress, in order

    def all(self) -> Report:
        """Run every search and tell each verdict once it is settled; the report.  (If the run
        is stopped or fails, :func:`certify` gives the exception the report so far.)"""
        started = multiprocessing.Value("i", 0) if self.searchers is None else self.searchers.started
        if self.searchers is None:
            self.run_here(range(len(self.tasks)), started)
        else:
            self.run_in_processes()
        self.shrink_echoes(started)
        raise_if_stopped()  # a signal whose exception Python swallowed (see _signals)
        self.tell()
        return self.report()

    def event(self, number: int, name: str, *args: Any) -> None:
        """What search ``number`` tells as it goes: a :class:`Progress` method's name and its
        arguments, or ``"found"`` and its failure before shrinking (:meth:`report`)."""
        if name == "found":
            self.unshrunk[number] = args[0]
        else:
            getattr(self.progress, name)(*args)

    def run_here(self, numbers: Iterable[int], started) -> None:
        for number in numbers:
            if number in self.found:  # a standby search the shared search made needless
                continue
            raise_if_stopped()
            self.running.add(number)
            event = functools.partial(self.event, number)
            self.found[number] = run_task(self.target, self.context, self.tasks[number], started, event, self.pool)
            self.running.discard(number)
            if number == self.shared:
                self.shared_ended()

    def run_in_processes(self) -> None:
        """Longest first: the shared lockstep search (what it finds decides whether the standby
        searches run), the concurrent search, then the lockstep ones in order."""
        searchers = self.searchers
        away = [n for n, task in enumerate(self.tasks)
                if not _runs_at_home(task, self.pool is not None) and not task.standby]
        for number in sorted(away, key=lambda n: (self.tasks[n].kind != SHARED,
                                                  _search_of(self.tasks[n].kind) == "lockstep")):
            searchers.submit(number, self.tasks[number], self.context)
        self.running.update(away)
        self.run_here([n for n in range(len(self.tasks)) if n not in away and not self.tasks[n].standby],
                      searchers.started)
        for kind, number, detail in searchers.outcomes():
            if kind == "event":
                self.event(number, *detail)
                continue
            if kind == "died":
                detail = Found("unknown", f"{detail}: a search process died while searching", 0.0, 0)
            self.found[number] = detail
            self.running.discard(number)
            if number == self.shared:
                for standby in self.shared_ended():
                    searchers.submit(standby, self.tasks[standby], self.context)
                    self.running.add(standby)

    def shared_passed(self) -> bool:
        """Whether the shared lockstep search ran and passed: then it stands for the focused
        searches of the properties it covers, which do not run (SPEC.md C5)."""
        return self.shared in self.found and self.found[self.shared].ended == "passed"

    def shared_ended(self) -> list[int]:
        """Once the shared search has ended: the standby searches to run now (all of them,
        unless it passed; then those of the properties it left undecided or whose situations it
        never reached, and those it made needless are recorded as found), first those of the
        properties its failures count against, which run all their examples (SPEC.md C5)."""
        wanted = list(self.standby)
        if self.shared_passed():
            shared = self.found[self.shared]
            unreached_by_shared = {prop: missed for prop in self.covered
                                   if (missed := unreached(prop, self.caps, shared.reached))}
            self.context["unreached"] = unreached_by_shared
            wanted = [number for number in self.standby
                      if self.tasks[number].prop in shared.undecided or self.tasks[number].prop in unreached_by_shared]
            for number in set(self.standby) - set(wanted):
                self.found[number] = Found("covered", "the shared search passed", 0.0, 0)
        self.context["budgeted"] += len(wanted)  # their share of a time budget
        if self.shared in self.found and wanted:
            covers = self.tasks[self.shared].covers
            shared = Searched(SHARED, covers, "failed", failures=tuple(self.found[self.shared].failures))
            self.context["shared_blamed"] = frozenset(blame(f.fact, shared) for f in shared.failures)
            # the errors it met: the other searches set them aside, one bug (SPEC.md C5)
            self.context["shared_errors"] = fault_owners([shared])
            self.context["shared_clean"] = self.found[self.shared].clean  # its clean examples count for theirs
        blamed = self.context.get("shared_blamed", ())
        return sorted(wanted, key=lambda number: self.tasks[number].prop not in blamed)  # the longest first

    def shrink_echoes(self, started) -> None:
        """Once every search has ended: a property that failed only by echoes (facts of its bug
        that other searches met after the shared search and set aside unshrunk: SPEC.md C5) has
        no counterexample to show, as when its own search never meets its bug; nor has one whose
        verdict is a consequence of another's failure (unknown) and whose own search never ran
        (the shared search stood for it).  The search whose
        echo the verdict shows runs again, here, setting aside every other kind of fact (its own
        property's too), so it draws the same examples up to the echo, and shrinks it; what it
        shrank takes the echo's place and its time counts for that search."""
        echoes = [verdict.failure for verdict in self.verdicts().values()
                  if verdict.verdict in ("failed", "unknown") and verdict.failure is not None and verdict.failure.echo]
        self.context["budgeted"] += len(echoes)  # their share of a time budget
        for echo in echoes:
            number = next(n for n in sorted(self.found) if any(f is echo for f in self.found[n].failures))
            shrinks = raised_error(echo.fact) or echo.kind  # an error: that one, not any other
            task = dataclasses.replace(self.tasks[number], shrinks=shrinks)
            found = run_task(self.target, self.context, task, started, self._progress_only, self.pool)
            shrunk = [f for f in found.failures if (raised_error(f.fact) or f.kind) == shrinks and not f.echo]
            had = self.found[number]
            if shrunk:
                had.failures = [shrunk[0] if f is echo else f for f in had.failures]
            had.seconds += found.seconds

    def _progress_only(self, name: str, *args: Any) -> None:
        """What a search run again by :meth:`shrink_echoes` tells: progress, not its failure
        before shrinking (a stop while it shrinks keeps the echo)."""
        if name != "found":
            getattr(self.progress, name)(*args)

    # --- verdicts ---------------------------------------------------------------------------

    def tell(self) -> None:
        """Tell progress every verdict, in order, once every search has ended: a fact any search
        finds may count against any property (a drain in one search shows a fifo failure), or
        make a failure the consequence of another, so no verdict is settled before."""
        if len(self.found) < len(self.tasks):
            return
        made = self.verdicts()
        while self.told < len(self.chosen):
            self.progress.finished(made[self.chosen[self.told]])
            self.told += 1

    def searched(self, why: str | None = None) -> list[Searched]:
        """Every search, as the verdicts need it: how it ended, or that it never did."""
        searched = []
        for number, task in enumerate(self.tasks):
            found = self.found.get(number)
            if found is None:
                how = "interrupted" if number in self.running else "not reached"
                found = Found("unknown", f"{how}: {why}" if why else how, 0.0, 0)
            searched.append(Searched(task.kind, task.covers, found.ended, found.reason, found.seconds,
                                     found.examples, tuple(found.failures), found.reached,
                                     stopped_at=tuple(found.failures[found.earlier:]), undecided=found.undecided))
        return searched

    def verdicts(self, why: str | None = None) -> dict[str, PropertyVerdict]:
        """The verdict on every chosen property (and any other that a search found broken)."""
        return verdicts(self.chosen, self.caps, self.searched(why), why)

    def report(self, why: str | None = None) -> Report:
        """The report: of the whole run, or (``why`` it stopped) of the run so far, where a
        search stopped while it shrank a failure shows that failure as it was found."""
        if why is not None:
            for number in sorted(self.running & self.unshrunk.keys()):
                found = self.unshrunk[number]  # those before found.earlier were shrunk (run_task)
                stop = f"the run's stop ({why.removeprefix('the certification was ')})"
                stopped = [dataclasses.replace(failure, unshrunk=stop) for failure in found.failures[found.earlier:]]
                self.found[number] = dataclasses.replace(
                    found, failures=[*found.failures[:found.earlier], *stopped],
                    reason=found.reason if found.ended != "unknown" else f"interrupted: {why}")
                self.running.discard(number)
        verdicts = self.verdicts(why)
        return Report(
            transport=self.name or self.target.name,
            capabilities=self.caps,
            is_async=self.target.is_async,
            profile=self.profile,
            seed=self.seed,
            verdicts=tuple(verdicts.values()),
            seconds=time.monotonic() - self.started,
            replay=self.target.command(self.profile.name, self.seed, branches=self.context["branches"],
                                       soak=self.soak_seconds),
            descriptions={p: PROPERTIES[p].what for p in verdicts},
            branches=self.context["branches"],
            soak=self.soak_seconds,
            level=self.level,
            shared=tuple(self.tasks[n].prop for n in self.standby),
        )
