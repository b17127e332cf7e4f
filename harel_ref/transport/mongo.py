"""MongoTransport: the queue in MongoDB, fenced and atomic per document, and its asyncio twin
(PyMongo 4; the twin on PyMongo's ``AsyncMongoClient``).

**No multi-document transactions.**  Every change the contract can see is one atomic update
of one *group document*, so the design runs on a standalone MongoDB, on a replica set and on
mongo-java-server alike.  ``docs/mongo.md`` gives the design and its limits at length.

**Collections** (``P`` is the prefix, ``harel`` by default, in database ``harel_ref``)::

    P_groups    one document per group with messages:
                _id (the group id), priority, key (routing key, or None), stamp (the fairness
                stamp, R5), arrival (the seq of the publish that created it: the arrival
                order), life (a random id of this life of the group, R11), queue (the seqs
                of its messages, oldest first), tail (the last of them), holder (a lease's
                token, '__parked__', or None), ends (the end of the lease or park; -1 when
                free), leased (the seq leased).  ``stamp`` and ``ends`` are moments kept
                as the bits of their float (:func:`_moment`), so that they compare exactly
    P_messages  one document per message: _id (its seq), g (its group), e (the event)
    P_counters  {_id: 'seq', value}: the last seq handed out; {_id: 'schema', version}

**Answers are not trusted; filters are.**  mongo-java-server 1.47.0 serializes the stored
document after releasing its lock, so the document a ``find_one_and_update`` (or a find
without a projection) answers can show another caller's later update (a torn answer: its
``queue`` from before, its ``holder`` from after; docs/harel-0.9.md).  What the server
decides under its lock is which documents *match*.  So every write carries its whole condition
in its filter, and its answer is read only from the counts the server returns (matched,
deleted, upserted).  A document read is only a guess of what to ask for: a claim's update asks
for "this life of the group, claimable now, with this head", and when another caller got
there first it matches nothing and the claim looks again.

**Publish** draws a seq from the counter (a compare-and-set on ``P_counters``), inserts the
message, then appends the seq to its group's ``queue`` in one update that also creates the group
if it is gone (an upsert), on the condition that the seq is above the group's ``tail``: a seq
drawn before another publish to the group appended a later one is drawn again, so a group's
queue always increases (R1).  The append is the moment the message is published; a message
whose append never happened is never seen (its document is removed, or stays as garbage if the
process dies in between).

**Claim** finds the first claimable group (``ends < now``, the priority and routing keys asked
for, sorted by ``stamp`` then ``arrival``), reads its head message, and takes the lease with one
update whose filter is that condition again, plus the group's ``life`` and its head's seq.  If
it matches nothing, another caller changed the group in between, and the claim looks again,
now at one of the first few claimable groups, at random, so that claimers who lost a race do
not all run for the same next one.  A head whose message document is missing or names
another group (lost with an in-memory server's data, docs/mongo.md) is dropped by the claim
that meets it.

**Ack** (fenced, R10: ``holder`` is the lease's token and ``leased`` its seq) deletes the group
document if the message is its last (R11), or else pops the head and frees the group, stamping
it with ``now`` (SPEC R5 ``"ack"``, as upstream).  The message's document is removed after:
nothing refers to it any more.  **Nack** is one update of the group: free (R8) or parked until
``now + delay`` (R9).  ``now`` comes from the injected clock: the server's clock is never read.

**Errors** (R17): a server that cannot be reached, or that refuses a request, raises
:class:`StorageError`; a connection lost or a timeout during the update that takes effect
raises :class:`OutcomeUnknownError`.  PyMongo's retryable writes are turned off: a write
retried after its answer was lost would be judged on its second answer.
"""

from __future__ import annotations

import random
import re
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from ._base import (
    PARKED,
    ClockError,
    Clock,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_clock,
    default_clock,
    without_password,
)
from ._shell import AsyncShell, Shell, Steps

__all__ = ["AsyncMongoTransport", "DATABASE", "MongoNames", "MongoTransport", "SCHEMA_VERSION"]

DATABASE = "harel_ref"
"""The database the transports use unless told otherwise."""

SCHEMA_VERSION = 2
"""2: ``stamp`` and ``ends`` hold :func:`_moment` of a time, no longer the float itself."""

_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")

FREE = -1
"""``ends`` of a group nobody holds: before every time a clock can answer (R13 refuses < 0)."""


def _moment(seconds: float) -> int:
    """A time as the 64 bits of its float read as a signed integer: for times >= 0 (R13) the
    integers order as the floats do, and two integers compare exactly on every server.
    mongo-java-server compares two numbers as longs when either is a whole number from 2**31
    on, dropping the other's fraction: there ``2**40 + 1`` stored is not ``$lt``
    ``2**40 + 1 + 2**-10``, so a lapsed lease looked live (SPEC C13's clock at 2**40 found
    it).  0.0 is 0, and :data:`FREE` stays below every moment."""
    return struct.unpack("<q", struct.pack("<d", float(seconds) + 0.0))[0]


class MongoNames(NamedTuple):
    """The collections of one queue."""

    groups: str
    messages: str
    counters: str

    @classmethod
    def named(cls, prefix: str | None = None) -> MongoNames:
        """``<prefix>_groups``, ``_messages`` and ``_counters`` (prefix ``harel`` when None)."""
        if prefix is None:
            prefix = "harel"
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}: {prefix!r:.80}")
        if not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"prefix must be a letter or '_' followed by at most 40 letters, digits or '_' "
                f"(it becomes part of collection names), got {prefix!r:.80}"
            )
        return cls(f"{prefix}_groups", f"{prefix}_messages", f"{prefix}_counters")


# --- The steps: one request each ------------------------------------------------------------


class Find(NamedTuple):
    """The first document matching ``where`` in ``sort`` order, or None."""

    collection: str
    where: dict[str, Any]
    sort: list[tuple[str, int]] | None = None


class FindSome(NamedTuple):
    """The first ``limit`` documents matching ``where`` in ``sort`` order (a list): their
    ``_id``, ``life`` and ``queue``."""

    collection: str
    where: dict[str, Any]
    sort: list[tuple[str, int]]
    limit: int


class Insert(NamedTuple):
    """Insert ``document``: True, or False when its ``_id`` is taken."""

    collection: str
    document: dict[str, Any]


class Update(NamedTuple):
    """Update the document matching ``where``: True if one matched (or ``upsert`` inserted one),
    False if none did or the upsert's ``_id`` is taken.  ``takes_effect``: this update is the
    moment the operation happens, so an answer lost here leaves the outcome unknown (R17)."""

    collection: str
    where: dict[str, Any]
    change: dict[str, Any]
    upsert: bool = False
    takes_effect: bool = True


class Delete(NamedTuple):
    """Delete the document matching ``where``: True if one was.  ``tidy``: it only removes what
    nothing refers to any more, so a failure is ignored (the operation has taken effect)."""

    collection: str
    where: dict[str, Any]
    takes_effect: bool = True
    tidy: bool = False


def _is_duplicate(exc: BaseException) -> bool:
    from pymongo.errors import DuplicateKeyError

    return isinstance(exc, DuplicateKeyError)


RETRY_CANDIDATES = 8
"""How many of the first claimable groups a claim that lost a race chooses from."""


class MongoCore:
    """The four operations as steps (:mod:`harel_ref.transport._shell`)."""

    def __init__(self, names: MongoNames) -> None:
        self.n = names
        self._last_seq = 0  # the counter as this instance last saw it: a guess, checked by the CAS

    def _next_seq(self) -> Steps[int]:
        """Draw a seq: a compare-and-set of the counter from the value last seen."""
        seen = self._last_seq
        while True:
            if seen == 0:
                taken = yield Insert(self.n.counters, {"_id": "seq", "value": 1})
            else:
                taken = yield Update(self.n.counters, {"_id": "seq", "value": seen}, {"$set": {"value": seen + 1}},
                                     takes_effect=False)
            if taken:
                self._last_seq = seen + 1
                return seen + 1
            counter = yield Find(self.n.counters, {"_id": "seq"})
            seen = 0 if counter is None else counter["value"]

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Steps[None]:
        while True:
            seq = yield from self._next_seq()
            if not (yield Insert(self.n.messages, {"_id": seq, "g": group_id, "e": event})):
                continue  # the seq is taken: the counter was set back by hand; draw again
            appended = yield Update(
                self.n.groups,
                {"_id": group_id, "tail": {"$lt": seq}},
                {
                    "$push": {"queue": seq},
                    "$set": {"tail": seq},
                    # a new group (R11): its priority and key are fixed here (R12); its life
                    # tells it from the group of that id before it, or before a restart
                    "$setOnInsert": {"priority": priority, "key": routing_key, "stamp": 0, "arrival": seq,
                                     "life": uuid.uuid4().hex, "holder": None, "ends": FREE, "leased": None},
                },
                upsert=True,
            )
            if appended:
                return None
            # Another publish appended a later seq first: this one would break FIFO.  Draw again.
            yield Delete(self.n.messages, {"_id": seq, "g": group_id}, takes_effect=False)

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Steps[Lease | None]:
        claimable: dict[str, Any] = {"ends": {"$lt": _moment(now)}, "priority": {"$gte": min_priority}}
        if routing_keys is not None:
            claimable["key"] = {"$in": list(routing_keys)}
        order, first = [("stamp", 1), ("arrival", 1)], True
        while True:
            found = yield FindSome(self.n.groups, claimable, order, 1 if first else RETRY_CANDIDATES)
            if not found:
                return None
            group = found[0] if first else random.choice(found)  # R4's order when nobody races
            first = False
            head = group["queue"][0]  # a guess: the update's filter checks it
            as_found = {**claimable, "_id": group["_id"], "life": group["life"], "queue.0": head}
            message = yield Find(self.n.messages, {"_id": head, "g": group["_id"]})
            if message is None:  # acked since (then the group changed); or lost with the server's data
                yield from self._remove_head(as_found, head, {})
                continue
            taken = yield Update(self.n.groups, as_found,
                                 {"$set": {"holder": token, "ends": _moment(now + visibility), "leased": head}})
            if taken:
                return Lease(group["_id"], message["e"], head, token)

    def _remove_head(self, where: dict[str, Any], head: int, then: dict[str, Any]) -> Steps[bool]:
        """Remove the head ``head`` of the group ``where`` matches: the whole group if it is
        its last message (R11), else pop it and ``$set`` ``then``.  False if none matched."""
        if (yield Delete(self.n.groups, {**where, "queue": [head]})):
            return True
        change: dict[str, Any] = {"$pop": {"queue": -1}}
        if then:
            change["$set"] = then
        return (yield Update(self.n.groups, where, change))

    def _held(self, lease: Lease) -> dict[str, Any]:
        return {"_id": lease.group_id, "holder": lease.token, "leased": lease.seq, "queue.0": lease.seq}  # R10

    def ack(self, lease: Lease, now: float) -> Steps[bool]:
        free_and_stamped = {"holder": None, "ends": FREE, "leased": None, "stamp": _moment(now)}
        if not (yield from self._remove_head(self._held(lease), lease.seq, free_and_stamped)):
            return False
        yield Delete(self.n.messages, {"_id": lease.seq, "g": lease.group_id}, takes_effect=False, tidy=True)
        return True

    def nack(self, lease: Lease, now: float, delay: float) -> Steps[bool]:
        if delay == 0:
            held = {"holder": None, "ends": FREE, "leased": None}  # R8, its stamp unchanged
        else:
            held = {"holder": PARKED, "ends": _moment(now + delay), "leased": None}  # R9
        return (yield Update(self.n.groups, self._held(lease), {"$set": held}))


def _opening(names: MongoNames) -> Steps[None]:
    """Record the schema version in a new queue; refuse collections of another version."""
    yield Insert(names.counters, {"_id": "schema", "version": SCHEMA_VERSION})
    schema = yield Find(names.counters, {"_id": "schema"})
    if schema is None or schema.get("version") != SCHEMA_VERSION:
        raise StorageError(
            f"collections {names.groups}, {names.messages}, {names.counters} hold schema {schema!r}, "
            f"not version {SCHEMA_VERSION} of harel-ref's Mongo transport; use another prefix"
        )


# --- The drivers ----------------------------------------------------------------------------


def _check_acknowledged(db: Any, url: str) -> None:
    """Refuse a write concern of ``w=0``: its writes answer no counts, so no answer could be
    judged, and an update that took effect would look like one that did nothing."""
    if not db.write_concern.acknowledged:
        raise ValueError(f"{without_password(url)} asks for unacknowledged writes (w=0); the transport reads "
                         "what each write matched, which needs an acknowledged write concern")


def _client_options(timeout: float) -> dict[str, Any]:
    ms = int(timeout * 1000)
    # No retryable writes: see the module's docstring.
    return {"serverSelectionTimeoutMS": ms, "connectTimeoutMS": ms, "socketTimeoutMS": ms,
            "retryWrites": False}


@contextmanager
def _errors(url: str, operation: str, step: Any) -> Iterator[None]:
    """PyMongo's errors during ``step`` as R17 says."""
    from pymongo.errors import ConnectionFailure, PyMongoError, ServerSelectionTimeoutError, WriteConcernError

    try:
        yield
    except (StorageError, ClockError, OutcomeUnknownError):
        raise
    except ServerSelectionTimeoutError as exc:  # no server to send it to: nothing was sent
        raise StorageError(f"{operation} on {without_password(url)} failed: cannot connect ({exc}); is the server up?") from exc
    except (ConnectionFailure, WriteConcernError) as exc:  # sent, and the answer was lost or not confirmed
        if getattr(step, "takes_effect", False):
            raise OutcomeUnknownError(
                f"{operation} on {without_password(url)}: no answer confirmed the write ({exc}); it may or may not "
                "have taken effect (SPEC R17)"
            ) from exc
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc
    except PyMongoError as exc:  # the server refused this request: it did nothing
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc


def _answer(step: Any, result: Any) -> Any:
    """A step's answer from PyMongo's result."""
    if isinstance(step, Update):
        return result.matched_count == 1 or result.upserted_id is not None
    if isinstance(step, Delete):
        return result.deleted_count == 1
    if isinstance(step, Insert):
        return True
    return result


def _request(db: Any, step: Any) -> Any:
    """The PyMongo call of ``step``, not yet made: awaitable on an async database."""
    collection = db[step.collection]
    if isinstance(step, Find):
        return collection.find_one(step.where, sort=step.sort)
    if isinstance(step, FindSome):
        # the whole queue of seqs: FerretDB, among others, refuses a $slice projection
        return collection.find(step.where, {"queue": 1, "life": 1}, sort=step.sort, limit=step.limit).to_list()
    if isinstance(step, Insert):
        return collection.insert_one(step.document)
    if isinstance(step, Update):
        return collection.update_one(step.where, step.change, upsert=step.upsert)
    return collection.delete_one(step.where)


def _refused(step: Any, exc: BaseException) -> Any:
    """The answer of a step whose request raised ``exc``, if the step expects it; else raise."""
    if isinstance(step, (Insert, Update)) and _is_duplicate(exc):
        return False
    if isinstance(step, Delete) and step.tidy:
        return False  # the operation has taken effect; what stays is garbage (docs/mongo.md)
    raise exc


class MongoTransport(Shell):
    """The queue in the MongoDB at ``url`` (``mongodb://host:port``).  Thread-safe (PyMongo's
    connection pool).

    - ``clock``: the time source, read once per claim, ack and nack.
    - ``prefix``: collections are ``<prefix>_groups``, ``_messages``, ``_counters``
      (``harel_...`` by default), in ``database`` (``harel_ref``).
    - ``timeout``: seconds a call may take before :class:`OutcomeUnknownError`.
    """

    def __init__(self, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                 database: str = DATABASE, timeout: float = 10.0) -> None:
        import pymongo

        self._names = MongoNames.named(prefix)
        self._core = MongoCore(self._names)
        self._clock = check_clock(clock)
        self.url = url
        self._client = pymongo.MongoClient(url, **_client_options(timeout))
        self._db = self._client[database]
        try:
            _check_acknowledged(self._db, url)
            self._drive("open", _opening(self._names))
        except BaseException:
            self._client.close()
            raise

    def _perform(self, operation: str, step: Any) -> Any:
        with _errors(self.url, operation, step):
            try:
                return _answer(step, _request(self._db, step))
            except Exception as exc:
                return _refused(step, exc)

    def _release(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<MongoTransport {without_password(self.url)} {self._db.name}.{self._names.groups}{state}>"


class AsyncMongoTransport(AsyncShell):
    """The asyncio twin of :class:`MongoTransport` (PyMongo's ``AsyncMongoClient``).  Build it
    with ``await AsyncMongoTransport.create(url, ...)``."""

    def __init__(self, client: Any, url: str, names: MongoNames, database: str, clock: Clock) -> None:
        # Use create(); __init__ only stores what create() prepared.
        self._client = client
        self._db = client[database]
        self.url = url
        self._names = names
        self._core = MongoCore(names)
        self._clock = clock

    @classmethod
    async def create(cls, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                     database: str = DATABASE, timeout: float = 10.0) -> AsyncMongoTransport:
        from pymongo import AsyncMongoClient

        names = MongoNames.named(prefix)
        clock = check_clock(clock)
        transport = cls(AsyncMongoClient(url, **_client_options(timeout)), url, names, database, clock)
        try:
            _check_acknowledged(transport._db, url)
            await transport._drive("open", _opening(names))
        except BaseException:
            await transport._client.close()
            raise
        return transport

    async def _perform(self, operation: str, step: Any) -> Any:
        with _errors(self.url, operation, step):
            try:
                return _answer(step, await _request(self._db, step))
            except Exception as exc:
                return _refused(step, exc)

    async def _release(self) -> None:
        await self._client.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<AsyncMongoTransport {without_password(self.url)} {self._db.name}.{self._names.groups}{state}>"
