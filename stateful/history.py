"""A history checker for real concurrency: record what workers did, then judge it.

The lockstep machine drives one step at a time against a fake clock.  Real workers (threads,
processes, faults) overlap in time, so their calls are *recorded* instead, each with the time
it was invoked and the time its answer came back, and checked afterwards::

    history = History("histories/w1.jsonl")          # one file per process (optional)
    queue = RecordingTransport(transport, history, worker="w1")
    queue.publish("g", "e1")                         # recorded: invoke, complete, args, result
    lease = queue.claim("w1", visibility=0.2)
    ...
    drained = drain(fresh_transport)                 # after every lease and park has lapsed
    report = check(load("histories/"), drained)
    assert report.ok, report

Times must come from the clock the transport uses (``time.time`` by default), on one host.

What ``check`` reports (each a list of :class:`Violation` in the :class:`HistoryReport`):

- ``overlaps``: two leases on one group whose *surely held* windows overlap.  A lease is surely
  held from its claim's **completion** (before that, the claim may not have happened yet) until
  the **earlier** of its first ack/nack **invocation** (the worker gave it up) and its claim's
  **invocation** + visibility (the lease was taken no earlier, so it lapsed no later).  These
  windows are short of the true ones, so an overlap is a real breach of "one message per group
  in flight", never a timing artefact.
- ``fifo_breaks``: in one group, ``a`` published before ``b`` (a's publish completed before b's
  was invoked) but the delivery of ``b`` that was acked completed before the ack of ``a`` was
  invoked; or ``b`` was acked while ``a`` was still left at the drain; or the drain gave them
  out of order.
- ``lost``: a publish that completed, never acked (no ack that succeeded, and none that failed
  or went unanswered and so might have acted) and not left at the drain.
- ``duplicates``: a message acked successfully more than once, or drained more than once.
- ``unexpected``: a delivered or drained message that nobody published.
- ``redelivered``: a message delivered by a claim invoked after a successful ack of it had
  completed, or left at the drain after a successful ack.
- ``model``: the history is not linearizable against the model (SPEC.md R19,
  :func:`harel_ref.stateful.check_linearizable`, partitioned by group, each call placed at some moment
  between its invocation and its answer): this is what catches a claim during a park, a claim
  that answered None while a group was claimable, an ack that acted for a superseded lease,
  and the rest of what the model knows.  ``report.linearizability`` has the checker's answer.
  Records of the worker ``"drain"`` (a recorded final drain) are judged by the model only.

Messages are identified by ``(group_id, event)``: publish unique events.  Histories from several
processes are merged by :func:`load` (one JSON-lines file per process; a call whose answer never
came, e.g. the process was killed, has ``complete=None`` and counts as "may have happened").
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harel_ref.transport import Lease, OutcomeUnknownError

from ._linearize import DRAIN_WORKER, check_linearizable
from ._record import Record, error_text

__all__ = [
    "Call",
    "History",
    "HistoryReport",
    "Record",
    "RecordingTransport",
    "Violation",
    "check",
    "drain",
    "load",
]

Message = tuple[str, str]  # (group_id, event)


class Call:
    """A call in progress, returned by :meth:`History.invoke`: finish it with one of its methods."""

    def __init__(self, history: History, record: Record) -> None:
        self._history = history
        self.record = record

    def complete(self, result: Any = None) -> None:
        self._history._finish(self.record, result=_jsonable(result))

    def fail(self, error: BaseException | str) -> None:
        self._history._finish(self.record, error=error if isinstance(error, str) else error_text(error, repr(error)))


class History:
    """The calls of one process, in memory and, given ``path``, appended to a JSON-lines file.

    Each call writes one line when invoked and one when it completes, so the invocation of a
    call cut short by a crash is still on disk.  Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.records: list[Record] = []
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:12]
        self._file = open(path, "a", encoding="utf-8") if path is not None else None

    def invoke(self, worker: str, op: str, *, at: float | None = None, **args: Any) -> Call:
        """Record that ``worker`` starts ``op(**args)`` now; ``at`` is the transport's clock
        if it is frozen (else the call happened at some moment between invoke and complete)."""
        record = Record(worker, op, self._clock(), _jsonable(args), id=f"{self._prefix}-{next(self._ids)}", at=at)
        with self._lock:
            self.records.append(record)
            line = {"id": record.id, "worker": worker, "op": op, "invoke": record.invoke, "args": record.args}
            if at is not None:
                line["at"] = at
            self._write(line)
        return Call(self, record)

    @contextmanager
    def record(self, worker: str, op: str, **args: Any) -> Iterator[Call]:
        """``with history.record(w, "ack", lease=l) as call: call.complete(queue.ack(l))``;
        an exception leaving the block is recorded as the call's error, then re-raised."""
        call = self.invoke(worker, op, **args)
        try:
            yield call
        except BaseException as exc:
            if call.record.complete is None:
                call.fail(exc)
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _finish(self, record: Record, *, result: Any = None, error: str | None = None) -> None:
        complete = self._clock()
        with self._lock:
            record.complete, record.result, record.error = complete, result, error
            line = {"id": record.id, "complete": complete, "result": result}
            if error is not None:
                line["error"] = error
            self._write(line)

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()


def load(*sources: str | os.PathLike[str] | Iterable[Record]) -> list[Record]:
    """Merge histories: JSON-lines files, directories of ``*.jsonl`` files, or lists of records.

    A call whose completion line is missing keeps ``complete=None`` (its outcome is unknown).
    """
    records: list[Record] = []
    for source in sources:
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            for file in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
                records.extend(_read_jsonl(file))
        else:
            records.extend(source)
    return sorted(records, key=lambda record: record.invoke)


def _read_jsonl(path: Path) -> list[Record]:
    calls: dict[str, Record] = {}
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a line cut by a kill: that call was not recorded
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if "invoke" in entry:
            calls[entry["id"]] = Record(
                entry["worker"], entry["op"], entry["invoke"], entry["args"], id=entry["id"], at=entry.get("at")
            )
        elif entry["id"] in calls:  # a completion line
            record = calls[entry["id"]]
            record.complete, record.result, record.error = entry["complete"], entry["result"], entry.get("error")
    return list(calls.values())


_LEASE_FIELDS = ("group_id", "event", "seq", "token")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Lease):
        return asdict(value)
    if all(hasattr(value, name) for name in _LEASE_FIELDS):  # a third party's lease
        return {name: _jsonable(getattr(value, name)) for name in _LEASE_FIELDS}
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


# --- Recording a transport ------------------------------------------------------------------


class RecordingTransport:
    """A synchronous transport whose every call is recorded in ``history`` as ``worker``."""

    def __init__(self, transport: Any, history: History, worker: str) -> None:
        self.transport = transport
        self.history = history
        self.worker = worker

    def _call(self, op: str, method: Callable[..., Any], **args: Any) -> Any:
        with self.history.record(self.worker, op, **args) as call:
            result = method(**args)
            call.complete(result)
            return result

    def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        self._call("publish", self.transport.publish, group_id=group_id, event=event,
                   priority=priority, routing_key=routing_key)

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys=None) -> Lease | None:
        return self._call("claim", self.transport.claim, worker_id=worker_id, visibility=visibility,
                          min_priority=min_priority, routing_keys=routing_keys)

    def ack(self, lease: Lease) -> bool:
        return self._call("ack", self.transport.ack, lease=lease)

    def nack(self, lease: Lease, delay: float = 0) -> bool:
        return self._call("nack", self.transport.nack, lease=lease, delay=delay)

    def close(self) -> None:
        self.transport.close()


UNKNOWN_TRIES = 5
"""How many calls of one :func:`drain` may end with an unknown outcome before it gives up."""


def drain(transport: Any, *, worker: str = "drain", visibility: float = 60.0,
          lapse: Callable[[], None] | None = None) -> list[Message]:
    """Claim and ack everything claimable; the ``(group_id, event)`` pairs, in delivery order.

    Call it once every lease and park has lapsed, or what they hold is not drained.
    ``lapse()``, given, moves the transport's clock past ``visibility`` (and may wait for a
    server to settle): a call whose outcome is unknown (:class:`OutcomeUnknownError`, a cluster
    that lost its leader mid-call) is then tried again after it, up to :data:`UNKNOWN_TRIES`
    such calls in all.  The lease an unknown claim may have taken lapses first.  A message
    whose ack's outcome is unknown was left at the drain all the same: it is counted once,
    and if the ack did not act, its next claim is acked and not counted again.
    """
    drained: list[Message] = []
    unsure: set[tuple[str, Any]] = set()  # messages counted whose ack may not have acted
    unknown = 0
    while True:
        try:
            lease = transport.claim(worker, visibility)
            if lease is None:
                return drained
            message = (lease.group_id, getattr(lease, "seq", lease.event))
            if message in unsure:
                unsure.discard(message)
            else:
                drained.append((lease.group_id, lease.event))
                unsure.add(message)  # until its ack answers
            if transport.ack(lease) is not True:  # nobody else works now: a False ack is a bug
                raise AssertionError(f"drain: the ack of a fresh lease returned False: {lease!r}")
            unsure.discard(message)
        except OutcomeUnknownError:
            unknown += 1
            if lapse is None or unknown > UNKNOWN_TRIES:
                raise
            lapse()


# --- The checker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One breach of the contract, with the records that show it."""

    kind: str
    group_id: str
    detail: str
    records: tuple[Record, ...] = ()

    def __str__(self) -> str:
        return f"[{self.kind}] group {self.group_id!r}: {self.detail}"


@dataclass
class HistoryReport:
    """What :func:`check` found; ``ok`` when every list is empty."""

    overlaps: list[Violation] = field(default_factory=list)
    fifo_breaks: list[Violation] = field(default_factory=list)
    lost: list[Violation] = field(default_factory=list)
    duplicates: list[Violation] = field(default_factory=list)
    unexpected: list[Violation] = field(default_factory=list)
    redelivered: list[Violation] = field(default_factory=list)
    model: list[Violation] = field(default_factory=list)
    calls: int = 0
    linearizability: Any = None  # the model checker's answer (a stateful.Linearizability)

    @property
    def violations(self) -> list[Violation]:
        return [*self.overlaps, *self.fifo_breaks, *self.lost, *self.duplicates, *self.unexpected,
                *self.redelivered, *self.model]

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self, most: int = 20) -> str:
        if self.ok:
            return f"history of {self.calls} calls: no violations"
        found = self.violations
        lines = [f"history of {self.calls} calls: {len(found)} violation(s)"]
        lines += [f"  {violation}" for violation in found[:most]]
        if len(found) > most:
            lines.append(f"  ... and {len(found) - most} more")
        return "\n".join(lines)


@dataclass
class _Lease:
    claim: Record
    token: str
    message: Message
    releases: list[Record] = field(default_factory=list)  # acks and nacks naming its token

    @property
    def start(self) -> float:
        return self.claim.complete

    @property
    def end(self) -> float:
        ends = [self.claim.invoke + self.claim.args["visibility"]]
        ends += [release.invoke for release in self.releases]
        return min(ends)


def check(records: Iterable[Record], drained: Iterable[Message] = (), *, acks: str = "fenced",
          acks_answer: bool = True, uncertain_steps: int | None = None) -> HistoryReport:
    """Judge a history (see the module docstring) given what a final :func:`drain` returned.

    ``acks``, ``acks_answer`` and ``uncertain_steps`` are as for
    :func:`~harel_ref.stateful.check_linearizable`; an ack that answered None under harel's Protocol
    (``acks_answer=False``) may have removed its message."""
    everything = list(records)
    records = [record for record in everything if record.worker != DRAIN_WORKER]
    drained = [tuple(message) for message in drained]
    report = HistoryReport(calls=len(everything))
    _check_model(report, everything, acks, acks_answer, uncertain_steps)
    publishes = _publishes(records)
    leases, acked, maybe_acked = _leases_and_acks(records, acks_answer)
    _check_overlaps(report, leases.values())
    _check_fifo(report, publishes, leases, acked, drained)
    drained_count: dict[Message, int] = defaultdict(int)
    for message in drained:
        drained_count[message] += 1
    _check_lost_and_duplicated(report, publishes, acked, maybe_acked, drained_count)
    _check_unexpected_and_redelivered(report, publishes, leases, acked, drained_count)
    return report


def _check_model(report: HistoryReport, everything: list[Record], acks: str, acks_answer: bool,
                 uncertain_steps: int | None) -> None:
    """The model's verdict on the whole history, drain included (partitioned by group), as
    ``report.linearizability``, and as a violation unless it passed."""
    report.linearizability = check_linearizable(everything, partition=True, acks=acks, acks_answer=acks_answer,
                                                uncertain_steps=uncertain_steps)
    if report.linearizability.ok is False:
        culprits = report.linearizability.culprits
        group = _group_of(culprits[0]) if culprits else ""
        report.model.append(Violation("model", group, str(report.linearizability), culprits))
    elif report.linearizability.ok is None:  # the search gave up: not a pass
        report.model.append(Violation("undecided", "", str(report.linearizability)))


def _publishes(records: list[Record]) -> dict[Message, Record]:
    """Each message's publish; a ValueError if a message was published twice."""
    publishes: dict[Message, Record] = {}
    for record in (r for r in records if r.op == "publish"):
        message = (record.args["group_id"], record.args["event"])
        if message in publishes:
            raise ValueError(f"the checker identifies messages by (group_id, event); {message!r} was published twice")
        publishes[message] = record
    return publishes


def _leases_and_acks(
    records: list[Record], acks_answer: bool
) -> tuple[dict[str, _Lease], defaultdict[Message, list[Record]], set[Message]]:
    """The leases the claims took (by token, each with the acks and nacks that name it), the
    successful acks of each message, and the messages an ack may have removed without saying
    so (it raised or never answered, or answered None under harel's Protocol)."""
    leases: dict[str, _Lease] = {}
    for record in records:
        if record.op == "claim" and record.ok and record.result is not None:
            lease = record.result
            leases[lease["token"]] = _Lease(record, lease["token"], (lease["group_id"], lease["event"]))
    acked: dict[Message, list[Record]] = defaultdict(list)  # successful acks
    maybe_acked: set[Message] = set()
    for record in records:
        if record.op not in ("ack", "nack"):
            continue
        lease = record.args["lease"]
        if lease["token"] in leases:
            leases[lease["token"]].releases.append(record)
        message = (lease["group_id"], lease["event"])
        if record.op == "ack" and record.ok and record.result is True:
            acked[message].append(record)
        elif record.op == "ack" and not record.did_nothing and (not record.ok or (not acks_answer and record.result is None)):
            # no answer, or an error but StorageError (which changed nothing): it may have acted
            maybe_acked.add(message)
    return leases, acked, maybe_acked


def _check_lost_and_duplicated(report, publishes, acked, maybe_acked, drained_count) -> None:
    """A message published, never acked (surely or maybe) nor left at the drain is lost; one
    acked or drained more than once is duplicated."""
    for message, record in publishes.items():
        if record.ok and not acked[message] and message not in maybe_acked and not drained_count[message]:
            report.lost.append(Violation("lost", message[0], f"{message[1]!r} was published and never acked nor left at the drain", (record,)))
    for message, acks in acked.items():
        if len(acks) > 1:
            report.duplicates.append(Violation("duplicated", message[0], f"{message[1]!r} was acked {len(acks)} times", tuple(acks)))
    for message, count in drained_count.items():
        if count > 1:
            report.duplicates.append(Violation("duplicated", message[0], f"{message[1]!r} was drained {count} times"))


def _check_unexpected_and_redelivered(report, publishes, leases, acked, drained_count) -> None:
    """A message delivered or drained that nobody published is unexpected; one delivered by a
    claim invoked after an ack of it completed, or drained after an ack, is redelivered."""
    for lease in leases.values():
        if lease.message not in publishes:
            report.unexpected.append(Violation("unexpected", lease.message[0], f"{lease.message[1]!r} was delivered but never published", (lease.claim,)))
        earlier_acks = [ack for ack in acked[lease.message] if ack.complete < lease.claim.invoke]
        if earlier_acks:
            report.redelivered.append(Violation(
                "redelivered", lease.message[0],
                f"{lease.message[1]!r} was delivered again to {lease.claim.worker} after it was acked",
                (earlier_acks[0], lease.claim)))
    for message in drained_count:
        if message not in publishes:
            report.unexpected.append(Violation("unexpected", message[0], f"{message[1]!r} was left at the drain but never published"))
        if acked[message]:
            report.redelivered.append(Violation("redelivered", message[0], f"{message[1]!r} was left at the drain after it was acked", tuple(acked[message][:1])))


def _group_of(record: Record) -> str:
    lease = record.args.get("lease") if record.op in ("ack", "nack") else record.result
    if record.op == "publish":
        return record.args.get("group_id", "")
    return (lease.get("group_id") if isinstance(lease, dict) else getattr(lease, "group_id", "")) or ""


def _check_overlaps(report: HistoryReport, leases: Iterable[_Lease]) -> None:
    by_group: dict[str, list[_Lease]] = defaultdict(list)
    for lease in leases:
        if lease.start < lease.end:  # an empty window proves nothing
            by_group[lease.message[0]].append(lease)
    for group_id, windows in by_group.items():
        windows.sort(key=lambda lease: lease.start)
        for i, first in enumerate(windows):
            for second in windows[i + 1:]:
                if second.start >= first.end:
                    break  # sorted by start: no later window overlaps `first` either
                report.overlaps.append(Violation(
                    "overlap", group_id,
                    f"{first.claim.worker} held {first.message[1]!r} over "
                    f"[{first.start:.6f}, {first.end:.6f}] while {second.claim.worker} held "
                    f"{second.message[1]!r} from {second.start:.6f}",
                    (first.claim, second.claim)))


def _check_fifo(report, publishes, leases, acked, drained) -> None:
    """For each message ``b``, the messages ``a`` of its group surely published before it
    (a's publish completed before b's was invoked) must not come out after it.  One pass per
    group in order of publication, keeping the worst earlier ``a`` seen so far: O(n log n)."""
    # For each acked message, the claim that delivered it (the one whose token its ack named).
    acked_delivery: dict[Message, tuple[Record, Record]] = {}
    for message, acks in acked.items():
        lease = leases.get(acks[0].args["lease"]["token"])
        if lease is not None:
            acked_delivery[message] = (lease.claim, acks[0])
    drain_position = {message: i for i, message in reversed(list(enumerate(drained)))}
    by_group: dict[str, list[Message]] = defaultdict(list)
    for message, record in publishes.items():
        if record.ok:
            by_group[message[0]].append(message)
    for group_id, messages in by_group.items():
        by_completion = sorted(messages, key=lambda m: publishes[m].complete)
        latest_ack: Message | None = None  # of the a's so far: the acked one acked last
        queued: Message | None = None  # an a left at the drain and never acked
        last_drained: Message | None = None  # the a drained last
        seen = 0
        for b in sorted(messages, key=lambda m: publishes[m].invoke):
            while seen < len(by_completion) and publishes[by_completion[seen]].complete < publishes[b].invoke:
                a = by_completion[seen]
                seen += 1
                if a in acked_delivery and (latest_ack is None or acked_delivery[a][1].invoke > acked_delivery[latest_ack][1].invoke):
                    latest_ack = a
                if a in drain_position and a not in acked_delivery and queued is None:
                    queued = a
                if a in drain_position and (last_drained is None or drain_position[a] > drain_position[last_drained]):
                    last_drained = a
            why, a = None, None
            if b in acked_delivery:
                claim_b = acked_delivery[b][0]
                if latest_ack is not None and claim_b.complete < acked_delivery[latest_ack][1].invoke:
                    a = latest_ack
                    why = f"{b[1]!r} was delivered (and acked) before {a[1]!r}, published earlier, was acked"
                elif queued is not None:
                    a = queued
                    why = f"{b[1]!r} was acked while {a[1]!r}, published earlier, was still queued"
            elif b in drain_position and last_drained is not None and drain_position[last_drained] > drain_position[b]:
                a = last_drained
                why = f"the drain gave {b[1]!r} before {a[1]!r}, published earlier"
            if why:
                report.fifo_breaks.append(Violation("out-of-order", group_id, why, (publishes[a], publishes[b])))
