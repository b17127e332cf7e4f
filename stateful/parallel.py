"""The parallel search: a sequential prefix, then a few branches at once, judged by the checker.

The lockstep machine makes one call at a time.  The promise a transport exists for is about
*concurrent* callers, so this checker runs programs like::

    Program(
        prefix=(Publish("g1", "e1"), Claim(), Lapse()),   # one caller, one call at a time
        branches=(
            (Claim(), Ack("b0.0")),                        # these run at the same time:
            (Ack("p0"),),                                  # threads, tasks, or processes
        ),
    )

and checks each run's history with :func:`check_linearizable` against the model (SPEC.md R19).
A lease is named by where its claim was: ``"p0"`` is the prefix's first claim, ``"b1.0"`` the
first claim of branch 1.  An ack or nack of a lease whose claim got nothing is not made.

How one run goes (:func:`run_program`):

1. an empty queue: a fresh namespace, or the one the run before left empty (the runs of one
   program share their transports while they can, see :class:`Bench`); the prefix runs on one
   instance, the clock moved only by ``Lapse``;
2. the clock is frozen, and the branches run at once: each on its own instance opened on the
   same namespace when the transport is ``shared``, all on the first one otherwise; threads
   wait at a barrier so that they start together (tasks on one event loop for an asyncio
   transport; processes with ``processes=``);
3. the clock jumps past every lease and park, and the first instance drains the queue (claim
   and ack until None), so that a lost or duplicated message shows;
4. every call is recorded with the moment it was invoked and answered (``time.perf_counter``).

Races are rare events, so :func:`check_program` runs a program ``repeats`` times and stops at
the first run the checker refuses.  It raises :class:`ConcurrencyFailure`, a
:class:`~harel_ref.stateful.Divergence` carrying the fact seen (:mod:`harel_ref.stateful._facts`),
with the program, the history and a timeline picture.

Two judgements of each run, which the certifier's one concurrent search makes together:

- ``histories``: the history must be linearizable.  A call that raised StorageError (or a
  subclass) is taken as one that did nothing, and one that raised anything else as one that
  may or may not have happened (SPEC.md R17), so a transport that refuses concurrent callers
  is not blamed here for anything else.
- ``contention``: no branch call may raise (``raised-under-contention``).  A run where one did
  is run again with the branches one after another; if the same error comes again, it is not
  contention (the lockstep searches own it), and the run is judged on its history alone.  A
  claim that answered None while messages were claimable, during other callers' calls on their
  groups, and without which the history is linearizable, is a refusal too, seen in the history
  (Postgres's ``SKIP LOCKED``, ``none-under-contention``); when the branches run one after
  another fail as well, that failure is reported.

``contention=True`` alone judges refusals only (``histories`` defaults to ``not contention``);
``contention=True, histories=True`` judges both, refusals first.

A call that hangs (:class:`~harel_ref.stateful._async.TransportHung`, under a call deadline) is no
answer at all: it is not recorded as an error but raised, and the run stops there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ._async import TransportHung, open_transport, release_call_thread
from ._backend import Capabilities
import harel_ref.stateful._facts as facts
from ._facts import Fact
from ._lanes import SeenBeside, lanes_of_runs, runs_in_order
from ._linearize import DRAIN_WORKER, RELAXES, check_linearizable
from ._properties import BRANCHES_IN_A_PROGRAM, DRAIN_CUT, OVERLAP, UNJUDGED, largest
from ._values import BRANCH_COUNTS
from ._machine import R17_ERRORS, START, ClockedTransport, Divergence, FakeClock, MovingClock
from ._timeline import timeline_svg, timeline_text
from ._record import error_text
from .history import Record

__all__ = [
    "Ack",
    "Claim",
    "ConcurrencyFailure",
    "Lapse",
    "Nack",
    "Program",
    "Publish",
    "check_program",
    "failing_runs",
    "programs",
    "run_program",
    "smaller_programs",
]

GROUPS = ("g1", "g2")
VISIBILITY = 5.0
DELAY = 1.0
LAPSE = 100.0
"""Seconds ``Lapse`` (and the drain) move the clock: past every lease and park of a program."""

WALL_VISIBILITY = 0.02
"""With a wall clock (the transport keeps time) every lease and park lasts this long (rounded
up to a whole multiple of a declared resolution: :func:`wall_visibility`), and ``Lapse`` and
the drain sleep a little longer: leases may then lapse mid-run, which the checker allows for
(R18)."""


def wall_visibility(capabilities: Capabilities) -> float:
    """Every lease and park of a run on a wall clock: :data:`WALL_VISIBILITY`, rounded up to a
    whole multiple of the transport's resolution (1 s for SQS)."""
    resolution = capabilities.resolution
    return math.ceil(WALL_VISIBILITY / resolution) * resolution if resolution else WALL_VISIBILITY


# --- programs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publish:
    group: str
    event: str


@dataclass(frozen=True)
class Claim:
    """A plain claim (no priority floor, no routing filter) for the visibility of the run."""


@dataclass(frozen=True)
class Ack:
    lease: str


@dataclass(frozen=True)
class Nack:
    lease: str
    delay: float = 0.0


@dataclass(frozen=True)
class Lapse:
    """Prefix only: the clock moves past every lease and park taken so far; ``exact``: to the
    end of the next one instead, where it is still live (R3) and a tick later lapsed, so that a
    branch acting on a later reading of the clock than its first shows it (SPEC.md R3a).  On a
    wall clock both sleep past every lease."""

    exact: bool = False


Op = Publish | Claim | Ack | Nack | Lapse


@dataclass(frozen=True)
class Program:
    """A sequential prefix, then branches that run at once."""

    prefix: tuple[Op, ...]
    branches: tuple[tuple[Op, ...], ...]

    def __post_init__(self) -> None:
        if len(self.branches) < 2:
            raise ValueError(f"a Program needs at least two branches to run at once, got {len(self.branches)}")
        if any(isinstance(op, Lapse) for branch in self.branches for op in branch):
            raise ValueError("Lapse moves the clock, which is frozen while the branches run: prefix only")
        prefix_names = _check_names("p", self.prefix, [])
        for number, branch in enumerate(self.branches):
            _check_names(f"b{number}.", branch, prefix_names)

    def __str__(self) -> str:
        """As Python that builds it."""
        def ops(sequence: Sequence[Op]) -> str:
            return "(" + "".join(f"{_op_code(op)}, " for op in sequence).rstrip(" ") + ")"

        branches = "".join(f"\n        {ops(branch)}," for branch in self.branches)
        return f"Program(\n    prefix={ops(self.prefix)},\n    branches=({branches}\n    ),\n)"


def _op_code(op: Op) -> str:
    if isinstance(op, Publish):
        return f"Publish({op.group!r}, {op.event!r})"
    if isinstance(op, Ack):
        return f"Ack({op.lease!r})"
    if isinstance(op, Nack):
        return f"Nack({op.lease!r})" if not op.delay else f"Nack({op.lease!r}, {op.delay!r})"
    if isinstance(op, Lapse) and op.exact:
        return "Lapse(exact=True)"
    return f"{type(op).__name__}()"


def _check_names(prefix: str, ops: Sequence[Op], known: list[str]) -> list[str]:
    """The names of the claims in ``ops``; every ack and nack must name an earlier one."""
    names = list(known)
    for op in ops:
        if isinstance(op, Claim):
            names.append(f"{prefix}{sum(name.startswith(prefix) for name in names)}")
        elif isinstance(op, (Ack, Nack)) and op.lease not in names:
            raise ValueError(f"{op!r} names no claim made before it; the claims before it: {names}")
    return names


@st.composite
def programs(draw, *, parking: bool = True, max_branches: int = 6, groups: tuple[str, ...] = GROUPS) -> Program:
    """Programs of a short prefix (one to three publishes, then a few calls) and two to
    ``max_branches`` branches of one to four calls each, over two groups (``groups``: those a
    transport accepts, ``Choices.of(capabilities).groups[:2]``).  Two or three branches are
    drawn three times as often as each of four, five and six (:data:`._values.BRANCH_COUNTS`),
    and shrink to two.

    Acks and nacks name a lease of the prefix or of an earlier claim of their own branch.  The
    draws lean towards what races: claims in the prefix, then branches that claim, or give
    up a prefix lease, at the same time.  Shapes of race begin five programs of eight (SPEC.md
    C9): a quarter of them, a group that ends and begins again while others run (the prefix
    publishes a group's one message and claims it, one branch acks it, another publishes into
    that group); a quarter, a lease given up twice at once (the prefix claims, two branches each
    ack or nack that lease first); an eighth, two claims at the exact end of a lease (the prefix
    claims, then its clock stops there, ``Lapse(exact=True)``, where a claim that reads the
    clock again after waiting for the other sees it lapsed, R3a)."""
    events = iter(f"e{n}" for n in range(1, 100))
    releases = [Ack, Ack, Nack] + ([lambda name: Nack(name, DELAY)] if parking else [])

    def publish() -> Publish:
        return Publish(draw(st.sampled_from(groups)), next(events))

    def release(names: list[str]) -> Op:
        return draw(st.sampled_from(releases))(draw(st.sampled_from(names)))

    shape = draw(st.integers(0, 7))  # 0 to 2: free; the shapes last, so that shrinking leaves them out
    at_end, twice, again = shape == 3, shape in (4, 5), shape in (6, 7)
    first = draw(st.sampled_from(groups))
    prefix, prefix_leases = _draw_prefix(draw, publish, release, events, first, groups,
                                         at_end=at_end, twice=twice, again=again)
    starts: list[list[Op]] = []
    if again:
        starts = [[Ack("p0")], [Publish(first, next(events))]]
    elif twice:
        starts = [[release(["p0"])], [release(["p0"])]]
    elif at_end:
        starts = [[Claim()], [Claim()]]
    branches = _draw_branches(draw, publish, release, starts, prefix_leases, max_branches)
    return Program(tuple(prefix), tuple(branches))


def _draw_prefix(draw: Callable, publish: Callable[[], Publish], release: Callable[[list[str]], Op],
                 events: Iterator[str], first: str, groups: tuple[str, ...], *,
                 at_end: bool, twice: bool, again: bool) -> tuple[list[Op], list[str]]:
    """The prefix of a :func:`programs` draw, and the names of its claims' leases: one to three
    publishes (one for the shape ``again``), then at most three calls: the claim of ``p0`` that
    the shapes ``again``, ``twice`` and ``at_end`` race on, drawn claims, lapses, publishes and
    releases, and last the ``Lapse(exact=True)`` of ``at_end``.  ``publish`` and ``release``
    draw one such call."""
    # The prefix's first publishes go to the groups in turn, so that a group often holds one
    # message, which a branch's ack may take away while another publishes into the group.
    turns = [first, *(group for group in groups if group != first)]
    published = 1 if again else draw(st.integers(1, 3))
    prefix: list[Op] = [Publish(turns[n % len(turns)], next(events)) for n in range(published)]
    prefix_leases: list[str] = ["p0"] if again or twice or at_end else []
    prefix += [Claim()] * len(prefix_leases)
    for _ in range(draw(st.integers(0, 3 - len(prefix_leases) - at_end))):
        kind = draw(st.sampled_from(["claim", "claim", "claim", "lapse", "publish", "release"]))
        if kind == "publish":
            prefix.append(publish())
        elif kind == "lapse":
            prefix.append(Lapse(exact=draw(st.booleans())))
        elif kind == "release" and prefix_leases:
            prefix.append(release(prefix_leases))
        else:
            prefix_leases.append(f"p{len(prefix_leases)}")
            prefix.append(Claim())
    prefix += [Lapse(exact=True)] * at_end
    return prefix, prefix_leases


def _draw_branches(draw: Callable, publish: Callable[[], Publish], release: Callable[[list[str]], Op],
                   starts: list[list[Op]], prefix_leases: list[str], max_branches: int) -> list[tuple[Op, ...]]:
    """The branches of a :func:`programs` draw: two to ``max_branches`` of one to four calls
    each, branch ``n`` beginning with ``starts[n]`` (a shape's racing calls) if there is one,
    its acks and nacks naming a lease of ``prefix_leases`` or of an earlier claim of its own."""
    branches = []
    for number in range(draw(st.sampled_from([n for n in BRANCH_COUNTS if n <= max_branches]))):
        branch: list[Op] = starts[number] if number < len(starts) else []
        own: list[str] = [f"b{number}.0"] if branch and isinstance(branch[0], Claim) else []
        for _ in range(draw(st.integers(1 - len(branch), 4 - len(branch)))):
            kind = draw(st.sampled_from(["claim", "claim", "prefix lease", "prefix lease", "own lease", "publish",
                                         "publish"]))
            if kind == "publish":
                branch.append(publish())
            elif kind == "prefix lease" and prefix_leases:
                branch.append(release(prefix_leases))
            elif kind == "own lease" and own:
                branch.append(release(own))
            else:
                own.append(f"b{number}.{len(own)}")
                branch.append(Claim())
        branches.append(tuple(branch))
    return branches


def smaller_programs(program: Program) -> Iterator[Program]:
    """The programs one step smaller than ``program``: a branch fewer (two stay), then a call
    fewer, a claim leaving with the acks and nacks of its lease.  Leases and events are named
    afresh.  What the certifier tries after Hypothesis has shrunk a failing program (SPEC.md
    C7): Hypothesis shrinks the draws, and a program whose first draw chose a shape of race
    (:func:`programs`) keeps the calls that shape adds, however little they matter."""
    parts = [program.prefix, *program.branches]
    if len(program.branches) > 2:
        for number in range(1, len(parts)):
            yield _without(parts, set(), gone=number)
    for number, part in enumerate(parts):
        for index in range(len(part)):
            smaller = _without(parts, {(number, index)})
            if smaller is not None:
                yield smaller


def _without(parts: list[tuple[Op, ...]], dropped: set[tuple[int, int]], gone: int | None = None) -> Program | None:
    """The program of ``parts`` (the prefix, then the branches) without the calls at
    ``dropped`` ((part, index)), nor the acks and nacks of a dropped claim's lease, nor the
    branch ``gone``; None when a branch is left with no call."""
    claims = {}  # a lease's name -> where its claim is
    for number, part in enumerate(parts):
        name = "p" if number == 0 else f"b{number - 1}."
        claims.update({f"{name}{n}": (number, index)
                       for n, index in enumerate(i for i, op in enumerate(part) if isinstance(op, Claim))})
    kept, renamed, events = [], {}, itertools.count(1)
    for number, part in enumerate(parts):
        if number == gone:
            continue
        name, ops = "p" if not kept else f"b{len(kept) - 1}.", []
        for index, op in enumerate(part):
            lease = getattr(op, "lease", None)
            if (number, index) in dropped or (lease is not None and claims[lease] not in renamed):
                continue
            if isinstance(op, Claim):
                renamed[(number, index)] = f"{name}{sum(isinstance(o, Claim) for o in ops)}"
            ops.append(_renamed(op, renamed.get(claims.get(lease)), events))
        if number and not ops:
            return None
        kept.append(tuple(ops))
    return Program(kept[0], tuple(kept[1:]))


def _renamed(op: Op, lease: str | None, events: Iterator[int]) -> Op:
    """``op`` naming its lease ``lease``, and its event the next of ``events``."""
    if isinstance(op, Publish):
        return Publish(op.group, f"e{next(events)}")
    if isinstance(op, (Ack, Nack)):
        return dataclasses.replace(op, lease=lease)
    return op


# --- running a program ----------------------------------------------------------------------


class _Recorder:
    """Records the calls of one caller (a branch, the prefix, the drain): no lock needed."""

    def __init__(self, worker: str, wall: bool) -> None:
        self.worker = worker
        self.records: list[Record] = []
        self._now = time.time if wall else time.perf_counter
        self._wall = wall

    def start(self, op: str, at: float | None, **args: Any) -> Record:
        record = Record(self.worker, op, self._now(), args, at=None if self._wall else at)
        self.records.append(record)
        return record

    def finish(self, record: Record, result: Any = None, error: BaseException | None = None) -> None:
        record.complete = self._now()
        if error is None:
            record.result = result
        else:
            record.error = error_text(error)


@dataclass
class _Calls:
    """What one caller does with its transport: the ops, the lease names, the records."""

    recorder: _Recorder
    leases: dict[str, Any]
    names: str  # how this caller names its claims: "p", "b0.", ...
    visibility: float
    delay: float | None  # every park's delay (a wall clock), or None: each Nack's own
    claims: int = 0

    def prepare(self, op: Op, transport: Any) -> tuple[str, Callable[[], Any], dict[str, Any]] | None:
        """The method to call for ``op`` and the arguments to record, or None to skip it."""
        if isinstance(op, Publish):
            return "publish", lambda: transport.publish(op.group, op.event), {"group_id": op.group, "event": op.event}
        if isinstance(op, Claim):
            worker = "w0" if self.names == "p" else f"w{int(self.names[1:-1]) + 1}"
            return "claim", lambda: transport.claim(worker, self.visibility), {"worker_id": worker, "visibility": self.visibility}
        lease = self.leases.get(op.lease)
        if lease is None:
            return None  # its claim got nothing (or raised)
        if isinstance(op, Ack):
            return "ack", lambda: transport.ack(lease), {"lease": lease}
        delay = (op.delay if self.delay is None else self.delay) if op.delay else 0.0
        return "nack", lambda: transport.nack(lease, delay), {"lease": lease, "delay": delay}

    def claimed(self, op: Op, answer: Any) -> None:
        if isinstance(op, Claim):
            self.leases[f"{self.names}{self.claims}"] = answer
            self.claims += 1

    def _calls(self, ops: Sequence[Op], transport: Any, at: float | None, errors_raise: bool):
        """The calls to make, recorded: yields each method to call and is sent back
        ``(answer, error)``; the sync and async runners below only make the calls."""
        for op in ops:
            prepared = self.prepare(op, transport)
            if prepared is None:
                self.claimed(op, None)
                continue
            name, method, args = prepared
            record = self.recorder.start(name, at, **args)
            answer, error = yield method
            self.recorder.finish(record, answer, error)
            self.claimed(op, None if error is not None else answer)
            if error is not None and errors_raise and not isinstance(error, R17_ERRORS):
                raise error  # an error of R17 is recorded, and the history judged with it

    def run(self, ops: Sequence[Op], transport: Any, at: float | None, *, errors_raise: bool) -> None:
        calls = self._calls(ops, transport, at, errors_raise)
        outcome = None
        while True:
            try:
                method = calls.send(outcome)
            except StopIteration:
                return
            try:
                outcome = (method(), None)
            except TransportHung:
                raise  # not an answer: the transport cannot be called again (harel_ref.stateful._async)
            except Exception as exc:
                outcome = (None, exc)

    async def run_async(self, ops: Sequence[Op], transport: Any, at: float | None) -> None:
        calls = self._calls(ops, transport, at, errors_raise=False)
        outcome = None
        while True:
            try:
                method = calls.send(outcome)
            except StopIteration:
                return
            try:
                outcome = (await method(), None)
            except TransportHung:
                raise
            except Exception as exc:
                outcome = (None, exc)


@dataclass(frozen=True)
class Run:
    """One run of a program (or a soak, ``program`` None): every call, and how it ran."""

    program: Program | None
    records: tuple[Record, ...]
    how: str  # "threads", "tasks", "processes", "one after another", or the soak's workload


class Bench:
    """The queue a run is made on: a fresh namespace, the clock, the event loop of an asyncio
    transport, the first instance (the prefix's, the drain's) and, opened when a run asks, one
    instance per branch.

    :func:`check_program` keeps one bench for the runs of a program as long as each leaves the
    queue as it found it, empty: every call answered and the drain ended with nothing left to
    claim (the checker made sure it was what the model holds).  Opening transports again for
    every run would cost a networked store several requests each, for nothing new."""

    def __init__(self, factory: Callable, capabilities: Capabilities, is_async: bool) -> None:
        self.factory, self.capabilities = factory, capabilities
        self.wall = capabilities.clock == "wall"
        self.clock = time.time if self.wall else FakeClock(START)
        self.namespace = f"ns_{uuid.uuid4().hex[:12]}"
        self.loop = asyncio.new_event_loop() if is_async else None
        self.opened: list[Any] = []

    def instance(self, number: int) -> Any:
        """Instance ``number`` (0: the first), opened on the namespace the first time.  A
        branch's own instance (1 and up) reads a :class:`MovingClock` that follows the run's:
        the frozen moment at its first reading in a call, a tick later at each further one."""
        while len(self.opened) <= number:
            if self.wall or not self.opened:
                clock = self.clock
            else:
                clock = MovingClock(following=self.clock)
            opened = open_transport(self.factory, clock, self.namespace, self.loop, self.capabilities.protocol)
            self.opened.append(ClockedTransport(opened, clock) if isinstance(clock, MovingClock) else opened)
        return self.opened[number]

    def now(self) -> float | None:
        return None if self.wall else self.clock.now

    def close(self) -> None:
        close_all(self.opened, self.loop)


def run_program(
    factory: Callable,
    program: Program,
    capabilities: Capabilities,
    *,
    is_async: bool = False,
    processes: Any = None,
    concurrently: bool = True,
    bench: Bench | None = None,
) -> Run:
    """Run ``program`` once on a fresh namespace (see the module docstring) and return its
    history.  ``processes`` is a :class:`~harel_ref.stateful._processes.BranchProcesses` pool;
    ``concurrently=False`` runs the branches one after another instead.  ``bench``: run on
    that :class:`Bench` (an empty queue, its transports left open), not on a new one."""
    own = bench is None
    if own:
        bench = Bench(factory, capabilities, is_async)
    wall, clock, now = bench.wall, bench.clock, bench.now
    lasting = wall_visibility(capabilities)
    visibility, delay = (lasting, lasting) if wall else (VISIBILITY, None)
    in_processes = processes is not None and concurrently
    try:
        first = bench.instance(0)
        leases: dict[str, Any] = {}
        prefix = _Calls(_Recorder("prefix", wall), leases, "p", visibility, delay)
        # the prefix up to its last Lapse sleeps on a wall clock: outside the pool's turn, which
        # holds the leases taken after it (BranchProcesses.turn)
        lapsed = max((n + 1 for n, op in enumerate(program.prefix) if isinstance(op, Lapse)), default=0)
        _run_prefix(program.prefix[:lapsed], prefix, first, bench, visibility)
        with processes.turn() if in_processes else contextlib.nullcontext():
            _run_prefix(program.prefix[lapsed:], prefix, first, bench, visibility)
            frozen = now()
            branches = [
                _Calls(_Recorder(f"b{n}", wall), dict(leases), f"b{n}.", visibility, delay)
                for n in range(len(program.branches))
            ]
            if in_processes:
                how = "processes"
                records = processes.run(bench.namespace, frozen, program, leases, visibility, delay)
            else:
                how = _run_branches_in_this_process(bench, program, branches, first, frozen,
                                                    shared=capabilities.shared, is_async=is_async,
                                                    concurrently=concurrently)
                records = [record for calls in branches for record in calls.recorder.records]
        _pass_time(clock, wall, visibility)
        drain = _drain(first, visibility, now(), wall, limit=sum(isinstance(op, Publish) for op in _all_ops(program)))
        return Run(program, (*prefix.recorder.records, *records, *drain), how)
    finally:
        if own:
            bench.close()


def _run_prefix(ops: Sequence[Op], prefix: _Calls, first: Any, bench: Bench, visibility: float) -> None:
    """Make the prefix's calls on the first instance, one at a time (an error raises, but one
    of R17, which is recorded for the history checker).  A ``Lapse`` moves the clock past every
    lease and park; ``Lapse(exact=True)``, on a fake clock, to the end of the next lease or park
    the prefix took that is still live, if any."""
    wall, clock = bench.wall, bench.clock
    ends: list[float] = []  # of the prefix's leases and parks
    for op in ops:
        if isinstance(op, Lapse):
            upcoming = [end for end in ends if end >= clock.now] if op.exact and not wall else []
            if upcoming:
                clock.now = min(upcoming)
            else:
                _pass_time(clock, wall, visibility)
        else:
            made = len(prefix.recorder.records)
            prefix.run([op], first, bench.now(), errors_raise=True)
            if not wall and len(prefix.recorder.records) > made:
                if (end := _ends_at(op, prefix.recorder.records[-1], clock.now, visibility)) is not None:
                    ends.append(end)


def _run_branches_in_this_process(bench: Bench, program: Program, branches: list[_Calls], first: Any,
                                  frozen: float | None, *, shared: bool, is_async: bool, concurrently: bool) -> str:
    """Make the branches' calls at ``frozen``, in this process: at once in threads (tasks on
    the bench's loop for an asyncio transport), or one after another when not
    ``concurrently``; each on its own instance when the transport is ``shared`` and they run
    at once, all on ``first`` otherwise.  Returns how they ran, as :class:`Run` says it."""
    if shared and concurrently:
        instances = [bench.instance(1 + n) for n in range(len(program.branches))]
    else:
        instances = [first] * len(program.branches)
    if not concurrently:
        for calls, ops, instance in zip(branches, program.branches, instances):
            if is_async:
                bench.loop.run_until_complete(calls.run_async(ops, instance.transport, frozen))
            else:
                calls.run(ops, instance, frozen, errors_raise=False)
        return "one after another"
    if is_async:
        bench.loop.run_until_complete(_together(
            calls.run_async(ops, instance.transport, frozen)
            for calls, ops, instance in zip(branches, program.branches, instances)
        ))
        return "tasks"
    _run_threads(branches, program.branches, instances, frozen)
    return "threads"


def _left_empty(run: Run) -> bool:
    """Whether ``run`` surely left its queue empty: no call raised, and the drain's last claim
    found nothing."""
    drained = [r for r in run.records if r.worker == DRAIN_WORKER and r.op == "claim"]
    return bool(drained) and drained[-1].result is None and all(r.error is None for r in run.records)


def close_all(transports: Sequence[Any], loop: asyncio.AbstractEventLoop | None) -> None:
    """Close every transport a run opened (quietly: the run's own errors are the ones to
    report), then the run's event loop."""
    for transport in transports:
        try:
            transport.close()
        except Exception:
            pass
    if loop is not None:
        loop.close()


HUNG = 120.0
"""Seconds a branch (or a soak worker) may take beyond its work before it counts as hung."""


async def _together(coroutines, timeout: float | None = None) -> None:
    """Run coroutines as tasks of the running loop, all at once; a TimeoutError if they have
    not all finished within ``timeout`` seconds (default :data:`HUNG`: the transport hangs)."""
    timeout = HUNG if timeout is None else timeout
    try:
        await asyncio.wait_for(asyncio.gather(*coroutines), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"calls did not finish within {timeout:g} s: the transport hangs under concurrency") from None


def _ends_at(op: Op, record: Record, now: float, visibility: float) -> float | None:
    """When the lease or park that prefix call ``op`` (answered as ``record``) took ends."""
    if isinstance(op, Claim) and record.ok and record.result is not None:
        return now + visibility
    if isinstance(op, Nack) and op.delay and record.ok and record.result is not False:
        return now + op.delay
    return None


def _all_ops(program: Program) -> list[Op]:
    return [*program.prefix, *(op for branch in program.branches for op in branch)]


def _pass_time(clock: Any, wall: bool, visibility: float) -> None:
    if wall:
        time.sleep(visibility * 1.5)
    else:
        clock.now += LAPSE


def _run_threads(branches: list[_Calls], programs_: Sequence[Sequence[Op]], instances: list[Any], at: float | None) -> None:
    """Each branch in its own thread, all released at once by a barrier.  Branch ``n``'s thread
    is named ``harel-ref-branch-n`` (its call thread, if it has one, ``harel-ref-calls-harel-ref-
    branch-n``), so that a transport's logs say which branch called."""
    barrier = threading.Barrier(len(branches))
    failures: list[BaseException] = []

    def branch(calls: _Calls, ops: Sequence[Op], instance: Any) -> None:
        try:
            barrier.wait(timeout=30)
            calls.run(ops, instance, at, errors_raise=False)
        except BaseException as exc:  # the barrier broke, or a call hung: report it, do not hang
            failures.append(exc)
            barrier.abort()
        finally:
            release_call_thread()

    threads = [threading.Thread(target=branch, args=args, name=f"harel-ref-branch-{number}", daemon=True)
               for number, args in enumerate(zip(branches, programs_, instances))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + HUNG
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise TimeoutError(f"a branch did not finish within {HUNG:g} s: the transport hangs under concurrency")
    if failures:
        raise failures[0]


def _drain(transport: Any, visibility: float, at: float | None, wall: bool, limit: int) -> list[Record]:
    """Claim and ack until None (at most ``limit`` + 1 messages: more is a duplicate).  A call
    that raises an error of R17 is recorded and ends the drain: the history is judged with it
    (it may have acted), and without a last claim that found nothing, it shows no loss."""
    recorder = _Recorder(DRAIN_WORKER, wall)
    for number in range(limit + 2):
        lease = _drained(recorder, at, "claim", lambda: transport.claim(DRAIN_WORKER, visibility),
                         worker_id=DRAIN_WORKER, visibility=visibility)
        if lease is None or _drained(recorder, at, "ack", lambda: transport.ack(lease), lease=lease) is _FAILED:
            break
    return recorder.records


_FAILED = object()  # what _drained answers for a call that raised an error of R17


def _drained(recorder: _Recorder, at: float | None, op: str, call: Callable[[], Any], **args: Any) -> Any:
    """One call of the drain, recorded: its answer, or None (a claim) or ``_FAILED`` (an ack)
    for one that raised an error of R17."""
    record = recorder.start(op, at, **args)
    try:
        answer = call()
    except R17_ERRORS as exc:
        recorder.finish(record, error=exc)
        return None if op == "claim" else _FAILED
    recorder.finish(record, answer)
    return answer


# --- judging --------------------------------------------------------------------------------


class ConcurrencyFailure(Divergence):
    """A program whose run the checker refused: a Divergence with the program, the run and a
    timeline.  ``runs`` is how many runs it took to see it."""

    def __init__(self, fact: Fact, *, run: Run, culprits: Sequence[Record], runs: int) -> None:
        super().__init__(fact)
        self.program = run.program
        self.run = run
        self.culprits = tuple(culprits)
        self.runs = runs
        self.seen: tuple[int, int] | None = None  # refused of runs made, once measured (failing_runs)
        if run.program is not None:
            self.add_note(f"program:\n{run.program}\nbranches run as {run.how}; failed on run {runs}")
        else:
            self.add_note(f"soak: {run.how}; {len(run.records)} calls")

    @property
    def shown(self) -> tuple[Record, ...]:
        """The records a timeline shows: all of a program's run; of a soak, the calls around
        the culprits."""
        if self.run.program is not None or not self.culprits:
            return self.run.records
        return _around(self.run.records, self.culprits)

    @property
    def timeline(self) -> str:
        return timeline_text(self.shown, self.culprits)

    @property
    def svg(self) -> str:
        return timeline_svg(self.shown, self.culprits, title=f"{self.kind}: {self.fact.step}")


def _around(records: Sequence[Record], culprits: Sequence[Record], most: int = 40) -> tuple[Record, ...]:
    """The culprits and the calls nearest them in time, at most ``most``, in history order."""
    chosen = {id(record) for record in culprits}
    middle = sum(c.invoke for c in culprits) / len(culprits)
    for record in sorted(records, key=lambda r: abs(r.invoke - middle)):
        if len(chosen) >= most:
            break
        chosen.add(id(record))
    return tuple(record for record in records if id(record) in chosen)


_FAILURE_CLASSES: dict[str, type[ConcurrencyFailure]] = {}


def failure_class(kind: str) -> type[ConcurrencyFailure]:
    """One subclass per kind of fact, so that Hypothesis keeps failures of different kinds
    apart (it tells bugs apart by exception type), and failures of one kind together."""
    if kind not in _FAILURE_CLASSES:
        name = "ConcurrencyFailure_" + kind.replace("-", "_")
        _FAILURE_CLASSES[kind] = type(name, (ConcurrencyFailure,), {"__module__": __name__})
    return _FAILURE_CLASSES[kind]


def failure(fact: Fact, run: Run, culprits: Sequence[Record], runs: int) -> ConcurrencyFailure:
    """The failure that shows ``fact`` in ``run``, its ``culprits`` marked."""
    return failure_class(fact.kind)(fact, run=run, culprits=culprits, runs=runs)


REFUSALS = frozenset({facts.RAISED_UNDER_CONTENTION, facts.NONE_UNDER_CONTENTION})
"""What a call that refused to answer shows: an error, or a None where a group was claimable."""

RAISES = frozenset({facts.RAISED_UNDER_CONTENTION, facts.STALE_RAISED})
"""What the judgement of errors (``contention=True``, :func:`refusal`) shows; every other kind
is the history's (``histories=True``)."""


def judge(run: Run, *, contention: bool, histories: bool | None = None, runs: int = 1,
          ignore: frozenset[str] = frozenset(), capabilities: Capabilities = Capabilities(),
          reached: collections.Counter | None = None) -> ConcurrencyFailure | None:
    """The failure this run shows, if any (see the module docstring for the two judgements):
    a refusal first when ``contention``, then the history when ``histories`` (by default,
    when not ``contention``).

    ``ignore``: kinds of fact already seen.  The model leaves out the rule whose breach shows as
    one of them where there is one (R2 for ``claimed-leased``, R10 for ``stale-acted``), so
    that the run is still judged for everything else; a fact of another ignored kind counts as
    none (``raised-under-contention`` ignored: errors are not judged).  ``reached`` counts a run
    left unjudged (:func:`history_failure`)."""
    if contention and facts.RAISED_UNDER_CONTENTION not in ignore \
            and (refused := refusal(run, runs, ignore, capabilities)) is not None:
        return refused
    if histories is None:
        histories = not contention
    return history_failure(run, runs, ignore, capabilities, reached) if histories else None


def refusal(run: Run, runs: int = 1, ignore: frozenset[str] = frozenset(),
            capabilities: Capabilities = Capabilities()) -> ConcurrencyFailure | None:
    """The failure if a branch call raised in ``run``: ``stale-raised`` if it was an ack or
    nack whose lease was stale (:func:`surely_stale`, :func:`must_be_stale`), which R10 answers
    with False (or nothing), not an error, whatever else runs at the time (unless that kind is
    in ``ignore``; for a transport that acks by seq, a refusal as any); else
    ``raised-under-contention``."""
    raised = [r for r in run.records if r.error is not None and r.worker not in ("prefix", DRAIN_WORKER)]
    fenced = capabilities.acks != "by-seq"  # by seq, a stale release acts: its error is no fencing matter
    if stale := [r for r in raised if fenced and (surely_stale(r, run.records, capabilities.acks)
                                                  or must_be_stale(r, run.records, capabilities))]:
        if facts.STALE_RAISED not in ignore:
            return _stale_release(run, stale, runs)
        raised = [r for r in raised if r not in stale]
    if not raised:
        return None
    first = raised[0]
    return failure(Fact(facts.RAISED_UNDER_CONTENTION, f"{first.worker}: {first.op}({_args(first)}) while other "
                        "branches ran", "an answer (the spec allows no error here)", first.error),
                   run, raised, runs)


def _stale_release(run: Run, stale: list[Record], runs: int) -> ConcurrencyFailure:
    return failure(Fact(facts.STALE_RAISED, f"{stale[0].worker}: {stale[0].op}({_args(stale[0])}), its lease no "
                        "longer current", "False (nothing, under harel's Protocol): the call does nothing and says "
                        "so, without an error (R10)", stale[0].error), run, stale, runs)


def surely_stale(release: Record, records: Sequence[Record], acks: str = "fenced") -> bool:
    """Whether the ack or nack ``release`` began after its lease was surely no longer current:
    another ack or nack of the same token had answered True (or, under harel's Protocol,
    answered at all) before it began, or a claim begun after the lease's own claim answered
    had handed out the same message again before it began.  With ``acks="until-reclaimed"``
    a nack does not end the lease (R10a): only an ack or a new claim does."""
    if release.op not in ("ack", "nack"):
        return False
    ending = ("ack",) if acks == "until-reclaimed" else ("ack", "nack")
    token, message = _token(release.args["lease"]), _message_of(release.args["lease"])
    own = next((r for r in records if r.op == "claim" and r.ok and r.result and _token(r.result) == token), None)
    for other in records:
        if other is release or other.complete is None or other.complete >= release.invoke:
            continue
        if other.op in ending and other.ok and other.result is not False and _token(other.args["lease"]) == token:
            return True
        if (own is not None and other.op == "claim" and other.ok and other.result
                and other.invoke > own.complete and _message_of(other.result) == message):
            return True
    return False


def must_be_stale(release: Record, records: Sequence[Record], capabilities: Capabilities) -> bool:
    """Whether the ack or nack ``release``, which raised, can only have come after its lease
    stopped being current: the history is linearizable if it answered that it did nothing
    (False), and not if it acted (True).  (Calls that overlap it may decide; a claim of the
    same message that answered after it began, for one.)  Its answer is placed no later than
    the last moment of the branches, never at the drain, where every lease is stale.  Where
    other calls raised too, the checker takes at most :data:`UNCERTAIN_STEPS`, as for the
    history, and what it cannot decide is not stale: an error all the same.  (Unbounded, a
    store that refused a fourth connection made 36 such checks of one run take 142 s.)"""
    if release.op not in ("ack", "nack") or release.error is None:
        return False
    branches = [r for r in records if r.worker not in ("prefix", DRAIN_WORKER)]
    end = max(r.complete if r.complete is not None else r.invoke for r in branches)
    uncertain = any(r.error is not None for r in records if r is not release)

    def linearizable(answer: bool) -> bool | None:
        answered = dataclasses.replace(release, error=None, result=answer, complete=end)
        history = [answered if r is release else r for r in records]
        return check_linearizable(history, fairness="unspecified", acks=capabilities.acks,
                                  acks_answer=capabilities.protocol != "harel",
                                  **({"max_steps": UNCERTAIN_STEPS} if uncertain else {})).ok

    return linearizable(False) is True and linearizable(True) is False


def _token(lease: Any) -> Any:
    return lease["token"] if isinstance(lease, dict) else getattr(lease, "token", None)


def _message_of(lease: Any) -> tuple[Any, Any]:
    if isinstance(lease, dict):
        return lease.get("group_id"), lease.get("event")
    return getattr(lease, "group_id", None), getattr(lease, "event", None)


UNCERTAIN_STEPS = 10_000
"""Steps the checker may take on a run in which a branch call raised.  Each such call may have
taken effect at any moment after it began, or never (R17), so the orders to try multiply with
every one: a run of 34 calls with 8 raised (a store that refuses a fourth connection, in a
program of six branches) took the checker 2,000,000 steps, 19 s, undecided.  A run it cannot
decide within these steps (about 0.1 s) is left unjudged and counted (:data:`UNJUDGED`); a run
without an error is always decided."""


def history_failure(run: Run, runs: int = 1, ignore: frozenset[str] = frozenset(),
                    capabilities: Capabilities = Capabilities(),
                    reached: collections.Counter | None = None) -> ConcurrencyFailure | None:
    """The failure showing the fact the linearizability checker names, if ``run``'s history is
    not linearizable (facts of the kinds in ``ignore`` aside).  A run with raised calls that the
    checker cannot decide in :data:`UNCERTAIN_STEPS` is counted in ``reached`` and shows none."""
    relax = [rule for rule, kind in RELAXES if kind in ignore]
    uncertain = any(r.error is not None for r in run.records)
    if reached is not None and any(r.error is not None for r in run.records if r.worker == DRAIN_WORKER):
        reached[DRAIN_CUT] += 1  # the drain ended at the error (_drain): no loss can show
    result = check_linearizable(run.records, fairness="unspecified", relax=relax, acks=capabilities.acks,
                                acks_answer=capabilities.protocol != "harel",
                                **({"max_steps": UNCERTAIN_STEPS} if uncertain else {}))
    if result.ok is None and uncertain:
        if reached is not None:
            reached[UNJUDGED] += 1
        return None
    if result.ok is None:
        raise RuntimeError(f"the linearizability check gave up on a run of {len(run.records)} calls: {result}")
    if result.ok or result.kind in ignore:
        return None
    return failure(result.fact, run, result.culprits, runs)


def _args(record: Record) -> str:
    shown = []
    for name, value in record.args.items():
        if name == "lease":
            value = f"lease of {getattr(value, 'group_id', '?')!r} token {getattr(value, 'token', '?')!r}"
            shown.append(value)
        else:
            shown.append(f"{name}={value!r}")
    return ", ".join(shown)


def check_program(
    factory: Callable,
    program: Program,
    capabilities: Capabilities | None = None,
    *,
    is_async: bool = False,
    repeats: int = 30,
    contention: bool = False,
    processes: Any = None,
    ignore: frozenset[str] = frozenset(),
    reached: collections.Counter | None = None,
    histories: bool | None = None,
    alternate: bool = False,
    overlap: bool = True,
) -> int:
    """Run ``program`` up to ``repeats`` times; raise :class:`ConcurrencyFailure` at the first
    run the checker refuses (facts of the kinds in ``ignore`` aside), judged for
    refusals (``contention``), histories (``histories``, by default ``not contention``) or
    both.  Returns the number of runs made (all passed).  ``reached`` counts the runs whose
    branches overlapped (:data:`~harel_ref.stateful._properties.OVERLAP`).

    ``processes``: a :class:`~harel_ref.stateful._processes.BranchProcesses` pool to run the
    branches in; with ``alternate``, only every other run does (the first), and the others run
    them in threads (tasks).  Each finds races the other misses: threads share a connection
    lock and the GIL, processes are woken at once but open their transports every run
    (docs/concurrency.md measures both).  Runs that wait more than they compute are made
    several at once and judged in their order (:mod:`~harel_ref.stateful._lanes`), unless not
    ``overlap``; what only such a run showed (a refusal, an exception) is believed only if the
    runs made again one at a time show it."""
    histories = not contention if histories is None else histories
    if inspect.iscoroutinefunction(factory):
        is_async = True
    capabilities = capabilities if capabilities is not None else Capabilities()
    in_processes = (lambda number: processes is not None and not (alternate and number % 2 == 0))
    make = _run_maker(factory, program, capabilities, is_async, processes, in_processes, ignore)

    # runs that wait overlap (SPEC.md C9a): the second, its branches in threads, says whether they wait
    lanes = lanes_of_runs(repeats, wall=capabilities.clock == "wall") if overlap else 1
    made = runs_in_order(make, lambda bench: bench and bench.close(), repeats,
                         here=lambda number: not in_processes(number), lanes=lanes)
    try:
        with contextlib.closing(made):
            for number, run, alone in made:
                if reached is not None:
                    largest(reached, BRANCHES_IN_A_PROGRAM, len(program.branches))
                    if overlapped(run.records):
                        reached[OVERLAP] += 1
                found = judge(run, contention=contention, histories=histories, runs=number, ignore=ignore,
                              capabilities=capabilities, reached=reached)
                if found is not None and found.kind in REFUSALS:
                    if not alone:
                        raise SeenBeside(f"run {number}, made beside others, was refused")
                    found = _refused_alone(factory, program, capabilities, is_async, found, run, number, ignore,
                                           histories)
                if found is not None:
                    raise found
    except SeenBeside:
        # What only a run beside others showed may be theirs (a server's limits are the
        # server's, not the namespace's): the runs again, one at a time, say.
        return check_program(factory, program, capabilities, is_async=is_async, repeats=repeats,
                             contention=contention, processes=processes, ignore=ignore, reached=reached,
                             histories=histories, alternate=alternate, overlap=False)
    return repeats


def _run_maker(factory: Callable, program: Program, capabilities: Capabilities, is_async: bool, processes: Any,
               in_processes: Callable[[int], bool], ignore: frozenset[str]) -> Callable:
    """``make(number, bench)`` for :func:`~harel_ref.stateful._lanes.runs_in_order`: run
    ``program`` once on ``bench`` (a new one if None), its branches in ``processes`` when
    ``in_processes(number)``; the run, and the bench if the next run may keep it."""
    def make(number: int, bench: Bench | None) -> tuple[Run, Bench | None]:
        bench = bench or Bench(factory, capabilities, is_async)
        try:  # the branch processes make one run's prefix and branches at a time (BranchProcesses.turn)
            run = run_program(factory, program, capabilities, is_async=is_async,
                              processes=processes if in_processes(number) else None, bench=bench)
        except BaseException:
            bench.close()
            raise
        # The next run on a queue surely empty (Bench); with a rule of the model left out
        # (a kind ignored), the drain may have left anything.  Refusals relax nothing.
        if (ignore - REFUSALS) or not _left_empty(run):
            bench.close()
            return run, None
        return run, bench

    return make


def failing_runs(factory: Callable, program: Program, capabilities: Capabilities | None = None, *, runs: int,
                 enough: int, until: float, checkpoint: Callable[[], None] = lambda: None,
                 **judging: Any) -> tuple[int, int]:
    """How often ``program`` shows its race: of up to ``runs`` runs, judged as
    :func:`check_program` judges them (``judging`` its keyword arguments), how many the checker
    refused, and how many were made.  It stops once ``enough`` were refused, or at ``until``
    (``time.monotonic()``), at least ten runs made; a run that raised past the checker ends it.
    ``checkpoint`` is called before each ten runs (a stop raises there).  A race found by a
    search comes out of shrinking with the runs that happened to show it, so only runs made
    afresh say how rare it is."""
    refused = made = 0
    while made < runs and refused < enough and (made < 10 or time.monotonic() < until):
        checkpoint()
        try:
            made += check_program(factory, program, capabilities, repeats=min(10, runs - made), **judging)
        except ConcurrencyFailure as found:
            refused, made = refused + 1, made + found.runs
        except Exception:  # noqa: BLE001 - a crash is another failure than this race: what was seen stands
            break
    return refused, made


def overlapped(records: list[Record]) -> bool:
    """Whether calls of two different branches were under way at the same moment (a call whose
    answer never came is under way until the end)."""
    calls = sorted((r.invoke, math.inf if r.complete is None else r.complete, r.worker)
                   for r in records if r.worker not in ("prefix", DRAIN_WORKER))
    for (_, end, worker), (start, _, other) in itertools.combinations(calls, 2):
        if start < end and worker != other:
            return True
    return False


def _refused_alone(factory, program, capabilities, is_async, found: ConcurrencyFailure, run: Run, number: int,
                   ignore: frozenset[str], histories: bool) -> ConcurrencyFailure | None:
    """What a refusal ``found`` in ``run`` is once the branches run one after another: a claim
    that passed over a group and does so without a race too shows that history's failure; an
    error that comes again without concurrency is no refusal (module docstring): from an ack or
    nack of a stale lease it is ``stale-raised``, else the run is judged on its history."""
    if found.kind == facts.NONE_UNDER_CONTENTION:
        return _history_alone(factory, program, capabilities, is_async, ignore) or found
    again = _also_alone(factory, program, capabilities, is_async, found)
    if again is None:
        return found
    alone, record = again
    if (surely_stale(record, alone.records, capabilities.acks) and facts.STALE_RAISED not in ignore
            and capabilities.acks != "by-seq"):
        return _stale_release(alone, [record], number)
    return history_failure(run, number, ignore, capabilities) if histories else None


def _history_alone(factory, program, capabilities, is_async, ignore) -> ConcurrencyFailure | None:
    """The failure a history shows when the branches of ``program`` run one after another
    (three tries), or None: a claim that passes over a claimable group with no race at all is
    that history's failure, not contention."""
    for _ in range(3):
        alone = run_program(factory, program, capabilities, is_async=is_async, concurrently=False)
        if (shown := history_failure(alone, 1, ignore, capabilities)) is not None:
            return shown
    return None


def _also_alone(factory, program, capabilities, is_async, found: ConcurrencyFailure) -> tuple[Run, Record] | None:
    """The run, and its call, showing that the error of ``found`` also comes when the
    branches run one after another: the same call (branch and op) raising the same error
    (paths and numbers aside), or an ack or nack of a surely stale lease raising it, the
    branches in any order (a branch that claims the message again, or releases a shared
    lease, going first).  None if it does not come."""
    seen = {(r.worker, r.op, _error_kind(r.error)) for r in found.culprits}
    releases = {_error_kind(r.error) for r in found.culprits if r.op in ("ack", "nack")}
    orders = list(itertools.permutations(range(len(program.branches))))
    # The branches in their order three times, then (for a release's error) in every other order once.
    for order in [orders[0]] * 3 + (orders[1:] if releases else []):
        alone = run_program(factory, _in_order(program, order), capabilities, is_async=is_async, concurrently=False)
        for record in alone.records:
            if record.error is None:
                continue
            kind = _error_kind(record.error)
            if (order == orders[0] and (record.worker, record.op, kind) in seen) or (
                    kind in releases and surely_stale(record, alone.records)):
                return alone, record
    return None


def _in_order(program: Program, order: Sequence[int]) -> Program:
    """``program`` with its branches in ``order`` (the leases of each renamed for its place)."""
    if list(order) == list(range(len(program.branches))):
        return program
    place = {old: new for new, old in enumerate(order)}

    def renamed(op: Op) -> Op:
        if isinstance(op, (Ack, Nack)) and (found := re.fullmatch(r"b(\d+)\.(.*)", op.lease)):
            return dataclasses.replace(op, lease=f"b{place[int(found[1])]}.{found[2]}")
        return op

    return Program(program.prefix, tuple(tuple(renamed(op) for op in program.branches[old]) for old in order))


def _error_kind(error: str) -> str:
    """An error without what changes from run to run: quoted names (paths) and numbers."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", error)
