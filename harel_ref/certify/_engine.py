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

Every search is a task (:class:`_Task`) that reports what it found as data (:class:`_Found`).
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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import math
import multiprocessing
import os
import shutil
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import FlakyFailure, FlakyStrategyDefinition, HypothesisException, InvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from harel_ref.stateful import Backend, Capabilities, Divergence, make_machine
from harel_ref.stateful._async import (
    CallLimits,
    TransportCrashed,
    TransportHung,
    TransportPanic,
    limit_calls,
    open_transport,
)
import harel_ref.stateful._facts as facts
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._machine import FOCUS_RULES, RULES, TICK, Choices, FakeClock
from harel_ref.stateful._properties import (
    PROPERTIES, SHARED, UNJUDGED, explained, machine_settings, owner, owners, running, tally,
)
from harel_ref.stateful._processes import BranchProcesses
from harel_ref.stateful.parallel import (RAISES, ConcurrencyFailure, Program, check_program, close_all, programs,
                                        smaller_programs)
from harel_ref.stateful.soak import soak as run_soak

from ._jobs import SearchProcesses
from ._report import ECHO, LEVELS, Failure, PropertyVerdict, Report
from ._verdicts import (
    Searched, anothers, blame, left_undecided, sets_aside, shared_sets_aside, unexplained, verdicts,
)
from ._memory import DEFAULT_MEMORY_LIMIT, MemoryLimitReached, memory_limit as limit_memory
from ._reduce import replayed, without_steps
from ._signals import STUCK_AFTER, describe, last_resort, raise_if_stopped, signals_deferred, stop_on_signals, stopping
from ._target import CertificationError, Target, detect_protocol

__all__ = [
    "DEFAULT_CALL_DEADLINE", "DEFAULT_SHRINK_LIMIT", "PROFILES", "PROPERTIES", "Plan", "Profile", "Progress", "certify", "default_jobs",
    "default_level", "focus_machine", "shared_properties",
]

DEFAULT_SHRINK_LIMIT = 120.0
"""Seconds a search may spend shrinking a failure it found before it shows the failure as found
(SPEC.md C10).  A transport whose calls are slow (a wall clock, a server far away) made
Hypothesis shrink one failure for over five minutes."""

DEFAULT_CALL_DEADLINE = 30.0
"""Seconds a transport call may take before it is declared hung.  Not scaled by the profile:
a profile says how many calls to make, not how long one may take.  Generous for a networked
store (an rqlite call takes milliseconds); tests of a hanging transport pass a smaller one."""


@dataclass(frozen=True)
class Profile:
    """How hard each search looks: Hypothesis's ``max_examples`` and ``stateful_step_count``
    for every lockstep search; for the concurrent search, ``programs`` examples, each
    program run up to ``repeats`` times (races are rare events).

    ``target``: the seconds a certification with this profile aims at, whatever the transport
    (quick's).  A transport too slow for it, such as a networked store, whose every call and
    every opening is a round trip, gets the profile :meth:`fitted` to it: fewer examples and
    runs per search, the same steps and programs."""

    name: str
    max_examples: int
    step_count: int
    programs: int = 10
    repeats: int = 10
    target: float | None = None

    def __post_init__(self) -> None:
        if min(self.max_examples, self.step_count, self.programs, self.repeats) < 1:
            raise ValueError(f"every count of a Profile must be >= 1, got {self}")

    def divided(self, by: int) -> Profile:
        """This profile with its searches ``by`` times smaller: the examples of each lockstep
        search (at least 5) and the runs of each parallel program (at least 2); named
        ``NAME/by`` (what ``--profile quick/3`` asks for).  It is never fitted again: ``quick/1``
        is quick as it is, whatever the transport."""
        return Profile(f"{self.name}/{by}", max(5, math.ceil(self.max_examples / by)), self.step_count,
                       self.programs, max(2, math.ceil(self.repeats / by)))

    def fitted(self, estimate: float) -> Profile:
        """What runs for a transport estimated to take ``estimate`` seconds with this profile:
        the profile itself, unless it has a ``target`` and the estimate is more than twice that;
        then :meth:`divided` by the smallest of :data:`FITS` that brings the estimate under the
        target.  The margin keeps an in-process transport on a busy machine, whose estimate
        swells, from being fitted one run and not the next; a networked store, whose every call
        is a round trip, is well beyond it."""
        if self.target is None or estimate <= 2 * self.target:
            return self
        return self.divided(next((by for by in FITS if estimate / by <= self.target), FITS[-1]))

    @classmethod
    def named(cls, name: str) -> Profile:
        """``quick``, ``standard``, ``thorough``, or one of them divided: ``quick/3``."""
        base, slash, by = name.partition("/")
        if base not in PROFILES or (slash and not (by.isdigit() and int(by) >= 1)):
            raise ValueError(f"unknown profile {name!r}; choose from {list(PROFILES)}, or one divided "
                             f"by a whole number (quick/3)")
        return PROFILES[base].divided(int(by)) if slash else PROFILES[base]

    @property
    def shared_examples(self) -> int:
        """Examples of the shared lockstep search (SPEC.md C5): :data:`SHARED_FACTOR` times a
        focused search's, which reaches each property's situations at least as often as that
        property's own search does (docs/certify-speed.md)."""
        return SHARED_FACTOR * self.max_examples

    @property
    def shrink_repeats(self) -> int:
        """Runs per program while a failure is being shrunk: a race that a program still
        contains shows within a few runs, and a program without it need not cost all of them."""
        return max(3, self.repeats // 3)


SHARED_FACTOR = 4
"""How many focused searches' examples the shared search runs (Profile.shared_examples)."""

FITS = (2, 3, 4, 6, 8)
"""What a profile with a target may be divided by to fit a slow transport (Profile.fitted)."""

PROFILES = {
    "quick": Profile("quick", max_examples=50, step_count=20, programs=20, repeats=20, target=75.0),
    "standard": Profile("standard", max_examples=120, step_count=35, programs=40, repeats=30),
    "thorough": Profile("thorough", max_examples=500, step_count=60, programs=150, repeats=50),
}


def default_level(caps: Capabilities) -> str:
    """The level the exit code follows unless one is chosen: ``contract`` for a transport of
    harel's Protocol, ``strict`` for one of harel-ref's."""
    return "contract" if caps.protocol == "harel" else "strict"


SOAK_PROPERTIES = frozenset(p for p, row in PROPERTIES.items() if row.concurrent)
"""The properties a soak counts for (single-in-flight, fencing, no-loss, contention)."""


def shared_properties(caps: Capabilities) -> tuple[str, ...]:
    """The lockstep properties the shared search (SPEC.md C5) covers for a transport of
    ``caps``: every one that applies.  None for a transport that acks by seq: fencing judges
    its stale acks with a fenced model, single-in-flight and no-loss what they break with the
    declared one, and one machine cannot do both."""
    if caps.acks == "by-seq":
        return ()
    return tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep" and row.needs(caps) is None)


def focus_machine(
    factory: Callable,
    property: str,
    capabilities: Capabilities | None = None,
    *,
    is_async: bool = False,
) -> type:
    """The lockstep machine class that the search for ``property`` runs, or the shared search
    (``property`` ``"shared"``: the rules of every property of :func:`shared_properties`,
    judging everything they judge).

    Reports print failing steps against this class, so a reproduction is: build the class
    with the same arguments, then run the printed steps.
    """
    caps = capabilities if capabilities is not None else Capabilities()
    if property == SHARED:
        covered = shared_properties(caps)
        if not covered:
            raise ValueError("a transport that acks by seq has no shared search: its properties are searched one by one")
    elif property not in PROPERTIES:
        raise ValueError(f"unknown property {property!r}; choose from {list(PROPERTIES)} or {SHARED!r}")
    elif PROPERTIES[property].search != "lockstep":
        raise ValueError(f"{property!r} is searched by running programs at once, not by a lockstep machine")
    else:
        covered = (property,)
    settings = machine_settings(covered, caps, TICK)
    name = "".join(word.capitalize() for word in property.split("-")) + "Machine"
    backend = Backend(property, factory, settings.pop("capabilities"), is_async=is_async)
    return make_machine(backend, name=name, **settings)


# --- one search --------------------------------------------------------------------------


@dataclass
class _Search:
    """What one focused search saw: its outcome, and the bookkeeping that decides whether the
    next example may start (the time budget, a transport that broke)."""

    deadline: float  # time.monotonic() after which no new example starts
    grace: float  # extra time to finish shrinking a failure already found
    limits: CallLimits = dataclasses.field(default_factory=CallLimits)  # the transport's calls
    on_example: Callable[[int], None] | None = None  # told the number of each example it starts
    on_found: Callable[[], None] | None = None  # told once, as the example that found ``first`` ends
    shrink_limit: float = math.inf  # seconds to shrink a failure, from the first example after it
    examples: int = 0
    wanted: int = 0  # the examples it was asked for
    cut_short: bool = False
    shrink_cut: bool = False  # the shrink limit was reached
    set_aside: int = 0  # examples rejected at a fact of a bug already found (SPEC.md C5)
    ended_at_echo: int = 0  # judged examples that met one only in their calls after close()
    echo: BaseException | None = None  # the first of those facts
    ended_echo: BaseException | None = None  # the first met only in the calls after close()
    aside_facts: dict[tuple, Fact] = dataclasses.field(default_factory=dict)  # one of each kind and cause
    found_at: float | None = None  # time.monotonic() when shrinking began
    first: BaseException | None = None  # the first divergence or crash seen, before shrinking
    error: BaseException | None = None
    reached: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # situations met
    told_found: bool = False
    clean: int = 0  # examples that ended without a failure before ``first`` was seen

    def found(self) -> None:
        """The example (or program) that found ``first`` has ended: tell ``on_found``, once.  What
        it found is what the report shows if the run is stopped while it is shrunk."""
        if self.first is not None and not self.told_found:
            self.told_found = True
            if self.on_found is not None:
                self.on_found()

    def next_example(self) -> None:
        """Count the example about to start, or raise :class:`_Stop`: the transport broke (it
        hung, or a branch process died: the first such fault is the search's failure, as found),
        or the time is up."""
        raise_if_stopped()
        if self.limits.broken is not None:
            self.first = self.first or self.limits.broken
            raise _Stop
        if self.first is None and self.set_aside >= max(1, self.wanted):
            raise _Stop  # as many examples set aside as it was asked for: enough (_beside_echo)
        now = time.monotonic()
        if now > self.deadline and (self.first is None or now > self.deadline + self.grace):
            self.cut_short = True
            raise _Stop
        if self.first is not None:
            self.found_at = now if self.found_at is None else self.found_at
            if now > self.found_at + self.shrink_limit:
                self.shrink_cut = True
                raise _Stop
        self.examples += 1
        if self.on_example is not None:
            self.on_example(self.examples)

    def outcome(self) -> BaseException | None:
        """What the search ended with: Hypothesis's (shrunk) failure, else the first one seen
        (its shrinking was stopped), else a fault the transport showed outside any judged call
        (a close that hung at teardown), else None."""
        return self.error or self.first or self.limits.broken


class _Discarded(Exception):
    """An example set aside (or rejected) at its teardown after it ran out of data: Hypothesis
    has frozen it and discards it anyway (a ``reject`` there would end the search with
    ``Frozen``)."""


def _reject() -> None:
    """Hypothesis's ``reject``, or :class:`_Discarded` where the example has already ended."""
    try:
        frozen = current_build_context().data.frozen
    except InvalidArgument:  # no Hypothesis test runs (a test of this module calls it alone)
        frozen = False
    if frozen:
        raise _Discarded
    reject()


class _EndedAtEcho(Exception):
    """An example met a fact of a bug already found only in its calls after close(), once every
    step and the drain were judged: it counts as judged, and its teardown ends there
    (:func:`_watched`)."""


class _Stop(KeyboardInterrupt):
    """Stops a search before its next example.  Hypothesis lets an interrupt through at once
    (anything else it would count as a failure, or as inconsistent data generation)."""


def _watched(machine: type, search: _Search, aside: Callable[[Fact], bool] = lambda fact: False, *,
             rejects: bool = True) -> type:
    """``machine`` counting its examples, remembering the first divergence, and stopping the
    search once its time budget is spent; after each example, the factory's ``discard``
    (if it has one) is told its namespace.  A divergence whose fact is ``aside`` (a fact of a bug
    already found, by the shared search or an earlier pass: :func:`_focused_passes`) sets its example
    aside (Hypothesis's ``reject``) and the search goes on: that bug is taken as known, and
    shrinking it would only find it again (SPEC.md C5); met in the teardown's last checks, the
    calls after close(), after every step and the drain were judged, it ends the example as
    judged instead (a bug of close meets every example there).  ``rejects``: a divergence another
    property owns than the first one's is rejected too; a replay outside Hypothesis
    (:func:`_without_steps`) leaves it to its caller."""

    discard = getattr(machine.backend.factory, "discard", None)

    class Watched(machine):
        def __init__(self) -> None:
            search.next_example()
            self._crash: BaseException | None = None  # the call's error this example kept as the first
            self._ending = False  # in the teardown's last checks, the calls after close()
            super().__init__()

        def _check_close(self):
            self._ending = True  # every step and the drain were judged
            super()._check_close()

        def teardown(self):
            try:
                super().teardown()
            except _Discarded:
                pass  # the StopTest it ran out of data with goes on up
            except _EndedAtEcho:
                search.ended_at_echo += 1
            finally:
                tally(search.reached, self.reached)
                search.clean += search.first is None
                if discard is not None:  # the example's storage is not needed again
                    discard(self.namespace)
                search.found()

        def _fail(self, *args, **kwargs):
            try:
                super()._fail(*args, **kwargs)
            except Divergence as divergence:
                if aside(divergence.fact):
                    search.aside_facts.setdefault((divergence.kind, divergence.fact.after), divergence.fact)
                    if search.first is self._crash:  # the call's error was filed as this fact
                        search.first = self._crash = None
                    if self._ending:
                        search.ended_echo = search.ended_echo or divergence
                        raise _EndedAtEcho from divergence
                    search.echo = search.echo or divergence
                    search.set_aside += 1
                    _reject()
                # a divergence the error was filed as (a stale release's error is stale-raised,
                # R10) stands for it
                if search.first is None or search.first is self._crash:
                    search.first = divergence
                first = search.first
                if rejects and isinstance(first, Divergence) and owner(first.kind) != owner(divergence.kind):
                    # Shrinking stays on the first bug's property: a smaller example that fails
                    # another property is not this failure (SPEC.md C5).
                    _reject()
                raise

        def _call(self, method, *args):
            try:
                return super()._call(method, *args)
            except Exception as exc:  # a crash: kept in case time runs out while shrinking
                if search.first is None:
                    search.first = self._crash = exc
                raise

    # Hypothesis prints steps as ``state = <class name>()``: keep the focus machine's name.
    Watched.__name__ = Watched.__qualname__ = machine.__name__
    return Watched


def _settings(profile: Profile, examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=profile.step_count,
        database=None,
        deadline=None,
        derandomize=False,  # the seed decides
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        # One bug per search, shrunk alone: Hypothesis otherwise goes on drawing for 10 s after
        # the first bug and shrinks every distinct one it met (each raising line counts as one),
        # which took 24 s where this takes 6.  The smallest failure may slip to another bug;
        # the focused searches that follow a shared failure find the rest (SPEC.md C5).
        report_multiple_bugs=False,
        verbosity=Verbosity.normal,  # the failing steps land in the exception's notes
    )


FRESH_STARTS = 10
"""How many fresh starts in a row a lockstep search may make that run no example, after
Hypothesis found its own draws inconsistent (:func:`_run_search`)."""


def _run_search(machine: type, profile: Profile, run_seed: int, search: _Search, examples: int | None = None,
                aside: Callable[[Fact], bool] = lambda fact: False) -> None:
    """Run the lockstep ``machine``: ``examples`` examples (the profile's by default).

    On the wall clock (R18) which rules a step may take can depend on timing: whether a claim
    got a lease decides whether an ack can follow.  Hypothesis remembers every example's draws,
    and when a step it has seen before offers other rules it stops the whole search with
    ``FlakyStrategyDefinition``.  That is the search's doing, not the transport's: before any
    failure, the search starts afresh for the examples left, each time with a seed of its own,
    so that a slow transport is not left unknown for it.  A start that ran examples may always
    be followed by another (each one brings the search nearer its end); :data:`FRESH_STARTS`
    starts in a row that ran none end it."""
    examples = profile.max_examples if examples is None else examples
    search.wanted, idle = examples, 0
    for start in itertools.count():
        before = search.examples
        chosen = seed(run_seed if start == 0 else f"{run_seed}/{start}")
        try:
            run_state_machine_as_test(chosen(_watched(machine, search, aside)),
                                      settings=_settings(profile, examples - before))
        except _Stop:
            pass  # search.cut_short or search.limits say why; search.first holds a failure found before
        except FlakyStrategyDefinition as exc:
            idle = 0 if search.examples > before else idle + 1
            if search.first is None and search.examples >= examples:
                return  # it found its draws inconsistent only after its last example began
            if idle < FRESH_STARTS and search.first is None:
                continue
            search.error = exc
        except Exception as exc:  # a divergence, the transport raising, or Hypothesis giving up
            search.error = _without_steps(machine, search, exc, aside) if isinstance(exc, Divergence) else exc
        return


def _without_steps(machine: type, search: _Search, failure: Divergence,
                   aside: Callable[[Fact], bool] = lambda fact: False) -> Divergence:
    """``failure`` as Hypothesis shrank it, less the steps it does not need (SPEC.md C7,
    :mod:`._reduce`): each replay is an example of the search, within its time.  A replay that
    meets a fact the search sets ``aside`` (a bug already found) does not count as failing."""
    steps = _steps(failure)
    if len(steps) < 3:
        return failure
    watched = _watched(machine, search, rejects=False)  # no Hypothesis test to reject in

    def replay(candidate: list[str]) -> BaseException | None:
        found = replayed(watched, candidate)
        return None if isinstance(found, Divergence) and aside(found.fact) else found

    return without_steps(failure, steps, replay, stopped=(_Stop,))


def _run_parallel(target: Target, caps: Capabilities, profile: Profile, run_seed: int, search: _Search,
                  *, judges: frozenset[str], processes: BranchProcesses | None, alternate: bool = False,
                  ignore: frozenset[str] = frozenset()) -> None:
    """The concurrent search: ``profile.programs`` programs, each run up to ``profile.repeats``
    times (fewer while a failure is shrunk), each run judged for what ``judges`` holds:
    ``refusals`` (contention), ``histories`` (linearizability), or both (facts of the kinds in
    ``ignore`` aside).  Branches run in ``processes`` (every other run with
    ``alternate``, see :func:`check_program`), else in threads or tasks."""

    def concurrent(program):
        search.next_example()
        repeats = profile.repeats if search.first is None else profile.shrink_repeats
        try:
            check_program(target.factory, program, caps, is_async=target.is_async, repeats=repeats,
                          contention="refusals" in judges, histories="histories" in judges,
                          processes=processes, alternate=alternate, ignore=ignore, reached=search.reached)
        except Exception as exc:
            if not isinstance(exc, ConcurrencyFailure):  # a crash: say which program
                exc.add_note(f"program:\n{program}")
            if search.first is None:
                search.first = exc
                search.found()
            raise

    test = given(programs(parking=caps.parking, groups=Choices.of(caps).groups[:2]))(concurrent)
    test = settings(_settings(profile, profile.programs))(test)
    try:
        seed(run_seed)(test)()
    except _Stop:
        pass
    except Exception as exc:
        search.error = exc
    if isinstance(search.error, ConcurrencyFailure) and search.error.program is not None:
        search.error = _reduced(search.error, concurrent)


def _reduced(failure: ConcurrencyFailure, run: Callable[[Program], None]) -> ConcurrencyFailure:
    """``failure`` with its program made as small as calls and branches can be taken away one
    at a time (:func:`~harel_ref.stateful.parallel.smaller_programs`) while ``run`` still fails
    it for the same property (SPEC.md C7), or until the search's time is up."""
    smallest = failure
    while True:
        for program in smaller_programs(smallest.program):
            try:
                run(program)
            except _Stop:
                return smallest
            except ConcurrencyFailure as found:
                if owners(frozenset({found.kind})) == owners(frozenset({failure.kind})):
                    smallest = found
                    break
            except Exception:  # a crash of a smaller program is another failure than this one
                continue
        else:
            return smallest


def _steps(exc: BaseException) -> list[str]:
    """The shrunk steps Hypothesis attached to ``exc``, from ``state = ...`` to teardown."""
    lines = [line for note in getattr(exc, "__notes__", ()) for line in str(note).splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return []
    steps = lines[starts[-1]:]
    if "state.teardown()" in steps:
        steps = steps[: steps.index("state.teardown()") + 1]
    return steps


# --- the whole certification -------------------------------------------------------------


@dataclass(frozen=True)
class Speed:
    """How fast the transport answered the preflight: seconds to open one on a fresh namespace,
    and seconds per call.  What the time estimate is made of."""

    open: float
    call: float


@dataclass(frozen=True)
class Plan:
    """What a certification is about to do, for a front-end's header: told to
    :meth:`Progress.planned` before the first search."""

    transport: str
    capabilities: Capabilities
    is_async: bool
    profile: Profile  # what runs
    fitted_from: Profile | None  # the profile asked for, when it was fitted to the transport
    seed: int
    properties: tuple[str, ...]  # the selected properties, in the order they are searched
    not_applicable: tuple[str, ...]  # those of them that will not be searched
    branches: str  # where the concurrent search runs its branches: see BRANCHES
    soak: float | None
    time_budget: float | None
    call_deadline: float | None
    estimate: float  # seconds: a rough estimate (estimate_seconds)
    jobs: int = 1  # searches that run at once, each in a process of its own when more than one
    jobs_note: str = ""  # why fewer searches run at once than were asked for
    shared: tuple[str, ...] = ()  # the properties a shared lockstep search covers first (SPEC.md C5)
    branches_note: str = ""  # why the branches do not run in processes too, when they could not


class Progress:
    """What :func:`certify` says as it goes, for a front-end to show (the CLI's console shows
    all of it).  Every method does nothing here: override the ones you need."""

    def planned(self, plan: Plan) -> None:
        """Before the first search: what will be certified, and about how long it will take."""

    def started(self, prop: str) -> None:
        """The searches of ``prop`` begin."""

    def searching(self, prop: str, search: str, done: int, total: int) -> None:
        """Within ``prop``: its ``search`` (``"lockstep"``, ``"concurrent"``
        or ``"soak"``) starts example (program) ``done`` of at most ``total``."""

    def finished(self, verdict: PropertyVerdict) -> None:
        """The verdict on a property: once per selected property, in order, once every search
        has ended (what any search finds may bear on any verdict, SPEC.md C12)."""


class _CallbackProgress(Progress):
    """``progress(property, verdict)``, the older form: called with None as a property's
    searches start and with its verdict when they end."""

    def __init__(self, callback: Callable[[str, PropertyVerdict | None], None]) -> None:
        self.callback = callback

    def started(self, prop: str) -> None:
        self.callback(prop, None)

    def finished(self, verdict: PropertyVerdict) -> None:
        self.callback(verdict.property, verdict)


def estimate_seconds(profile: Profile, caps: Capabilities, speed: Speed, *, lockstep: int, parallel: int,
                     branches: str = "threads", soak: float | None = None) -> float:
    """A rough estimate of a certification's time when nothing fails: ``lockstep`` lockstep
    searches and ``parallel`` parallel ones, at the ``speed`` the preflight measured.

    A lockstep search runs about a quarter more examples than ``max_examples`` (Hypothesis
    counts only the valid ones); each opens a transport, now and then a second, and makes
    about one call per step plus the prefill and the drain.  A run of a parallel program makes
    about a dozen calls, some at once; its transports are opened once per program (see
    stateful.parallel.Bench), or per run in each branch process.  The per-step and per-run
    overheads are the checker's own (Hypothesis, the model, threads), measured with the
    in-memory transport."""
    # On a wall clock lapses and leases pass by sleeping, about one scaled second a step.
    wall = Choices.of(caps).scale if caps.clock == "wall" else 0.0
    example = (1.5 * speed.open + (profile.step_count + 4) * speed.call
               + profile.step_count * (0.0007 + wall) + 0.003)
    in_processes = {"threads": 0.0, "both": 0.5, "processes": 1.0}[branches]  # the share of runs
    opens = (1 + 2.5 * caps.shared) / profile.repeats + in_processes  # branch processes: at once, every run
    run = opens * speed.open + 12 * speed.call + 0.0035 + 0.0045 * in_processes + 2 * wall
    return (lockstep * 1.25 * profile.max_examples * example
            + parallel * profile.programs * profile.repeats * run + (soak or 0.0))


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
    jobs: int | None = None,
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

    Whatever the transport does, the certification goes on (see the module docstring).  If it
    is stopped (KeyboardInterrupt, SystemExit) or the certifier itself fails, the exception is
    raised again carrying the report so far as its ``report`` attribute: the verdicts reached,
    the property being searched and those not reached ``unknown``.

    A transport of harel's own Protocol (``harel.engine.transport``) is certified as it is:
    declare ``Capabilities(protocol="harel")`` (or ``Capabilities.harel()``), or let the
    certifier see it (a ``claim`` without ``routing_keys``).  Its factory may be harel.testing's
    ``make(clock)``, which must open a fresh queue on every call (SPEC.md R20).
    """
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
    if level is not None and level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose from {list(LEVELS)}")
    if soak is not None and not SOAK_PROPERTIES & set(chosen):
        raise ValueError(f"a soak counts for {sorted(SOAK_PROPERTIES)}: select one of them, or drop the soak")
    if progress is not None and not isinstance(progress, Progress):
        if not callable(progress):
            raise TypeError(f"progress must be a harel_ref.certify.Progress or a callable, got {progress!r}")
        progress = _CallbackProgress(progress)

    def stuck(stop: KeyboardInterrupt, handed: dict[str, Any]) -> None:
        """The last resort of a run that did not stop (harel_ref.certify._signals): the report
        so far for the caller, and no process or scratch left behind."""
        handed["report"] = run.report(f"the certification was stopped by {describe(stop)}, and had not stopped by "
                                      f"itself {STUCK_AFTER:g} s later (a transport's call that let no signal through)")
        if pool is not None:
            pool.kill()
        if searchers is not None:
            searchers.terminate()
        shutil.rmtree(hypothesis_home, ignore_errors=True)

    with stop_on_signals(), last_resort(stuck), limit_memory(memory_limit) as end_memory_watch, \
            limit_calls(call_deadline) as limits:
        target = _target if _target is not None else Target.from_factory(factory, capabilities, is_async)
        target = detect_protocol(target)
        caps = target.capabilities
        applicable = [p for p in chosen if PROPERTIES[p].needs(caps) is None]
        tasks = _tasks(chosen, applicable, soak, shared_properties(caps))
        concurrent = any(PROPERTIES[p].concurrent for p in applicable)
        branches = "threads" if processes is False or not concurrent else "processes" if processes else "both"
        if branches == "both" and (not caps.shared or target.in_process):
            branches = "threads"  # instances do not share its storage, or only in one process
        jobs, jobs_note = _jobs_for(target, jobs, tasks, processes=branches != "threads")
        searchers = pool = None
        branches_note = ""
        searching = False
        hypothesis_home = tempfile.mkdtemp(prefix="harel-ref-hypothesis-")
        run = _Certification(target, profile, seed, chosen, tasks, time_budget, None, soak, limits,
                             progress or Progress(), name, level or default_level(caps), jobs, None, hypothesis_home,
                             branches, shrink_limit)
        try:
            if jobs > 1:  # spawned now, so that they import while the preflight runs
                searchers = SearchProcesses(target, jobs, _run_task, _clean_up_process)
            speed = preflight(target)
            if searchers is not None and (why := searchers.ready()) is not None:
                searchers.close()
                searchers, jobs, jobs_note = None, 1, f"searches run one at a time: {why}"
            if branches == "both" and target.recipe is None:
                branches, branches_note = "threads", "the factory cannot be imported by name (a module-level one can)"
            if branches != "threads":
                try:
                    pool = _branch_processes(target, call_deadline)
                except CertificationError as exc:
                    if branches == "processes":  # asked for: the user must hear why it cannot be
                        raise
                    branches, branches_note = "threads", str(exc).removeprefix("--processes: ")
            standby = sum(task.standby for task in tasks)  # if the shared search passes, they do not run
            lockstep = sum(PROPERTIES[p].search == "lockstep" for p in applicable)
            searches = dict(lockstep=lockstep - standby + (SHARED_FACTOR if standby else 0),
                            parallel=int(concurrent), branches=branches, soak=soak)
            asked = profile
            if time_budget is None:  # with a budget, the time is the caller's to share
                profile = profile.fitted(estimate_seconds(profile, caps, speed, **searches))
            estimate = estimate_seconds(profile, caps, speed, **searches)
            if jobs > 1:  # the searches spread over the processes (which take a moment to start)
                estimate = (estimate - (soak or 0.0)) / min(jobs, len(tasks) - standby) * 1.15 + 1.5 + (soak or 0.0)
            if time_budget is not None:
                estimate = min(estimate, time_budget + (soak or 0.0))
            progress = run.progress
            progress.planned(Plan(
                transport=name or target.name, capabilities=caps, is_async=target.is_async, profile=profile,
                fitted_from=asked if profile is not asked else None, seed=seed, properties=tuple(chosen),
                not_applicable=tuple(p for p in chosen if p not in applicable), branches=branches, soak=soak,
                time_budget=time_budget, call_deadline=call_deadline, estimate=estimate, jobs=jobs,
                jobs_note=jobs_note, shared=tuple(task.prop for task in tasks if task.standby),
                branches_note=branches_note,
            ))
            run = _Certification(target, profile, seed, chosen, tasks, time_budget, pool, soak, limits,
                                 progress, name, level or default_level(caps), jobs, searchers, hypothesis_home,
                                 branches, shrink_limit)
            searching = True
            report = run.all()
        except BaseException as stop:
            if searching or isinstance(stop, (KeyboardInterrupt, SystemExit)):  # else refused before searching
                _give_report(stop, run)
            raise
        finally:
            with signals_deferred():  # a signal now is raised once all is closed and removed
                end_memory_watch()  # a limit crossed until now is raised just below, with the report
                _close_all(pool, searchers, hypothesis_home)
        try:
            raise_if_stopped()  # one that came during the clean-up
        except KeyboardInterrupt as stop:
            _give_report(stop, run)
            raise
        return report


def _close_all(pool: BranchProcesses | None, searchers: SearchProcesses | None, hypothesis_home: str) -> None:
    """End a certification's branch and search processes, and remove its Hypothesis home.  A
    run stopped by a signal gives a branch 2 s, not 10, to finish: it stops within seconds."""
    if pool is not None:
        pool.close(grace=2.0 if stopping() else 10.0)
    if searchers is not None:
        searchers.close()
    shutil.rmtree(hypothesis_home, ignore_errors=True)


def _give_report(stop: BaseException, run: _Certification) -> None:
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


def default_jobs() -> int:
    """How many searches run at once unless told: ``HAREL_REF_JOBS`` if set (a test suite that
    runs many certifications side by side sets it to 1), else the cores this process may use."""
    text = os.environ.get("HAREL_REF_JOBS", "").strip()
    if text:
        if not (text.isdigit() and int(text) >= 1):
            raise ValueError(f"HAREL_REF_JOBS must be a whole number >= 1, got {text!r}")
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _jobs_for(target: Target, jobs: int | None, tasks: list[_Task], *, processes: bool) -> tuple[int, str]:
    """The number of search processes to use, and a note when it is fewer than asked."""
    asked = default_jobs() if jobs is None else jobs
    in_processes = [task for task in tasks if not _runs_at_home(task, processes)]
    if asked <= 1 or len(in_processes) <= 1:
        return 1, ""
    if target.recipe is None:
        return 1, (f"searches run one at a time: {target.name} cannot be imported by name, so other "
                   "processes cannot build it (a module-level factory can)")
    return min(asked, len(in_processes)), ""


def _runs_at_home(task: _Task, processes: bool) -> bool:
    """Whether ``task`` runs in the certifying process even with jobs: the soak (it keeps its
    own wall-clock time), and with ``processes`` the concurrent search (it owns the branch
    processes)."""
    return task.kind == "soak" or (processes and _search_of(task.kind) not in ("lockstep", SHARED))


def _search_of(kind: str) -> str:
    """What kind of search a task runs: ``lockstep`` (a property's own), ``shared`` (the
    shared lockstep search), ``concurrent`` or ``soak`` (shared parallel ones)."""
    return PROPERTIES[kind].search if kind in PROPERTIES else kind


@dataclass(frozen=True)
class _Task:
    """One search of a certification: the own search of the property ``kind``, or a shared
    one (``kind`` ``"shared"``, ``"concurrent"`` or ``"soak"``), whose time counts for
    ``prop``, the first property that needs it.  A ``standby`` search is a focused lockstep
    search that runs only if the shared lockstep search did not pass (SPEC.md C5).  The
    concurrent search ``judges`` ``refusals``, ``histories`` or both: what the chosen
    properties need (SPEC.md C6).  ``covers``: the properties whose rules it runs."""

    kind: str
    prop: str
    standby: bool = False
    judges: frozenset[str] = frozenset()
    covers: tuple[str, ...] = ()


def _tasks(chosen: list[str], applicable: list[str], soak: float | None, sharing: tuple[str, ...] = ()) -> list[_Task]:
    """The searches in the order a serial run makes them (and weighs them): each property's own
    search, and before the first property that needs a shared search, that one.

    ``sharing``: the properties the shared lockstep search covers (:func:`shared_properties`);
    it runs when they are two or more and all of them are chosen, and their own searches stand by."""
    tasks, shared = [], set()
    sharing = sharing if len(sharing) > 1 and set(sharing) <= set(chosen) else ()
    concurrent = tuple(p for p in PROPERTIES if p in applicable and PROPERTIES[p].concurrent)
    judges = frozenset(["refusals"] * any("refusals" in PROPERTIES[p].judges for p in concurrent)
                       + ["histories"] * any(PROPERTIES[p].search == "lockstep" for p in concurrent))
    for prop in chosen:
        if prop not in applicable:
            continue
        if sharing and prop == next(p for p in chosen if p in sharing):
            tasks.append(_Task(SHARED, prop, covers=tuple(p for p in PROPERTIES if p in sharing)))
        if PROPERTIES[prop].search == "lockstep":
            tasks.append(_Task(prop, prop, standby=prop in sharing, covers=(prop,)))
        wanted = ["concurrent"] + (["soak"] if soak else []) if prop in SOAK_PROPERTIES else []
        for kind in wanted:
            if kind in shared:
                continue
            shared.add(kind)
            tasks.append(_Task(kind, prop, judges=judges if kind == "concurrent" else frozenset(), covers=concurrent))
    return tasks


@dataclass
class _Found:
    """What one search found, as data (it comes back from a search process): how it ended
    (``passed``, ``failed``: it stopped at the failures it found, ``unknown``: it could not
    finish, ``covered``: the shared search made it needless) and why, its time and examples, and
    the failures it found.  Whom a failure counts against, and so every verdict, is
    :func:`harel_ref.certify._verdicts.verdicts`'s to say."""

    ended: str
    reason: str
    seconds: float
    examples: int
    failures: list[Failure] = dataclasses.field(default_factory=list)
    # of the failures, how many come before those it stopped at: the concurrent search's earlier
    # passes (shrunk before a stop), the soak's errors and history breaches (judged in full)
    earlier: int = 0
    reached: dict[str, int] = dataclasses.field(default_factory=dict)  # situations met (_properties)
    clean: int | None = None  # of a lockstep search that failed: its examples that ended before the failure
    undecided: tuple[str, ...] = ()  # of a shared search that passed: the properties left to their own searches


def _run_task(target: Target, context: dict[str, Any], task: _Task, started, event: Callable,
              pool: BranchProcesses | None = None) -> _Found:
    """Run the search ``task``: here, or in a search process (:mod:`harel_ref.certify._jobs`).

    ``context`` holds the profile, the seed, the time budget's end, how many searches share it
    (``budgeted``) and how many run at once (``jobs``); ``started`` counts the searches begun,
    across processes; ``event(name, *args)`` calls the :class:`Progress` method ``name``."""
    home = os.path.join(context["hypothesis_home"], str(os.getpid()))  # this process's, in the run's
    with limit_calls(context["call_deadline"]) as limits, _hypothesis_apart(home):
        if task.kind == "soak":
            event("searching", task.prop, "soak", 0, 1)
            return _soak(target, context["soak"], context["seed"])
        with started.get_lock():
            started.value += 1
            left = context["budgeted"] - started.value + 1
        began = time.monotonic()
        if began >= context["end"]:
            return _Found("unknown", "not reached: the time budget was spent", 0.0, 0)
        share = (context["end"] - began) * min(context["jobs"], left) / max(1, left)  # a fair share of what is left
        if task.kind != "concurrent":
            event("started", task.prop)
            if task.kind in PROPERTIES:
                return _focused_passes(target, context, task, share, limits, event, pool, began)
            return _shared_passes(target, context, task, share, limits, event, pool, began)
        if PROPERTIES[task.prop].search != "lockstep":  # no search of its own has started it (contention)
            event("started", task.prop)
        return _concurrent_passes(target, context, task, share, limits, event, pool, began)


FOCUSED_PASSES = 3
"""How many passes a property's own lockstep search makes at most (:func:`_focused_passes`)."""


def _focused_passes(target: Target, context: dict[str, Any], task: _Task, share: float, limits: CallLimits,
                    event: Callable, pool: BranchProcesses | None, began: float) -> _Found:
    """A property's own lockstep search, again while it stops only at other properties' bugs
    (:func:`~._verdicts.anothers`), with those taken as known: each such failure is shrunk and
    reported, and the next pass sets aside the examples that meet a fact of its bug, until a
    pass passes, finds a fact of the property's own, or :data:`FOCUSED_PASSES` passes were made.
    So the verdict is the property's own, not unknown for another's failure (SPEC.md C5)."""
    known: frozenset[str] = frozenset()
    earlier: list[Failure] = []
    reached: collections.Counter = collections.Counter()
    for number in range(1, FOCUSED_PASSES + 1):
        left = share - (time.monotonic() - began)  # the passes share the search's time
        found = _search_once(target, context, task, left, limits, event, pool, known, earlier)
        tally(reached, found.reached)
        if earlier and found.ended == "passed":
            found.reason += f" (searched again with {', '.join(sorted(owners(known)))} taken as broken)"
        foreign = found.ended == "failed" and all(
            anothers(failure.fact, task.kind) and not failure.echo for failure in found.failures)
        if not foreign or number == FOCUSED_PASSES or limits.broken is not None:
            found.seconds, found.earlier = time.monotonic() - began, len(earlier)
            found.failures, found.reached = earlier + found.failures, dict(reached)
            return found
        earlier += found.failures
        known |= frozenset(failure.kind for failure in found.failures)
        event("found", _Found("unknown", "", time.monotonic() - began, 0, list(earlier), earlier=len(earlier)))
    raise AssertionError("unreachable")


def _shared_passes(target: Target, context: dict[str, Any], task: _Task, share: float, limits: CallLimits,
                   event: Callable, pool: BranchProcesses | None, began: float) -> _Found:
    """The shared lockstep search, and, when it stopped at one property's bug (a fact that counts
    against it whatever else is found: :func:`~._verdicts.unexplained`), a second pass with that
    property taken as broken: it sets aside the examples that meet its facts
    (:func:`~._verdicts.shared_sets_aside`).  If the second pass passes, the search passes with
    the first one's failure: it stands for the properties it covers but those its set-aside
    facts could count against (``undecided``), whose own searches run.  If it finds anything,
    it stops there, unshrunk, and the search is the first pass's failure: every focused search
    runs, as it would have (SPEC.md C5).  In one machine a bug shows in more ways than the
    table's ``explains`` says (routing keys split at commas make a claim pass a group over),
    so what a second pass finds is no property's failure, only a sign to look closer.  The
    second pass costs about two thirds of the focused searches it can make needless ("unfenced
    ack" at standard: 35 s to the report instead of 47 s)."""
    first = _search_once(target, context, task, share, limits, event, pool)
    covers = task.covers
    if first.ended != "failed" or limits.broken is not None or not all(
            unexplained(failure.fact, covers) and not failure.flaky for failure in first.failures):
        return first  # a fault (owned by no property) among them, or a fact another's bug explains
    broken = frozenset(owner(failure.kind) for failure in first.failures)
    if len(broken) != 1:
        return first
    event("found", _Found("unknown", "", time.monotonic() - began, 0, list(first.failures),
                          earlier=len(first.failures)))  # what a stop during the second pass reports
    left = share - (time.monotonic() - began)  # the passes share the search's time
    second = _search_once(target, context, task, left, limits, event, pool, earlier=first.failures,
                          broken=broken, clean=first.clean)
    seconds = time.monotonic() - began
    if second.ended != "passed":
        return dataclasses.replace(first, seconds=seconds)
    reached = collections.Counter(first.reached)
    tally(reached, second.reached)
    return dataclasses.replace(
        second, seconds=seconds, failures=first.failures, earlier=len(first.failures), reached=dict(reached),
        clean=first.clean, reason=f"{second.reason} (searched again with {', '.join(broken)} taken as broken, after "
                                  f"{first.clean} examples before its failure)")


CONCURRENT_PASSES = 4
"""How many passes the concurrent search makes at most, each with what the passes before it
found taken as known (:func:`_concurrent_passes`)."""


def _concurrent_passes(target: Target, context: dict[str, Any], task: _Task, share: float, limits: CallLimits,
                       event: Callable, pool: BranchProcesses | None, began: float) -> _Found:
    """The concurrent search, again with what it found taken as known (every kind of fact of
    the properties it showed broken ignored: a rule of the model left out, or errors no longer
    judged), until a pass finds nothing new, every property it covers is known broken,
    :data:`CONCURRENT_PASSES` passes were made, or the transport broke.  Each property it judges
    then gets a verdict of its own, not the first failure's (SPEC.md C6)."""
    ignore: frozenset[str] = frozenset()
    earlier: list[Failure] = []
    reached: collections.Counter = collections.Counter()
    for number in range(1, CONCURRENT_PASSES + 1):
        found = _search_once(target, context, task, share, limits, event, pool, ignore, earlier)
        seen = frozenset(failure.kind for failure in found.failures)
        if ignore and found.ended == "passed":
            found.reason += f" (searched again with {', '.join(sorted(owners(ignore)))} taken as broken)"
        tally(reached, found.reached)
        broken = owners(ignore | seen)
        judged_all = set(task.covers) <= broken or (
            "histories" not in task.judges and facts.RAISED_UNDER_CONTENTION in ignore | seen)
        last = number == CONCURRENT_PASSES or limits.broken is not None or seen & facts.FAULTS or judged_all
        if found.ended != "failed" or last:
            found.seconds, found.earlier = time.monotonic() - began, len(earlier)
            found.failures = earlier + found.failures
            found.reached = dict(reached)
            return found
        earlier += found.failures
        ignore |= frozenset().union(*(PROPERTIES[prop].owns for prop in owners(seen)))
        # What a stop before the next pass finds anything reports: these, shrunk.
        event("found", _Found("unknown", "", time.monotonic() - began, 0, list(earlier), earlier=len(earlier)))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _hypothesis_apart(home: str) -> Iterator[None]:
    """Hypothesis as a search needs it, whatever process it runs in, and leaving nothing behind.

    - Local constants: Hypothesis now and then draws a literal found in the source of the
      "local" modules loaded so far.  Which modules those are depends on the process (a search
      process, a pytest session and the command load different ones), so the same seed would
      find different examples.  While a search runs, there are none.
    - Storage: Hypothesis caches those constants and its Unicode tables under ``.hypothesis``
      in the current directory.  While a search runs, its home is ``home``, inside a scratch
      directory that the certification removes when it ends (whatever became of the process
      that searched).

    Both reach into Hypothesis beyond its documented API (``set_hypothesis_home_dir`` is
    documented; ``providers._get_local_constants`` is not): tests/test_hypothesis_internals.py
    checks what this relies on."""
    from hypothesis import configuration
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    before = configuration.storage_directory(intent_to_write=False).home_directory
    found = providers._get_local_constants
    configuration.set_hypothesis_home_dir(home)
    providers._get_local_constants = Constants  # called with no arguments: none
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = found
        providers.CONSTANTS_CACHE.cache.clear()
        configuration.set_hypothesis_home_dir(before)


def _search_once(target: Target, context: dict[str, Any], task: _Task, share: float, limits: CallLimits,
                 event: Callable, pool: BranchProcesses | None, ignore: frozenset[str] = frozenset(),
                 earlier: Sequence[Failure] = (), broken: frozenset[str] = frozenset(),
                 clean: int | None = None) -> _Found:
    """One run of a lockstep or parallel search, with ``share`` seconds to search (and as
    many again to shrink a failure found in time).  ``ignore``: the kinds of fact earlier passes
    found, which the concurrent search no longer judges and a focused search sets aside with the
    shared search's (:func:`_focused_passes`); ``earlier``: the failures those passes found
    (told with this one's, as found, see :meth:`_Certification.report`).  ``broken``: the
    property the second pass of the shared search takes as broken, after ``clean`` examples of
    its first pass (:func:`_shared_passes`)."""
    began, kind, profile, caps = time.monotonic(), task.kind, context["profile"], target.capabilities
    lockstep = kind == SHARED or (kind in PROPERTIES and PROPERTIES[kind].search == "lockstep")
    shown = "lockstep" if kind in PROPERTIES and lockstep else kind
    total = profile.shared_examples if kind == SHARED else profile.max_examples if lockstep else profile.programs
    after_shared = (context.get("shared_clean") or 0) if task.standby else 0
    total = standby_examples(profile, after_shared) if after_shared else total
    if broken:  # the first pass's clean examples count, as a passed pass's would
        total = max(math.ceil(total / 4), total - (clean or 0))
    shrink_limit = 0.0 if broken else context["shrink_limit"]  # a second shared pass never shrinks
    search = _Search(deadline=began + share, grace=share, limits=limits, shrink_limit=shrink_limit,
                     on_example=lambda done: event("searching", task.prop, shown, done, total))

    def found() -> None:  # the failure as found, for a report made while it is shrunk (a stopped run)
        _, _, failures = _ended(kind, search, target, profile, context["seed"], context["branches"])
        event("found", _Found("failed", "", time.monotonic() - began, search.examples, [*earlier, *failures],
                              earlier=len(earlier)))

    search.on_found = None if broken else found  # what a second shared pass finds is never reported
    if lockstep:
        machine = focus_machine(target.factory, kind, caps, is_async=target.is_async)
        if kind == SHARED:
            aside = functools.partial(shared_sets_aside, broken=broken, covers=task.covers)
        else:
            known = explained(context.get("shared_kinds", frozenset()) | ignore, kind)
            aside = functools.partial(sets_aside, known=known, prop=kind)
        _run_search(machine, profile, context["seed"], search, total, aside)
    else:
        _run_parallel(target, caps, profile, context["seed"], search, judges=task.judges,
                      processes=pool, alternate=context["branches"] == "both", ignore=ignore)
    ended, reason, failures = _ended(kind, search, target, profile, context["seed"], context["branches"])
    if not lockstep and ended == "passed":
        judged = ["no call refused"] * ("refusals" in task.judges and facts.RAISED_UNDER_CONTENTION not in ignore) + [
            "every history linearizable"] * ("histories" in task.judges)
        reason = f"{search.examples} programs × {profile.repeats} runs, {', '.join(judged)}"
        if unjudged := search.reached.get(UNJUDGED):
            reason += (f"; {unjudged} runs left unjudged (their raised calls allowed more orders than the "
                       "checker tries, SPEC.md C9)")
    elif not lockstep:
        reason = reason.replace("examples", "programs", 1)
    if after_shared and total < profile.max_examples and ended == "passed":
        reason += f", beside the shared search's {after_shared} before its failure (SPEC.md C5)"
    # only a shared search stands for properties other than its own search's
    shared_passed = kind == SHARED and ended == "passed"
    undecided = left_undecided(list(search.aside_facts.values()), broken, task.covers) if shared_passed else ()
    return _Found(ended, reason, time.monotonic() - began, search.examples, failures, reached=dict(search.reached),
                  clean=search.clean if search.first is not None else None, undecided=undecided)


def standby_examples(profile: Profile, shared_before: int) -> int:
    """The examples of a focused search that runs because the shared search failed after
    ``shared_before`` examples without one (SPEC.md C5): those count for a focused search's as
    a passed shared search's do, one for every :data:`SHARED_FACTOR`; at least a quarter of the
    profile's remain its own."""
    return max(math.ceil(profile.max_examples / 4), profile.max_examples - shared_before // SHARED_FACTOR)


def _clean_up_process(target: Target) -> None:
    """What a search process does as it ends: remove what its transports made on the user's
    servers (files are the certifier's to remove)."""
    if target.recipe is not None and target.recipe.bundled:
        from harel_ref.stateful.backends import clean_up

        clean_up()


class _Certification:
    """One certification under way: its searches, run one at a time or in search processes,
    and what they found, weighed in the order of the searches (so the report does not depend
    on which finished first)."""

    def __init__(self, target: Target, profile: Profile, run_seed: int, chosen: list[str], tasks: list[_Task],
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
        )
        self.shared = next((n for n, task in enumerate(tasks) if task.kind == SHARED), None)
        self.standby = [n for n, task in enumerate(tasks) if task.standby]
        self.covered = {tasks[n].prop for n in self.standby}  # the properties the shared search covers
        self.found: dict[int, _Found] = {}  # task number -> what that search found
        self.running: set[int] = set()
        self.unshrunk: dict[int, _Found] = {}  # task number -> the failure it found, before shrinking
        self.told = 0  # verdicts told to progress, in order

    def all(self) -> Report:
        """Run every search and tell each verdict once it is settled; the report.  (If the run
        is stopped or fails, :func:`certify` gives the exception the report so far.)"""
        if self.searchers is None:
            self.run_here(range(len(self.tasks)), multiprocessing.Value("i", 0))
        else:
            self.run_in_processes()
        raise_if_stopped()  # a signal whose exception Python swallowed (see _signals)
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
            self.found[number] = _run_task(self.target, self.context, self.tasks[number], started, event, self.pool)
            self.running.discard(number)
            if number == self.shared:
                self.shared_ended()
            self.tell()

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
                detail = _Found("unknown", f"{detail}: a search process died while searching", 0.0, 0)
            self.found[number] = detail
            self.running.discard(number)
            if number == self.shared:
                for standby in self.shared_ended():
                    searchers.submit(standby, self.tasks[standby], self.context)
                    self.running.add(standby)
            self.tell()

    def shared_passed(self) -> bool:
        """Whether the shared lockstep search ran and passed: then it stands for the focused
        searches of the properties it covers, which do not run (SPEC.md C5)."""
        return self.shared in self.found and self.found[self.shared].ended == "passed"

    def shared_ended(self) -> list[int]:
        """Once the shared search has ended: the standby searches to run now (all of them,
        unless it passed; then those of the properties it left undecided, and those it made
        needless are recorded as found)."""
        wanted = list(self.standby)
        if self.shared_passed():
            undecided = self.found[self.shared].undecided
            wanted = [number for number in self.standby if self.tasks[number].prop in undecided]
            for number in set(self.standby) - set(wanted):
                self.found[number] = _Found("covered", "the shared search passed", 0.0, 0)
        self.context["budgeted"] += len(wanted)  # their share of a time budget
        if self.shared in self.found and wanted:  # the bugs it found, for them to set aside (_watched)
            covers = self.tasks[self.shared].covers  # a fact it blamed on another (after a reopen) is no bug of its kind's
            self.context["shared_kinds"] = frozenset(
                f.kind for f in self.found[self.shared].failures
                if blame(f.fact, Searched(SHARED, covers, "failed")) in owners(frozenset([f.kind])))
            self.context["shared_clean"] = self.found[self.shared].clean  # its clean examples count for theirs
        return wanted

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
                found = _Found("unknown", f"{how}: {why}" if why else how, 0.0, 0)
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
                found = self.unshrunk[number]  # those before found.earlier were shrunk (_run_task)
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


def _soak(target: Target, seconds: float, run_seed: int) -> _Found:
    """Run the soak, and what it found: a failure per kind of fact seen (errors and the
    history's breaches, each judged in full, and the model's verdict, which stops at its first
    misfit; SPEC.md R19).  It ended "passed" when the model's verdict did: what it covers and
    found nothing against holds."""
    began = time.monotonic()
    replay = target.command("quick", run_seed, only=running("soak"), soak=seconds)
    try:
        result = run_soak(target.factory, target.capabilities, seconds, is_async=target.is_async, seed=run_seed,
                          checkpoint=raise_if_stopped)
        calls, lin = len(result.records), result.linearizability
    except Exception as exc:
        fact = _fault(exc, "the soak")
        failure = Failure(fact, found_by="soak", steps=(), reproduction="", replay=replay)
        return _Found("failed", "the soak crashed", time.monotonic() - began, 0, [failure])
    failures = [_failure("soak", divergence, False, target, PROFILES["quick"], run_seed, "threads", soak=seconds)
                for divergence in result.failures()]
    spent = time.monotonic() - began
    if lin.ok is None:
        return _Found("unknown", f"the soak's model check gave up: {lin}", spent, calls, failures)
    if lin.ok is False:  # it stopped at the model's misfit; errors and breaches were judged in full
        judged = [failure for failure in failures if failure.fact != lin.fact]
        misfit = [failure for failure in failures if failure.fact == lin.fact]
        return _Found("failed", "", spent, calls, judged + misfit, earlier=len(judged))
    clean = "" if failures else ", no history violation, none raised"
    return _Found("passed", f"{calls} calls in {result.seconds:.0f} s, linearizable{clean}", spent, calls, failures)


def preflight(target: Target) -> Speed:
    """Open and close one transport, so a factory that cannot work fails with a clear error
    instead of thirteen failed searches; then time opening three more, each on a fresh namespace
    as an example does, and a dozen calls (publish, claim, ack), for the estimate of how long
    the searches take (the first opening pays for what happens once: imports, connections)."""
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
            began = time.perf_counter()
            for _ in range(3):  # each on a namespace of its own, as every example's is
                opened.append(open_transport(target.factory, clock, f"harel_ref_preflight_{uuid.uuid4().hex[:8]}",
                                             loop, target.capabilities.protocol))
            speed = Speed(open=(time.perf_counter() - began) / 3, call=0.0)
            began = time.perf_counter()
            for _ in range(4):
                opened[0].publish("harel-ref-preflight", "timing")
                lease = opened[0].claim("harel-ref-preflight", 60.0)
                if lease is not None:
                    opened[0].ack(lease)
            return dataclasses.replace(speed, call=(time.perf_counter() - began) / 12)
        except Exception:
            return speed  # the searches will say what is wrong
    finally:
        close_all(opened, loop)


def _ended(search_name: str, search: _Search, target: Target, profile: Profile, run_seed: int,
           branches: str = "threads") -> tuple[str, str, list[Failure]]:
    """How the search ``search_name`` (a property's own, ``"shared"`` or ``"concurrent"``)
    ended, why, and the failure it found (one: SPEC.md C7; a flaky one comes in a group)."""
    exc = search.outcome()  # unshrunk when time ran out, or the transport broke, while shrinking
    if (search.echo or search.ended_echo) is not None and search.first is None and search.limits.broken is None \
            and (exc is None or isinstance(exc, HypothesisException)):
        return _beside_echo(search_name, search, target, profile, run_seed, branches)
    if exc is None:
        if search.cut_short:
            return "unknown", f"cut short by the time budget after {search.examples} examples", []
        return "passed", f"{search.examples} examples, none diverged", []
    flaky = isinstance(exc, FlakyFailure)
    found = _leaves(exc)
    if all(isinstance(e, HypothesisException) for e in found):
        if search.first is None:
            return "unknown", f"Hypothesis stopped: {type(exc).__name__}: {str(exc).splitlines()[0]}", []
        found = [search.first]  # shrinking was cut short by the time budget: no steps to show
    failures = [_failure(search_name, error, flaky, target, profile, run_seed, branches)
                for error in found if not isinstance(error, HypothesisException)]
    if search.shrink_cut:
        failures = [dataclasses.replace(failure, unshrunk=f"the shrink limit ({search.shrink_limit:g} s)")
                    for failure in failures]
    return "failed", "", failures


def _beside_echo(search_name: str, search: _Search, target: Target, profile: Profile, run_seed: int,
                 branches: str) -> tuple[str, str, list[Failure]]:
    """How a search ended that found nothing new but met a bug found before (SPEC.md C5):
    passed, if it ran to its end (its examples judged, or as many set aside) and judged at
    least a quarter of the examples it was asked for; else stopped at that bug, unshrunk: its
    echo.  An example that met it only in its calls after close() counts as judged."""
    judged = search.examples - search.set_aside
    if search.cut_short and judged >= search.wanted / 4:
        aside = f", {search.set_aside} of them set aside at {search.echo.kind}" if search.echo else ""
        return "unknown", f"cut short by the time budget after {search.examples} examples{aside}", []
    if search.cut_short or search.error is not None or judged < search.wanted / 4:
        echo = _failure(search_name, search.echo or search.ended_echo, False, target, profile, run_seed, branches)
        return "failed", f"met it in {search.set_aside} of its {search.examples} examples", \
            [dataclasses.replace(echo, unshrunk=ECHO)]
    reason = f"{judged} examples, none diverged"
    if search.set_aside:
        reason += (f"; {search.set_aside} more set aside: they met {search.echo.kind}, a fact of "
                   f"{owner(search.echo.kind)}'s, found before")
    if search.ended_at_echo:
        reason += f"; in {search.ended_at_echo} of them the calls after close() met a bug found before"
    return "passed", reason, []


def _failure(search_name: str, error: BaseException, flaky: bool, target: Target, profile: Profile, run_seed: int,
             branches: str, soak: float | None = None) -> Failure:
    """The report's account of a failure that the search ``search_name`` (a property's own,
    ``"shared"``, ``"concurrent"`` or ``"soak"``) found: its fact, and how to see it again."""
    lockstep = search_name == SHARED or (search_name in PROPERTIES and PROPERTIES[search_name].search == "lockstep")
    only = None if search_name == SHARED else running(search_name, getattr(error, "kind", None))
    replay = target.command(profile.name, run_seed, only=only, branches=branches, soak=soak)
    if isinstance(error, ConcurrencyFailure):
        program = error.program
        return Failure(
            error.fact, found_by=search_name,
            steps=tuple(str(program).splitlines()) if program is not None else (),
            reproduction="" if program is None else target.parallel_reproduction(  # judged as it was found
                search_name, program, contention=error.kind in RAISES, histories=error.kind not in RAISES,
                repeats=profile.repeats, branches=branches),
            replay=replay, flaky=flaky, timeline=error.timeline, timeline_svg=error.svg,
            history=tuple(_jsonable(record) for record in error.shown),
        )
    if not lockstep:  # the transport raised in a parallel search, outside any judged call
        steps = _program_note(error)
        fact = _fault(error, "running a program" if steps else "a parallel search")
        return Failure(fact, found_by=search_name, steps=tuple(steps), reproduction="", replay=replay, flaky=flaky)
    steps = _steps(error)
    reproduction = target.reproduction(search_name, steps)
    if isinstance(error, Divergence):
        return Failure(error.fact, found_by=search_name, steps=tuple(steps), reproduction=reproduction,
                       replay=replay, flaky=flaky)
    # The transport (or its factory) raised something the spec never asks for, or panicked,
    # crashed or hung: the rule it raised in says whose it is (fault_owner).
    fact = _fault(error, _raising_step(error), rule=_raising_rule(error))
    return Failure(fact, found_by=search_name, steps=tuple(steps), reproduction=reproduction, replay=replay,
                   flaky=flaky)


def _fault(error: BaseException, where: str, rule: str | None = None) -> Fact:
    """The fact of an exception out of the transport, met ``where``: ``raised`` and
    ``ValueError: ...`` for an ordinary one; ``panicked``, ``crashed`` or ``hung`` and the
    fault's own message (which says so) for a fault."""
    kind, answered = _exception_outcome(error)
    return Fact(kind, f"{where}{' raised' if kind == facts.RAISED else ''}", "an answer or error the spec allows",
                answered, rule=rule)


def _exception_outcome(error: BaseException) -> tuple[str, str]:
    """The kind of fact an exception out of the transport is, and the answer it shows."""
    for fault, kind in ((TransportPanic, facts.PANICKED), (TransportCrashed, facts.CRASHED),
                        (TransportHung, facts.HUNG)):
        if isinstance(error, fault):
            return kind, str(error)
    return facts.RAISED, f"{type(error).__name__}: {error}"


def _program_note(error: BaseException) -> list[str]:
    """The program a parallel search noted on an exception it did not expect."""
    for note in getattr(error, "__notes__", ()):
        if note.startswith("program:\n"):
            return note.removeprefix("program:\n").splitlines()
    return []


def _jsonable(record) -> dict:
    from harel_ref.stateful.history import _jsonable as jsonable

    return {field.name: jsonable(getattr(record, field.name)) for field in dataclasses.fields(record)}


def _raising_step(error: BaseException) -> str:
    """The machine rule (or teardown) during which ``error`` was raised, as the report shows it."""
    name = _raising_rule(error)
    if name is None:
        return "a step"
    return "opening the transport" if name == "__init__" else f"state.{name}(...)"


def _raising_rule(error: BaseException) -> str | None:
    """The name of the machine rule (or ``teardown``, ``__init__``) that raised ``error``."""
    names = set(RULES) | set(FOCUS_RULES) | {"teardown", "__init__"}
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_name in names and "self" in frame.f_locals:
            return frame.f_code.co_name
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
