"""A soak: several workers run a random workload against the wall clock, then the history is
judged against the model.

Where the parallel search (:mod:`harel_ref.stateful.parallel`) runs short programs at a frozen clock, a
soak runs for ``seconds`` with real time passing: leases of 20 to 100 ms lapse while workers
still hold them, parked messages come back, stale acks race with new claims.  Every call is
recorded (:mod:`harel_ref.stateful.history`) with the wall-clock moments it was invoked and answered, so
the model allows whatever is consistent with some moment in between (SPEC.md R18).  At the end
the queue is drained, and the history is judged twice:

- by :func:`~harel_ref.stateful.check_linearizable`, partitioned by group (fairness left out, R19): this
  is what catches a claim during a park, a claim that answered None while a group was
  claimable, and the rest of what the model knows;
- by :func:`harel_ref.stateful.history.check`: overlapping leases, FIFO breaks, lost, duplicated and
  redelivered messages, each reported in its own words.

A call that raised, or did not return within two minutes, shows ``raised-under-contention``:
nothing here is a fault, so a worker that gets an error got it because others ran at the
same time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ._async import open_transport
from ._backend import Capabilities
from ._machine import Choices
from ._linearize import DRAIN_WORKER, Linearizability
import harel_ref.stateful._facts as facts
from ._facts import Fact
from ._record import error_text
from .history import HistoryReport, Record, _jsonable, check
from . import parallel
from .parallel import ConcurrencyFailure, Run, _together, close_all

__all__ = ["SoakResult", "soak"]

GROUPS = tuple(f"g{n}" for n in range(16))
VISIBILITIES = (0.02, 0.05, 0.1)
DELAYS = (0.01, 0.05)
SETTLE = 0.3
"""Seconds waited after the workers stop, so that every lease and park has lapsed before the
drain (longer than any visibility or delay above)."""


@dataclasses.dataclass(frozen=True)
class _Choices:
    """The groups and durations of a soak, for the transport's capabilities: the ids it accepts
    (the machine's when none of ``GROUPS`` is), and durations rounded up to whole multiples of
    its resolution, waited out in full before the drain."""

    groups: tuple[str, ...]
    visibilities: tuple[float, ...]
    delays: tuple[float, ...]
    settle: float

    @classmethod
    def of(cls, caps: Capabilities) -> _Choices:
        groups = tuple(g for g in GROUPS if caps.accepts_group_id(g)) or Choices.of(caps).groups
        r = caps.resolution
        if not r:
            return cls(groups, VISIBILITIES, DELAYS, SETTLE)
        visibilities = tuple(sorted({math.ceil(v / r) * r for v in VISIBILITIES}))
        delays = tuple(sorted({math.ceil(d / r) * r for d in DELAYS}))
        return cls(groups, visibilities, delays, max(visibilities + delays) * 1.5 + SETTLE)

class SoakResult:
    """What a soak recorded (``run``, and ``drained``: the ``(group_id, event)`` pairs the
    final drain found) and what the checkers make of it (``history``, judged on first read)."""

    def __init__(self, run: Run, drained: list[tuple[str, str]], seconds: float,
                 capabilities: Capabilities = Capabilities()) -> None:
        self.run = run
        self.drained = drained
        self.seconds = seconds
        self.capabilities = capabilities

    @functools.cached_property
    def history(self) -> HistoryReport:
        caps = self.capabilities
        return check(self.run.records, self.drained, acks=caps.acks, acks_answer=caps.protocol != "harel",
                     uncertain_steps=UNCERTAIN_STEPS)

    @property
    def linearizability(self) -> Linearizability:
        return self.history.linearizability

    @property
    def records(self) -> tuple[Record, ...]:
        return self.run.records

    @property
    def errors(self) -> list[Record]:
        """The workers' calls that raised or never returned."""
        return [r for r in self.records if r.worker != DRAIN_WORKER and (r.error is not None or r.complete is None)]

    def failures(self) -> list[ConcurrencyFailure]:
        """One failure per kind of fact seen, the first of each: errors, then the model's
        verdict, then the history checks."""
        found: dict[str, ConcurrencyFailure] = {}

        def add(fact: Fact, culprits) -> None:
            if fact.kind not in found:
                found[fact.kind] = parallel.failure(fact, self.run, culprits, 1)

        stale = [r for r in self.errors if r.error is not None and self.capabilities.acks != "by-seq"
                 and parallel.surely_stale(r, self.records, self.capabilities.acks)]
        if stale:  # an error for a lease that was no longer current: R10 asks for False
            add(Fact(facts.STALE_RAISED, f"{stale[0].worker}: {stale[0].op} of a stale lease during the soak",
                     "False (nothing, under harel's Protocol), without an error (R10)", stale[0].error), stale[:3])
        if errors := [r for r in self.errors if r not in stale]:
            first = errors[0]
            answered = first.error if first.error is not None else f"no answer within {parallel.HUNG:g} s"
            add(Fact(facts.RAISED_UNDER_CONTENTION, f"{first.worker}: {first.op} during the soak", "an answer",
                     answered), errors[:3])
        if (fact := self.linearizability.fact) is not None:
            add(fact, self.linearizability.culprits)
        for violation in self.history.violations:
            if violation.kind in facts.KINDS:  # "model": the verdict above says it
                add(Fact(violation.kind, str(violation), "no such breach", violation.kind), violation.records)
        return list(found.values())


UNCERTAIN_STEPS = 200_000
"""Steps the model check may take on a group of the soak's history that holds a call that
raised or never returned (about 2 s): each may have taken effect at any moment after it began,
or never (R17), so the orders to try multiply with every one, and a group of a few hundred calls
could take the default 2,000,000 steps, a minute, to give up.  Such a group is left undecided
while the others are judged (:func:`~harel_ref.stateful.check_linearizable`); a group whose
calls all answered gets the default steps."""


CHECK_EVERY = 0.2
"""Seconds between two calls of a soak's ``checkpoint``."""


async def _watched(work: Awaitable[None], checkpoint: Callable[[], None]) -> None:
    """Await ``work``, calling ``checkpoint`` every :data:`CHECK_EVERY` seconds meanwhile."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=CHECK_EVERY)
            checkpoint()
        task.result()
    finally:
        task.cancel()


def soak(
    factory: Callable,
    capabilities: Capabilities | None = None,
    seconds: float = 10.0,
    *,
    workers: int = 4,
    is_async: bool = False,
    seed: int = 0,
    calls: int | None = None,
    checkpoint: Callable[[], None] = lambda: None,
) -> SoakResult:
    """Run ``workers`` workers for ``seconds`` on a fresh namespace (threads, or tasks for an
    asyncio transport), then drain the queue; the history is judged when the result's
    ``history`` is first read.  ``calls`` stops the workers sooner, once they have made that
    many calls between them (for benchmarks).  ``checkpoint`` is called every
    :data:`CHECK_EVERY` seconds while the workers run: what it raises stops the soak (the
    certifier's check for a stop signal)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if workers < 2:
        raise ValueError(f"a soak needs at least 2 workers, got {workers}")
    capabilities = capabilities if capabilities is not None else Capabilities()
    started = time.time()
    namespace = f"ns_{uuid.uuid4().hex[:12]}"
    loop = asyncio.new_event_loop() if is_async else None
    opened: list[Any] = []

    def open_one() -> Any:
        opened.append(open_transport(factory, time.time, namespace, loop, capabilities.protocol))
        return opened[-1]

    try:
        first = open_one()
        instances = [open_one() for _ in range(workers)] if capabilities.shared else [first] * workers
        deadline = time.time() + seconds
        budget = _Budget(calls)
        stuck: dict[int, list[Record]] = {}  # the records of workers still in a call at the end
        choices = _Choices.of(capabilities)
        workloads = [_Workload(f"s{n}", random.Random(seed * 1000 + n), capabilities.parking, budget, choices)
                     for n in range(workers)]
        if is_async:
            _run_in_tasks(loop, workloads, instances, deadline, seconds + parallel.HUNG, checkpoint)
            how = f"{workers} tasks for {seconds:g} s"
        else:
            stuck = _run_in_threads(workloads, instances, deadline, checkpoint)
            how = f"{workers} threads for {seconds:g} s"
        time.sleep(choices.settle)
        drain = _Workload(DRAIN_WORKER, random.Random(seed), capabilities.parking)
        drained = drain.drain(first, limit=sum(w.published for w in workloads))
        records = [r for w in workloads for r in stuck.get(id(w), w.records)] + drain.records
    finally:
        close_all(opened, loop)
    records.sort(key=lambda r: r.invoke)
    return SoakResult(Run(None, tuple(records), how + f", {len(records)} calls"), drained, time.time() - started,
                      capabilities)


def _run_in_tasks(loop: asyncio.AbstractEventLoop, workloads: list[_Workload], instances: list[Any],
                  deadline: float, timeout: float, checkpoint: Callable[[], None]) -> None:
    """Run each workload as a task on ``loop`` (an asyncio transport) until ``deadline``,
    calling ``checkpoint`` every :data:`CHECK_EVERY` seconds; a TimeoutError if they have not
    all finished within ``timeout`` seconds."""
    loop.run_until_complete(_watched(_together(
        (w.run_async(instance.transport, deadline) for w, instance in zip(workloads, instances)),
        timeout=timeout,
    ), checkpoint))


def _run_in_threads(workloads: list[_Workload], instances: list[Any], deadline: float,
                    checkpoint: Callable[[], None]) -> dict[int, list[Record]]:
    """Run each workload in a thread of its own until ``deadline``, calling ``checkpoint``
    every :data:`CHECK_EVERY` seconds while waiting for them.  A thread still in a call
    :data:`parallel.HUNG` seconds after the deadline is left behind (a daemon); returns, by
    ``id`` of its workload, a copy of what it had recorded then, its unanswered call included."""
    stuck: dict[int, list[Record]] = {}
    threads = [threading.Thread(target=w.run, args=(instance, deadline), daemon=True)
               for w, instance in zip(workloads, instances)]
    for thread in threads:
        thread.start()
    for thread in threads:  # a worker still in a call by then: see SoakResult.errors
        while thread.is_alive() and time.time() < deadline + parallel.HUNG:
            thread.join(min(CHECK_EVERY, max(0.0, deadline + parallel.HUNG - time.time())))
            checkpoint()
    for workload, thread in zip(workloads, threads):
        if thread.is_alive():  # what it recorded so far, unanswered call included
            stuck[id(workload)] = [dataclasses.replace(record) for record in workload.records]
    return stuck


class _Budget:
    """How many calls the workers may still make between them (None: no limit)."""

    def __init__(self, calls: int | None) -> None:
        self._left = calls
        self._lock = threading.Lock()

    def take(self) -> bool:
        if self._left is None:
            return True
        with self._lock:
            self._left -= 1
            return self._left >= 0


class _Workload:
    """One worker's random calls: publish, claim, then ack, nack, park, or hold past the
    lease and ack late (a stale ack, which fencing refuses if someone took over)."""

    def __init__(self, name: str, rng: random.Random, parking: bool, budget: _Budget | None = None,
                 choices: _Choices = _Choices(GROUPS, VISIBILITIES, DELAYS, SETTLE)) -> None:
        self.name = name
        self.choices = choices
        self.budget = budget if budget is not None else _Budget(None)
        self.rng = rng
        self.parking = parking
        self.records: list[Record] = []
        self.published = 0
        self.held: list[Any] = []

    def _start(self, op: str, **args: Any) -> Record:
        record = Record(self.name, op, time.time(), _jsonable(args))
        self.records.append(record)
        return record

    @staticmethod
    def _finish(record: Record, answer: Any = None, error: BaseException | None = None) -> Any:
        record.complete = time.time()
        if error is None:
            record.result = _jsonable(answer)
        else:
            record.error = error_text(error)
        return answer

    def _next(self) -> tuple[str, tuple[Any, ...], float]:
        """The next call: its name, its arguments, and how long to wait before making it."""
        rng = self.rng
        if self.held and rng.random() < 0.7:
            lease, visibility = self.held.pop(0)
            roll = rng.random()
            pause = visibility * 1.2 if roll < 0.03 else 0.0  # held past its end: a stale ack
            if roll < 0.65:
                return "ack", (lease,), pause
            if roll < 0.85 or not self.parking:
                return "nack", (lease, 0.0), pause
            return "nack", (lease, rng.choice(self.choices.delays)), pause
        if rng.random() < 0.2:
            self.published += 1
            return "publish", (rng.choice(self.choices.groups), f"{self.name}-{self.published}"), 0.0
        return "claim", (self.name, rng.choice(self.choices.visibilities)), 0.0

    def _record(self, op: str, args: tuple[Any, ...]) -> Record:
        names = {"publish": ("group_id", "event"), "claim": ("worker_id", "visibility"),
                 "ack": ("lease",), "nack": ("lease", "delay")}[op]
        return self._start(op, **dict(zip(names, args)))

    def _answered(self, op: str, args: tuple[Any, ...], answer: Any) -> None:
        if op == "claim" and answer is not None and self.rng.random() >= 0.03:
            self.held.append((answer, args[1]))  # else abandoned: it lapses, someone takes over

    def run(self, transport: Any, deadline: float) -> None:
        while time.time() < deadline and self.budget.take():
            op, args, pause = self._next()
            time.sleep(pause)
            record = self._record(op, args)
            try:
                answer = getattr(transport, op)(*args)
            except Exception as exc:
                self._finish(record, error=exc)
                continue
            self._answered(op, args, self._finish(record, answer))

    async def run_async(self, transport: Any, deadline: float) -> None:
        while time.time() < deadline and self.budget.take():
            op, args, pause = self._next()
            await asyncio.sleep(pause)
            record = self._record(op, args)
            try:
                answer = await getattr(transport, op)(*args)
            except Exception as exc:
                self._finish(record, error=exc)
                continue
            self._answered(op, args, self._finish(record, answer))

    def drain(self, transport: Any, limit: int) -> list[tuple[str, str]]:
        """Claim and ack until None, at most ``limit`` + 1 messages; the (group, event) pairs."""
        drained = []
        for _ in range(limit + 2):
            record = self._start("claim", worker_id=DRAIN_WORKER, visibility=60.0)
            lease = self._finish(record, transport.claim(DRAIN_WORKER, 60.0))
            if lease is None:
                break
            drained.append((lease.group_id, lease.event))
            record = self._start("ack", lease=lease)
            self._finish(record, transport.ack(lease))
        return drained
