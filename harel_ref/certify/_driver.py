"""The Hypothesis driver: one search, run and watched.

:class:`Search` is what a search saw; :func:`watched_machine` wraps a lockstep machine so that it
counts its examples, keeps the first divergence, sets aside the examples that meet a bug
already found (SPEC.md C5) and stops the search when its time is up; :func:`run_search` runs a
lockstep search (starting afresh where Hypothesis finds its own draws inconsistent), and
:func:`run_parallel` the concurrent one (SPEC.md C6).  A failure found comes out shrunk, less
the steps it does not need (SPEC.md C7)."""

from __future__ import annotations

import codeop
import collections
import contextlib
import dataclasses
import itertools
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import FlakyFailure, FlakyStrategyDefinition, InvalidArgument, Unsatisfiable
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from harel_ref.stateful import Capabilities, Divergence
from harel_ref.stateful._async import CallLimits, TransportHung, in_line_calls
from harel_ref.stateful._facts import Fact, raised_error
from harel_ref.stateful._machine import Choices, StorageFailed
from harel_ref.stateful._properties import SIZES, owner, owners, tally
from harel_ref.stateful._processes import BranchProcesses
from harel_ref.stateful.parallel import (
    ConcurrencyFailure, Program, check_program, failing_runs, programs, smaller_programs,
)

from ._choices import run_choices
from ._faults import step_fault_fact
from ._probes import probe_programs
from ._profiles import Profile
from ._reduce import replayed, without_steps
from ._signals import raise_if_stopped
from ._target import Target

__all__ = ["FRESH_STARTS", "unseen_failure"]

# How often a race found shows, measured afresh once it is shrunk, so that its regression test
# makes runs enough (SPEC.md C14): up to RATE_RUNS times the profile's repeats, until RATE_ENOUGH
# runs showed it, or RATE_SECONDS have passed (at least ten runs).
RATE_RUNS, RATE_ENOUGH, RATE_SECONDS = 10, 5, 10.0


@dataclass
class Unjudged:
    """An example set aside where the storage failed (SPEC.md C15): its choices, the failure, and
    whether an example judged after it showed the storage working again (only then is it
    replayed: in an outage that lasts to the search's end, a replay would fail alike)."""

    choices: tuple
    failed: StorageFailed
    followed: bool = False


@dataclass
class Search:
    """What one focused search saw: its outcome, and the bookkeeping that decides whether the
    next example may start (the time budget, a transport that broke)."""

    deadline: float  # time.monotonic() after which no new example starts
    grace: float  # extra time to finish shrinking a failure already found
    limits: CallLimits = dataclasses.field(default_factory=CallLimits)  # the transport's calls
    on_example: Callable[[int], None] | None = None  # told the number of each example it starts
    on_found: Callable[[Search], None] | None = None  # told once, as the example that found ``first`` ends
    shrink_limit: float = math.inf  # seconds to shrink a failure, from the first example after it
    examples: int = 0
    wanted: int = 0  # the examples it was asked for
    cut_short: bool = False
    shrink_cut: bool = False  # the shrink limit was reached
    set_aside: int = 0  # examples rejected at a fact of another property's bug (SPEC.md C5)
    unjudged: int = 0  # examples ended where the storage failed (R17), set aside unjudged (SPEC.md C15)
    storage_failed: StorageFailed | None = None  # the first of those
    unjudged_examples: list[Unjudged] = dataclasses.field(default_factory=list)  # replayed at the end (C15)
    judged_choices: tuple = ()  # the choices of the last example judged whole: a control for those replays
    ended_at_echo: int = 0  # judged examples that met one only in their calls after close()
    echo: BaseException | None = None  # the first of those facts
    ended_echo: BaseException | None = None  # the first met only in the calls after close()
    # the first of each owner's, and of each error (raised_error) found before: by another search
    # or an earlier pass of its own
    echoes: dict[str, BaseException] = dataclasses.field(default_factory=dict)
    aside_facts: dict[tuple, Fact] = dataclasses.field(default_factory=dict)  # one of each kind and cause
    found_at: float | None = None  # time.monotonic() when shrinking began
    first: BaseException | None = None  # the first divergence or crash seen, before shrinking
    error: BaseException | None = None
    reached: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # situations met
    told_found: bool = False
    clean: int = 0  # examples that ended without a failure before ``first`` was seen
    data: Any = None  # the running example's ConjectureData: a hung one's choices replay it (_regression)
    first_choices: tuple = ()  # the choices of the example that found ``first`` (:mod:`._choices`)
    probes_unrun: int = 0  # probes the time left no room for (SPEC.md C13a)
    halted: Callable[[], bool] | None = None  # a lane's: true once a lane before it failed (_search_lanes)
    lanes: int = 1  # the lanes its examples ran in (_search_lanes)

    def found(self) -> None:
        """The example (or program) that found ``first`` has ended: tell ``on_found``, once.  What
        it found is what the report shows if the run is stopped while it is shrunk."""
        if self.first is not None and not self.told_found:
            self.told_found = True
            self.first_choices = tuple(self.data.choices) if self.data is not None else ()
            if self.on_found is not None:
                self.on_found(self)  # this one: on a search thread, a copy of the search run_search was given

    def next_example(self) -> None:
        """Count the example about to start, or raise :class:`StopSearch`: the transport broke (it
        hung, or a branch process died: the first such fault is the search's failure, as found),
        or the time is up."""
        raise_if_stopped()
        if self.halted is not None and self.halted():
            self.cut_short = True  # a lane whose examples no longer count (_search_lanes)
            raise StopSearch
        if self.limits.broken is not None:
            if self.first is None and self.data is not None:  # a hang outside a step (a close at teardown):
                self.first_choices = tuple(self.data.choices)  # ``data`` is still the hung example's
            self.first = self.first or self.limits.broken
            raise StopSearch
        if self.first is None and self.set_aside >= max(1, self.wanted):
            raise StopSearch  # as many examples set aside as it was asked for: enough (_beside_echo)
        if self.first is None and self.unjudged >= max(1, self.wanted):
            raise StopSearch  # as many ended where the storage failed: too many to judge (C15)
        now = time.monotonic()
        if now > self.deadline and (self.first is None or now > self.deadline + self.grace):
            self.cut_short = True
            raise StopSearch
        if self.first is not None:
            self.found_at = now if self.found_at is None else self.found_at
            if now > self.found_at + self.shrink_limit:
                self.shrink_cut = True
                raise StopSearch
        self.examples += 1
        if self.on_example is not None:
            self.on_example(self.examples)

    def hung_choices(self) -> tuple:
        """The choices Hypothesis drew for the example whose call hung, up to that call (its
        steps were never printed: :func:`run_search`), or () if no call hung in an example."""
        return self.first_choices if isinstance(self.first, TransportHung) else ()

    def outcome(self) -> BaseException | None:
        """What the search ended with: Hypothesis's (shrunk) failure, else the first one seen
        (its shrinking was stopped), else a fault the transport showed outside any judged call
        (a close that hung at teardown), else None."""
        return self.error or self.first or self.limits.broken


class _Discarded(Exception):
    """An example set aside (or rejected) at its teardown after it ran out of data: Hypothesis
    has frozen it and discards it anyway (a ``reject`` there would end the search with
    ``Frozen``); or one set aside outside Hypothesis, a probe."""


def _reject() -> None:
    """Hypothesis's ``reject``, or :class:`_Discarded` where the example has already ended or
    runs outside Hypothesis (a probe, :func:`_run_probes`)."""
    try:
        frozen = current_build_context().data.frozen
    except InvalidArgument:  # no Hypothesis test runs
        raise _Discarded from None
    if frozen:
        raise _Discarded
    reject()


class _EndedAtEcho(Exception):
    """An example met a fact of a bug already found only in its calls after close(), once every
    step and the drain were judged: it counts as judged, and its teardown ends there
    (:func:`watched_machine`)."""


class StopSearch(KeyboardInterrupt):
    """Stops a search before its next example.  Hypothesis lets an interrupt through at once
    (anything else it would count as a failure, or as inconsistent data generation)."""


def watched_machine(machine: type, search: Search, aside: Callable[[Fact], bool] = lambda fact: False, *,
                    rejects: bool = True, probe: str = "") -> type:
    """``machine`` counting its examples, remembering the first divergence, and stopping the
    search once its time budget is spent; after each example, the factory's ``discard``
    (if it has one) is told its namespace.  A divergence whose fact is ``aside`` (another
    property's, in a focused search after the shared search; one of a bug an earlier pass
    found: :func:`_focused_passes`) sets its example aside (Hypothesis's ``reject``) and the
    search goes on: that bug is judged elsewhere, and shrinking it here would only find it
    again (SPEC.md C5); met in the teardown's last checks, the
    calls after close(), after every step and the drain were judged, it ends the example as
    judged instead (a bug of close meets every example there).  ``rejects``: a divergence another
    property owns than the first one's is rejected too; a replay outside Hypothesis
    (:func:`_without_steps`) leaves it to its caller.  ``probe``: the steps of a probe it
    replays (:func:`_run_probes`): its divergence carries them, as Hypothesis's carry theirs,
    and it counts sizes only in the evidence."""
    discard = getattr(machine.backend.factory, "discard", None)

    class Watched(_Watching, machine):
        _search, _rejects, _probe = search, rejects, probe
        _aside, _discard = staticmethod(aside), staticmethod(discard) if discard is not None else None

    # Hypothesis prints steps as ``state = <class name>()``: keep the focus machine's name.
    Watched.__name__ = Watched.__qualname__ = machine.__name__
    # At each search Hypothesis digests the machine's source: inspect.getsource parses the whole
    # module the class says it is from, 7-30 ms, only to find no such class there (it is made
    # here) and fall back to the class's name.  A module with no file gets it there at once, the
    # same digest (1.8 % of the test suite's py-spy samples went to that parse).
    Watched.__module__ = f"{__name__}.<a search>"
    return Watched


class _Watching:
    """What :func:`watched_machine` adds to a lockstep machine, for its ``_search``."""

    _search: Search
    _aside: Callable[[Fact], bool]
    _rejects: bool
    _probe: str
    _discard: Callable[[str], None] | None

    def __init__(self) -> None:
        self._search.next_example()
        try:
            self._search.data = current_build_context().data
        except InvalidArgument:  # no Hypothesis test runs: a probe, a replay of steps
            self._search.data = None
        self._crash: BaseException | None = None  # the call's error this example kept as the first
        self._raised: BaseException | None = None  # the last error a call raised
        self._ending = False  # in the teardown's last checks, the calls after close()
        self._drained = False  # the drain was judged: every step and the drain answered
        try:
            super().__init__()
        except StorageFailed as failed:  # opening the transport: there is no example to tear down
            if self._discard is not None:  # an open whose answer was lost may have made something
                with contextlib.suppress(Exception):  # on a storage that fails: the error that counts is the open's
                    self._discard(self.namespace)
            self._unjudged(failed)
            raise

    def _check_close(self):
        self._ending = True  # every step and the drain were judged
        super()._check_close()

    def _drain_and_compare(self):
        super()._drain_and_compare()
        self._drained = True

    def teardown(self):
        search = self._search
        # what a step raised, on its way to Hypothesis (which tears the example down as it goes)
        aside = self._fault_aside(sys.exc_info()[1])
        try:
            super().teardown()
        except _Discarded:
            pass  # the StopTest it ran out of data with goes on up
        except _EndedAtEcho:
            search.ended_at_echo += 1
        except StorageFailed:
            pass  # a call of the drain: self.unanswered holds it
        except Exception as exc:  # the transport raised in the drain
            aside = self._fault_aside(exc)
            if aside is None:
                raise
        finally:
            if aside is not None and search.first is self._crash:
                search.first = self._crash = None  # set aside below: not this search's failure
            # what answered before the storage failed was judged: its situations count
            tally(search.reached, {name: count for name, count in self.reached.items()
                                   if not self._probe or name in SIZES})  # a probe's ~1,100 claims swamp the counts
            search.clean += search.first is None and self.unanswered is None
            # judged whole: the storage worked throughout (its choices are copied only where an
            # example set aside before it may be replayed, not at every example)
            if self._drained and self.unanswered is None and search.unjudged_examples:
                for unjudged in search.unjudged_examples:
                    unjudged.followed = True
                search.judged_choices = tuple(search.data.choices) if search.data is not None else ()
            if self._discard is not None:  # the example's storage is not needed again
                self._discard(self.namespace)
            search.found()
        if self.unanswered is not None:
            self._unjudged(self.unanswered)
        if aside is not None:
            self._ending = False  # a step's error (one that opened an instance lets the drain run): set aside
            try:
                self._set_aside(Divergence(aside))
            except _Discarded:
                pass  # the StopTest it ran out of data with goes on up

    def _fault_aside(self, error: BaseException | None) -> Fact | None:
        """The fact of ``error``, if the transport raised it in a call no step expected it from
        (an error the spec never asks for: not a panic, a crash or a hang, which may have
        broken what ran the call) and the search sets it aside: an error already found, by
        another search or an earlier pass (:func:`~harel_ref.certify._verdicts.fault_owners`,
        SPEC.md C5)."""
        if error is None or error is not self._raised:
            return None
        fact = step_fault_fact(error)
        return fact if raised_error(fact) is not None and self._aside(fact) else None

    def _open(self):
        try:
            return super()._open()
        except StorageFailed:
            raise
        except Exception as exc:
            self._raised = exc  # opening a second instance, or again, in a step: a fault if it leaves it
            raise

    def _unjudged(self, failed: StorageFailed) -> None:
        """Set the example aside, unjudged: the storage failed at one of its calls (R17), and
        the model cannot follow the queue past it (SPEC.md C15).  Counted, so that a search whose
        examples mostly ended so is not taken for one that judged them; and kept to be replayed
        (:func:`repeated_storage_failure`), the first of each method and error, but a failure
        to open (which every example makes alike).  Outside a search (a replay, a probe) it is
        raised for the caller to judge."""
        search = self._search
        search.unjudged += 1
        search.storage_failed = search.storage_failed or failed
        kinds = [_failure_kind(unjudged.failed) for unjudged in search.unjudged_examples]
        if search.data is not None and len(kinds) < UNJUDGED_REPLAYS and _failure_kind(failed) not in kinds \
                and failed.number > 1:
            search.unjudged_examples.append(Unjudged(tuple(search.data.choices), failed))
        if not self._rejects:
            raise failed  # a replay outside the search: its caller judges what it raised
        try:
            _reject()
        except _Discarded:
            pass  # it had ended (out of data: its StopTest goes on up)

    def _fail(self, *args, **kwargs):
        search = self._search
        try:
            super()._fail(*args, **kwargs)
        except Divergence as divergence:
            if self._probe:
                divergence.add_note(self._probe)  # where Hypothesis puts a failure's steps
            if self._aside(divergence.fact):
                self._set_aside(divergence)
            # a divergence the error was filed as (a stale release's error is stale-raised,
            # R10) stands for it
            if search.first is None or search.first is self._crash:
                search.first = divergence
            first = search.first
            if self._rejects and isinstance(first, Divergence) and owner(first.kind) != owner(divergence.kind):
                # Shrinking stays on the first bug's property: a smaller example that fails
                # another property is not this failure (SPEC.md C5).
                _reject()
            raise

    def _set_aside(self, divergence: Divergence) -> None:
        """Set the example aside at ``divergence``, a fact of a bug already found, or end it as
        judged if only its calls after close() met it."""
        search = self._search
        search.aside_facts.setdefault((divergence.kind, divergence.fact.after), divergence.fact)
        if search.first is self._crash:  # the call's error was filed as this fact, or is this fault
            search.first = self._crash = None
        if search.first is None:  # met while it searched; while it shrinks its own, it is rejected as before
            search.echoes.setdefault(raised_error(divergence.fact) or owner(divergence.kind), divergence)
        if self._ending:
            search.ended_echo = search.ended_echo or divergence
            raise _EndedAtEcho from divergence
        search.echo = search.echo or divergence
        search.set_aside += 1
        _reject()

    def _call(self, method, *args):
        try:
            return super()._call(method, *args)
        except StorageFailed:
            raise  # no crash: the example ends unjudged (teardown)
        except Exception as exc:  # a crash: kept in case time runs out while shrinking
            self._raised = exc  # a fault if no step expected it (teardown)
            if self._search.first is None:
                self._search.first = self._crash = exc
            raise


def search_settings(profile: Profile, examples: int) -> settings:
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


def _failure_kind(failed: StorageFailed) -> tuple[str, str, str]:
    """A storage failure's method, error class and message: an ack's call shows as ``ack(lease)``
    whatever the lease, so the call alone would take a failure that repeats for one it met
    now and then."""
    cause = failed.__cause__
    return failed.call.split("(", 1)[0], type(cause).__name__, str(cause)[:200]


UNJUDGED_REPLAYS, REPLAYS = 3, 2
"""How many examples that ended where the storage failed, each at another call, a search
replays at its end, and how many times each, to see whether the same call fails again and
again (SPEC.md C15): a storage that fails at one call in ``n`` meets the same call twice
more one time in ``n ** 2``."""

FRESH_STARTS = 10
"""How many fresh starts in a row a lockstep search may make that run no example, after
Hypothesis found its own draws inconsistent (:func:`run_search`)."""


def run_search(machine: type, profile: Profile, run_seed: int, search: Search, examples: int | None = None,
               aside: Callable[[Fact], bool] = lambda fact: False) -> None:
    """Run the lockstep ``machine``: ``examples`` examples (the profile's by default), on a
    search thread of its own (:func:`~harel_ref.stateful._async.in_line_calls`).  A synchronous
    transport's calls run in-line there, watched for the call deadline; an asyncio transport's
    are tasks there, each with its deadline.  A call that hangs ends the search with the hang
    as its failure, as found: a synchronous call's thread is left to it, with a copy of
    ``search`` that counts no more (an asyncio call's task is abandoned, and its thread
    unwinds).  Where the examples found nothing, the profile's probes run (:mod:`._probes`).
    Without a deadline, the examples run on this thread.

    A thread of its own for an asyncio transport too, so that what a search costs does not
    depend on the caller's stack: on CPython 3.11 a frame pushed and popped at the edge of a
    16 KiB chunk of the thread's frame stack maps and unmaps the chunk every time, and in a
    pytest-xdist worker (a deeper stack) that took the in-memory transport's certification
    from 3.4 s of CPU to 4.9 to 8.4 s (docs/certify-speed.md)."""
    size = profile.probe
    if search.limits.deadline is None:
        _run_examples(machine, profile, run_seed, search, examples, aside, size)
        return
    own = dataclasses.replace(search, reached=collections.Counter(search.reached),
                              aside_facts=dict(search.aside_facts), echoes=dict(search.echoes))
    try:
        hung = in_line_calls(lambda: _run_examples(machine, profile, run_seed, own, examples, aside, size),
                             search.limits)
    finally:  # a stop too: the report shows what the search found so far
        vars(search).update(vars(own), reached=collections.Counter(own.reached), aside_facts=dict(own.aside_facts),
                            echoes=dict(own.echoes))
        own.on_example = own.on_found = None  # a search thread abandoned to a call tells nobody anything
    if hung is not None:
        search.first = search.first or hung
        search.found()


def _run_examples(machine: type, profile: Profile, run_seed: int, search: Search, examples: int | None,
                  aside: Callable[[Fact], bool], probe: int = 0) -> None:
    """:func:`run_search`'s examples, on the thread they run on: Hypothesis's, then, where they
    found nothing, the probes of size ``probe`` (:func:`_run_probes`)."""
    examples = profile.max_examples if examples is None else examples
    probes = probe_programs(machine, probe)
    search.wanted = examples + len(probes)
    _hypothesis_examples(machine, profile, run_seed, search, examples, aside)
    if probes and search.outcome() is None and not search.cut_short:
        _run_probes(machine, search, aside, probes)


def _hypothesis_examples(machine: type, profile: Profile, run_seed: int, search: Search, examples: int,
                         aside: Callable[[Fact], bool]) -> None:
    """Hypothesis's ``examples`` examples of ``machine``, seeded by ``run_seed``.

    On the wall clock (R18) which rules a step may take can depend on timing: whether a claim
    got a lease decides whether an ack can follow.  Hypothesis remembers every example's draws,
    and when a step it has seen before offers other rules it stops the whole search with
    ``FlakyStrategyDefinition``.  That is the search's doing, not the transport's: before any
    failure, the search starts afresh for the examples left, each time with a seed of its own,
    so that a slow transport is not left unknown for it.  A start that ran examples may always
    be followed by another (each one brings the search nearer its end); :data:`FRESH_STARTS`
    starts in a row that ran none end it.  Where it found nothing, the examples it set aside
    because the storage failed are replayed (:func:`repeated_storage_failure`)."""
    _hypothesis_starts(machine, profile, run_seed, search, examples, aside)
    if search.first is None and not search.cut_short and (search.error is None or isinstance(search.error, Unsatisfiable)):
        search.error = repeated_storage_failure(machine, profile, search) or search.error


def _hypothesis_starts(machine: type, profile: Profile, run_seed: int, search: Search, examples: int,
                       aside: Callable[[Fact], bool]) -> None:
    """:func:`_hypothesis_examples`'s runs of Hypothesis, a fresh start after each
    ``FlakyStrategyDefinition`` before any failure."""
    no_collection_per_thread()
    idle = 0
    for start in itertools.count():
        before = search.examples
        chosen = seed(run_seed if start == 0 else f"{run_seed}/{start}")
        reported: list[str] = []  # what Hypothesis would print on the search process's stdout
        try:
            with with_reporter(reported.append):  # the calling thread's: each lane sets its own
                run_state_machine_as_test(chosen(watched_machine(machine, search, aside)),
                                          settings=search_settings(profile, examples - before))
        except StopSearch:  # search.cut_short or search.limits say why; search.first holds a failure found before
            if search.shrink_cut and search.error is None:  # a failure Hypothesis discarded, never shrunk
                search.error = unseen_failure(machine, profile, search, aside)
        except FlakyStrategyDefinition as exc:
            for text in reported:  # "Steps leading up to this error": the steps, kept with the error
                exc.add_note(text)
            idle = 0 if search.examples > before else idle + 1
            if search.first is None and search.examples >= examples:
                return  # it found its draws inconsistent only after its last example began
            if idle < FRESH_STARTS and search.first is None:
                continue
            search.error = exc
        except Exception as exc:  # a divergence, the transport raising, or Hypothesis giving up
            search.error = exc  # as Hypothesis shrank it, should a replay of the steps hang
            if isinstance(exc, Divergence):
                search.error = _without_steps(machine, search, exc, aside)
            elif isinstance(exc, Unsatisfiable):  # every example invalid: what they met was unseen
                search.error = unseen_failure(machine, profile, search, aside) or exc
        else:
            search.error = unseen_failure(machine, profile, search, aside)
        return


_SEARCHES_RANDOM = random.Random()


def no_collection_per_thread() -> None:
    """Give the calling thread Hypothesis's per-thread ``Random``, unless it has one.

    Hypothesis keeps a ``Random`` per thread to pick a test's seed where none was given.  A
    thread whose first test is seeded gets it at its first example, registered
    (``register_random``), which runs the garbage collector over the whole heap and then asks
    the collector who refers to it.  Every lockstep search runs on a thread of its own
    (:func:`run_search`), so every search paid for that: 4,047 of 84,049 py-spy samples of the
    test suite (4.8 %), in workers whose heaps hold up to a million objects.  A search always
    gives its seed (C1), so that ``Random`` never picks one: the one set here, made once per
    process and not registered (Hypothesis neither seeds nor restores it), changes no draw, and
    nothing is collected.  Only a test without a seed run inside an example would see it.
    (``hypothesis.core.threadlocal`` is not Hypothesis's documented API:
    tests/test_hypothesis_internals.py checks what this relies on.)"""
    from hypothesis import core

    if core.threadlocal._hypothesis_global_random is None:
        core.threadlocal._hypothesis_global_random = _SEARCHES_RANDOM


def unseen_failure(machine: type, profile: Profile, search: Search,
                   aside: Callable[[Fact], bool]) -> BaseException | None:
    """The failure Hypothesis never saw, with its steps, or None.

    A step can make an example invalid after it has made its calls: the rule Hypothesis drew
    was refused (its filter), or the data ran out.  The teardown's drain and checks run all the
    same, and what they meet is real, but Hypothesis discards the example with whatever it
    raised: ``search.first`` holds it, and there are no steps to show.  (So does a failure whose
    shrinking the shrink limit stopped before Hypothesis reported it.)  So the example is run
    once more from its choices (:mod:`._choices`); where it fails the same way again, that
    failure, its printed steps in its notes, less the steps it does not need (SPEC.md C7)."""
    first = search.first
    if not search.first_choices or not isinstance(first, Exception) or isinstance(first, TransportHung):
        return None
    printed: list[str] = []
    # The replay counts nowhere: it is the failure's, seen again, within the search's time.
    apart = dataclasses.replace(search, shrink_limit=math.inf, reached=collections.Counter(), aside_facts={},
                                echoes={}, on_example=None, on_found=None)
    try:
        again = run_choices(watched_machine(machine, apart, rejects=False), search.first_choices,
                            profile.step_count, printed)
    except StopSearch:  # the time is up: the failure stays as it was found
        return None
    same = type(again) is type(first) and getattr(again, "kind", None) == getattr(first, "kind", None)
    if not same:
        return None
    again.add_note("\n".join(printed))
    return _without_steps(machine, search, again, aside) if isinstance(again, Divergence) else again


def repeated_storage_failure(machine: type, profile: Profile, search: Search) -> StorageFailed | None:
    """The first example set aside where the storage failed (R17) whose call fails the same way
    (the same call, at the same place among its calls) each of :data:`REPLAYS` times the example
    runs again from its choices, with the steps it ran; or None.  Only those that an example
    judged whole later followed are replayed, and only if that example, the last such, runs
    again without the storage failing (else the storage is failing now, an outage at the
    search's end).  A storage that fails now and then (a leader election)
    does not fail at the same call again and again; a transport that turns an input it cannot
    hold into a ``StorageError`` (a NUL in a TEXT column) does, and that error is the
    transport's, judged as any error the spec never asks for (SPEC.md C15).  The replays count
    nowhere, within the search's time."""
    followed = [each for each in search.unjudged_examples if each.followed]
    try:
        if not followed or isinstance(_replayed(machine, profile, search, search.judged_choices)[0], StorageFailed):
            return None  # the last example judged whole fails now: the storage is failing, not the transport
        for unjudged in followed:
            again = None
            for _ in range(REPLAYS):
                again = _replayed_storage_failure(machine, profile, search, unjudged)
                if again is None:
                    break
            if again is not None:
                return again
    except StopSearch:  # the time is up
        return None
    return None


def _replayed(machine: type, profile: Profile, search: Search, choices: tuple) -> tuple[BaseException | None, list[str]]:
    """The example of ``choices`` run again apart from ``search`` (it counts nowhere): what it
    raised, or None, and the steps it printed.  The time being up raises StopSearch."""
    apart = dataclasses.replace(search, shrink_limit=math.inf, reached=collections.Counter(), aside_facts={},
                                echoes={}, unjudged=0, set_aside=0, unjudged_examples=[], on_example=None,
                                on_found=None)
    printed: list[str] = []
    return run_choices(watched_machine(machine, apart, rejects=False), choices, profile.step_count, printed), printed


def _replayed_storage_failure(machine: type, profile: Profile, search: Search,
                              unjudged: Unjudged) -> StorageFailed | None:
    """``unjudged``'s example run again: its failure where the storage failed at the same call
    again, its steps in its notes; else None (it went otherwise)."""
    again, printed = _replayed(machine, profile, search, unjudged.choices)
    failed = unjudged.failed
    if not (isinstance(again, StorageFailed) and (again.call, again.number) == (failed.call, failed.number)
            and type(again.__cause__) is type(failed.__cause__)):
        return None
    again.add_note("\n".join(printed))
    return again


def _run_probes(machine: type, search: Search, aside: Callable[[Fact], bool], probes: list[list[str]]) -> None:
    """Run each of ``probes`` as an example of ``search`` (SPEC.md C13a), until one fails:
    ``search.error`` is then its failure, with its steps as they are (a probe is a few steps
    already, and each replay of it thousands of calls).  A fact ``aside`` (a bug already found)
    sets the probe aside, as it sets an example aside, and the next one runs.  A probe counts
    sizes only in the evidence (:func:`watched_machine`).  Where the time was spent before a
    probe could start, the search is not cut short: its examples all ran, the probes did not."""
    for steps in probes:
        watched = watched_machine(machine, search, aside, rejects=False, probe="\n".join(steps))
        try:
            found = replayed(watched, steps)
        except StopSearch:  # the time is up, or the transport broke (search.first says so)
            if search.cut_short:  # the time is up: the search's own examples all ran
                search.cut_short, search.probes_unrun = False, len(probes) - probes.index(steps)
            return
        if found is not None and not isinstance(found, (_Discarded, StorageFailed)):  # a probe unjudged, counted
            fact = None if isinstance(found, Divergence) else step_fault_fact(found)
            if fact is not None and raised_error(fact) is not None and aside(fact):
                continue  # an error already found: set aside as the teardown set its example aside
            if not isinstance(found, Divergence):  # a fault: the note a divergence was given
                found.add_note("\n".join(steps))
            search.first = search.first or found
            search.error = found
            return


def _without_steps(machine: type, search: Search, failure: Divergence,
                   aside: Callable[[Fact], bool] = lambda fact: False) -> Divergence:
    """``failure`` as Hypothesis shrank it, less the steps it does not need (SPEC.md C7,
    :mod:`._reduce`): each replay is an example of the search, within its time.  A replay that
    meets a fact the search sets ``aside`` (a bug already found) does not count as failing."""
    steps = shrunk_steps(failure)
    if len(steps) < 3:
        return failure
    watched = watched_machine(machine, search, rejects=False)  # no Hypothesis test to reject in

    def replay(candidate: list[str]) -> BaseException | None:
        found = replayed(watched, candidate)
        return None if isinstance(found, Divergence) and aside(found.fact) else found

    return without_steps(failure, steps, replay, stopped=(StopSearch,))


def run_parallel(target: Target, caps: Capabilities, profile: Profile, run_seed: int, search: Search,
                  *, judges: frozenset[str], processes: BranchProcesses | None, alternate: bool = False,
                  ignore: frozenset[str] = frozenset()) -> None:
    """The concurrent search: ``profile.programs`` programs, each run up to ``profile.repeats``
    times (fewer while a failure is shrunk), each run judged for what ``judges`` holds:
    ``refusals`` (contention), ``histories`` (linearizability), or both (facts of the kinds in
    ``ignore`` aside).  Branches run in ``processes`` (every other run with
    ``alternate``, see :func:`check_program`), else in threads or tasks."""

    judging = dict(is_async=target.is_async, contention="refusals" in judges, histories="histories" in judges,
                   processes=processes, alternate=alternate, ignore=ignore)

    def concurrent(program):
        search.next_example()
        repeats = profile.repeats if search.first is None else profile.shrink_repeats
        try:
            check_program(target.factory, program, caps, repeats=repeats, reached=search.reached, **judging)
        except Exception as exc:
            if not isinstance(exc, ConcurrencyFailure):  # a crash: say which program
                exc.add_note(f"program:\n{program}")
            if search.first is None:
                search.first = exc
                search.found()
            raise

    test = given(programs(parking=caps.parking, groups=Choices.of(caps).groups[:2]))(concurrent)
    test = settings(search_settings(profile, profile.programs))(test)
    no_collection_per_thread()
    try:
        seed(run_seed)(test)()
    except StopSearch:
        pass
    except Exception as exc:
        search.error = exc
    search.error = reduced_error(search.error, concurrent)
    # a flaky one (Hypothesis could not make it fail again) comes in a group
    found = search.error.exceptions if isinstance(search.error, BaseExceptionGroup) else (search.error,)
    for race in (race for race in found if isinstance(race, ConcurrencyFailure) and race.program is not None):
        race.seen = _how_often(race, target, caps, profile, search, judging)


def _how_often(race: ConcurrencyFailure, target: Target, caps: Capabilities, profile: Profile, search: Search,
               judging: dict) -> tuple[int, int] | None:
    """Of how many runs made afresh, how many showed ``race``: its branches run as they ran when it
    showed (its test runs them so), within the search's time and at most :data:`RATE_SECONDS`
    (ten runs at least); None if none could be made."""
    in_processes = race.run.how == "processes"
    until = min(time.monotonic() + RATE_SECONDS, search.deadline + search.grace)
    seen = failing_runs(target.factory, race.program, caps, runs=RATE_RUNS * profile.repeats, enough=RATE_ENOUGH,
                        until=until, checkpoint=raise_if_stopped,
                        **{**judging, "processes": judging["processes"] if in_processes else None,
                           "alternate": False})
    return seen if seen[1] else None


def reduced_error(error: BaseException | None, run: Callable[[Program], None]) -> BaseException | None:
    """What the concurrent search ended with, each race in it reduced (:func:`_reduced`): a
    race, or each race of a FlakyFailure (a race Hypothesis saw fail, then not, whose program
    is as it was found); anything else as it is."""
    if isinstance(error, ConcurrencyFailure) and error.program is not None:
        return _reduced(error, run)
    if isinstance(error, FlakyFailure):
        return FlakyFailure(error.message, [reduced_error(race, run) for race in error.exceptions])
    return error


def _reduced(failure: ConcurrencyFailure, run: Callable[[Program], None]) -> ConcurrencyFailure:
    """``failure`` with its program made as small as calls and branches can be taken away one
    at a time (:func:`~harel_ref.stateful.parallel.smaller_programs`) while ``run`` still fails
    it for the same property (SPEC.md C7), or until the search's time is up."""
    smallest = failure
    while True:
        for program in smaller_programs(smallest.program):
            try:
                run(program)
            except StopSearch:
                return smallest
            except ConcurrencyFailure as found:
                if owners(frozenset({found.kind})) == owners(frozenset({failure.kind})):
                    smallest = found
                    break
            except Exception:  # a crash of a smaller program is another failure than this one
                continue
        else:
            return smallest


def shrunk_steps(exc: BaseException) -> list[str]:
    """The shrunk steps Hypothesis attached to ``exc``, from ``state = ...`` to teardown, a
    statement each (Hypothesis prints a step with long arguments over several lines)."""
    lines = [line for note in getattr(exc, "__notes__", ()) for line in str(note).splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return []
    steps = _statements(lines[starts[-1]:])
    if "state.teardown()" in steps:
        steps = steps[: steps.index("state.teardown()") + 1]
    return steps


def _statements(lines: list[str]) -> list[str]:
    """``lines`` joined into whole statements: a line that leaves one open (a bracket not yet
    closed) takes the lines after it until it compiles."""
    statements, pending = [], ""
    for line in lines:
        pending = f"{pending}\n{line}" if pending else line
        try:
            complete = codeop.compile_command(pending, "<step>", "exec") is not None
        except SyntaxError:  # not Python at all (a note's prose): kept as it is
            complete = True
        if complete:
            statements.append(pending)
            pending = ""
    return statements + ([pending] if pending else [])


@contextlib.contextmanager
def hypothesis_apart(home: str) -> Iterator[None]:
    """Hypothesis as a search needs it, whatever process it runs in, and leaving nothing behind.

    - Local constants: Hypothesis now and then draws a literal found in the source of the
      "local" modules loaded so far.  Which modules those are depends on the process (a search
      process, a pytest session and the command load different ones), so the same seed would
      find different examples.  While a search runs, there are none.
    - Storage: Hypothesis caches those constants and its Unicode tables under ``.hypothesis``
      in the current directory.  While a search runs, its home is ``home``, inside a scratch
      directory that the certification removes when it ends (whatever became of the process
      that searched).
    - Machines: Hypothesis keeps every state machine class it ran, with its rules, for the
      life of the process (and the last 128 in a cache of their rules).  A search's classes
      are its own (:func:`watched_machine`), and they hold its factory, so every store its
      transports made (an in-memory transport's whole queue per namespace).  A pytest worker
      that certified many transports held up to 1.8 million objects so, and spent up to a
      third of a test's time in the garbage collector walking them; the classes a search
      added are forgotten as it ends (:func:`machines_forgotten`).

    All three reach into Hypothesis beyond its documented API (``set_hypothesis_home_dir`` is
    documented; ``providers._get_local_constants``, ``_setup_state_per_class`` and
    ``RuleStrategy._setup_for`` are not): tests/test_hypothesis_internals.py checks what this
    relies on."""
    from hypothesis import configuration
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    before = configuration.storage_directory(intent_to_write=False).home_directory
    found = providers._get_local_constants
    configuration.set_hypothesis_home_dir(home)
    providers._get_local_constants = Constants  # called with no arguments: none
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        with machines_forgotten():
            yield
    finally:
        providers._get_local_constants = found
        providers.CONSTANTS_CACHE.cache.clear()
        configuration.set_hypothesis_home_dir(before)


@contextlib.contextmanager
def machines_forgotten() -> Iterator[None]:
    """Hypothesis forgets the state machine classes run inside (see :func:`hypothesis_apart`)."""
    from hypothesis.stateful import RuleBasedStateMachine, RuleStrategy

    kept = RuleBasedStateMachine._setup_state_per_class
    known = set(kept)
    try:
        yield
    finally:
        for machine in set(kept) - known:
            kept.pop(machine, None)
        RuleStrategy._setup_for.cache_clear()  # it keeps the last 128 machine classes run
