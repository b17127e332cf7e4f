"""The transport contract: the Protocol, the Lease, the errors and the shared input checks.

A transport is a FIFO queue split into *groups* (one group per workflow execution) that
promises **at most one message per group in flight** (SPEC.md R2).  Every backend implements
the same five methods; SPEC.md gives the rules and ``model/`` executes them.

Every argument is checked here, once, before a backend writes anything (SPEC.md R13), so that
all backends refuse bad input with the same clear error.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "PARKED",
    "PRIORITIES",
    "AsyncTransport",
    "Clock",
    "ClockError",
    "Lease",
    "OutcomeUnknownError",
    "StorageError",
    "Transport",
    "TransportClosedError",
    "TransportError",
    "check_claim_args",
    "check_delay",
    "check_clock",
    "check_lease",
    "check_publish_args",
    "read_clock",
]

Clock = Callable[[], float]
"""A function returning the current time in seconds.  Transports read it once per claim, ack and nack."""

PRIORITIES = range(0, 5)
"""Allowed group priorities, 0 (default) to 4 (highest)."""

PARKED = "__parked__"
"""What a parked message is held by (SPEC.md R9): no claim hands out this token, and
``check_lease`` refuses it, so no lease can act on a parked message (R10)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """What ``claim`` hands a worker: the message, and the right to ack or nack it.

    ``seq`` is the message's position in the queue (stable for the message, increasing along
    its group's FIFO).  ``token`` is unique per claim: ``ack`` and ``nack`` act only while the
    message is still held under this token (fencing, SPEC.md R10).
    """

    group_id: str
    event: str
    seq: int
    token: str


class TransportError(Exception):
    """Base class of every error a transport raises on purpose."""


class TransportClosedError(TransportError):
    """The transport was closed; open a new one to continue (SPEC.md R14)."""


class ClockError(ValueError):
    """``clock()`` answered something that is not a time: not a number, NaN, infinite or
    negative.  Raised before anything is written (SPEC.md R13)."""


class StorageError(TransportError):
    """The storage refused the operation (not a database, read-only, locked past the timeout,
    node down).  Nothing was changed by the failed call."""


class OutcomeUnknownError(TransportError):
    """The request reached the storage but its answer was lost (timeout, leader change).

    The operation may or may not have taken effect.  For a claim this is safe: if a lease was
    taken, nobody holds its token, so the message comes back when the lease lapses
    (SPEC.md R17).
    """


@runtime_checkable
class Transport(Protocol):
    """The synchronous transport contract (SPEC.md R1-R14)."""

    def publish(
        self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None
    ) -> None:
        """Append ``event`` to the end of ``group_id``'s FIFO.

        The publish that creates a group fixes its ``priority`` and ``routing_key``; later
        publishes to the same group cannot change them (R12).
        """

    def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        routing_keys: Iterable[str] | None = None,
    ) -> Lease | None:
        """Lease the head of the next claimable group for ``visibility`` seconds, or None.

        Only groups with ``priority >= min_priority`` and, when ``routing_keys`` is given,
        a routing key in it are considered (R4).
        """

    def ack(self, lease: Lease) -> bool:
        """Remove the leased message.  True if the lease was still current (R7, R10)."""

    def nack(self, lease: Lease, delay: float = 0) -> bool:
        """Give the message back: at once (``delay == 0``, R8) or parked for ``delay``
        seconds (R9).  True if the lease was still current (R10)."""

    def close(self) -> None:
        """Release the connection.  Further calls raise TransportClosedError (R14)."""


@runtime_checkable
class AsyncTransport(Protocol):
    """The asyncio twin of :class:`Transport`: the same contract, every method awaited."""

    async def publish(
        self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None
    ) -> None: ...

    async def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        routing_keys: Iterable[str] | None = None,
    ) -> Lease | None: ...

    async def ack(self, lease: Lease) -> bool: ...

    async def nack(self, lease: Lease, delay: float = 0) -> bool: ...

    async def close(self) -> None: ...


# --- Input checks (SPEC.md R13) -------------------------------------------------------------
# Each returns the value to use, or raises TypeError/ValueError saying what was wrong.


def _check_text(name: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.80}")
    if not value and not allow_empty:
        raise ValueError(f"{name} must be a non-empty string")
    if value.isascii():  # the common case, and a lone surrogate is never ASCII
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} cannot be encoded as UTF-8 (it contains {value[exc.start:exc.end]!r} "
            f"at index {exc.start}, a lone surrogate); pass valid text"
        ) from None
    return value


def _check_priority(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int from 0 to 4, got {type(value).__name__}: {value!r}")
    if value not in PRIORITIES:
        raise ValueError(f"{name} must be from 0 to 4, got {value}")
    return value


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_publish_args(
    group_id: object, event: object, priority: object, routing_key: object
) -> tuple[str, str, int, str | None]:
    """Check the arguments of ``publish``; events may be empty, ids may not."""
    group_id = _check_text("group_id", group_id)
    event = _check_text("event", event, allow_empty=True)
    priority = _check_priority("priority", priority)
    if routing_key is not None:
        routing_key = _check_text("routing_key", routing_key)
    return group_id, event, priority, routing_key


def check_claim_args(
    worker_id: object, visibility: object, min_priority: object, routing_keys: object
) -> tuple[str, float, int, tuple[str, ...] | None]:
    """Check the arguments of ``claim``; ``routing_keys`` comes back as a sorted tuple."""
    worker_id = _check_text("worker_id", worker_id)
    visibility = _check_seconds("visibility", visibility)
    if visibility <= 0:
        raise ValueError(f"visibility must be > 0 seconds, got {visibility}")
    min_priority = _check_priority("min_priority", min_priority)
    if routing_keys is None:
        return worker_id, visibility, min_priority, None
    if isinstance(routing_keys, (str, bytes)):
        raise TypeError(
            "routing_keys must be a collection of str such as ['a', 'b'], not a single "
            f"{type(routing_keys).__name__} (it would be read letter by letter)"
        )
    if not isinstance(routing_keys, Iterable):
        raise TypeError(f"routing_keys must be a collection of str or None, got {routing_keys!r}")
    keys = tuple(sorted({_check_text("routing_keys item", key) for key in routing_keys}))
    if not keys:
        raise ValueError(
            "routing_keys must not be empty: pass None to claim from every group, "
            "or at least one routing key"
        )
    return worker_id, visibility, min_priority, keys


SEQS = range(1, 2**63)
"""The seqs a message can have: SQLite's positive 64-bit integers (every backend keeps to them)."""


def check_lease(lease: object) -> Lease:
    """Check that ``ack``/``nack`` were given a Lease as ``claim`` returns one.

    Every field is checked, not only the class: a Lease is a plain dataclass anyone can build,
    and a forged one (a token of None, a seq out of range) must be refused, not compared with
    what is stored (R10, R13).
    """
    if not isinstance(lease, Lease):
        raise TypeError(f"lease must be a Lease returned by claim(), got {type(lease).__name__}: {lease!r:.80}")
    _check_text("lease.group_id", lease.group_id)
    if not isinstance(lease.event, str):  # not used to find the message: no need to encode it
        raise TypeError(f"lease.event must be a str, got {type(lease.event).__name__}: {lease.event!r:.80}")
    if isinstance(lease.seq, bool) or not isinstance(lease.seq, int):
        raise TypeError(f"lease.seq must be an int, got {type(lease.seq).__name__}: {lease.seq!r:.80}")
    if lease.seq not in SEQS:
        raise ValueError(f"lease.seq must be from 1 to 2**63 - 1, got {lease.seq}")
    _check_text("lease.token", lease.token)
    if lease.token == PARKED:
        raise ValueError(
            f"lease.token {PARKED!r} marks a parked message and is not a lease token; pass a "
            "Lease returned by claim()"
        )
    return lease


def check_delay(delay: object) -> float:
    """Check a nack delay: a finite number of seconds >= 0."""
    delay = _check_seconds("delay", delay)
    if delay < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay}")
    return delay


def new_token(worker_id: str) -> str:
    """A lease token unique per claim, readable in logs: ``worker_id:random-hex`` (128 random
    bits, as many as a UUID4 carries)."""
    return f"{worker_id}:{os.urandom(16).hex()}"


class ClosedGuard:
    """Mixin: ``self._closed`` and a check that raises a clear error after ``close()``."""

    _closed: bool = False

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosedError(
                f"{type(self).__name__} is closed; open a new transport to continue"
            )


def check_clock(clock: object) -> Clock:
    """Check, when a transport is made, that ``clock`` can be called."""
    if not callable(clock):
        raise TypeError(f"clock must be a function returning seconds, got {type(clock).__name__}: {clock!r:.80}")
    return clock


def read_clock(clock: Clock) -> float:
    """``clock()``, checked: a finite number of seconds >= 0, or an error that says so.

    Transports read the clock before they write anything, so a clock that answers NaN, an
    infinity, a negative number or something that is not a number stops the call with nothing
    changed (SPEC.md R13).  A clock that steps back is accepted (R3): it only lengthens leases.
    """
    now = clock()
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise ClockError(f"clock() must return a number of seconds, got {type(now).__name__}: {now!r:.80}")
    if not math.isfinite(now) or now < 0:
        raise ClockError(f"clock() must return a finite number of seconds >= 0, got {now}")
    return float(now)


class ClosesOnExit:
    """Mixin: ``with transport:`` closes it at the end of the block, whatever happened."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClosesOnExit:
    """Mixin: ``async with transport:`` closes it at the end of the block, whatever happened."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def without_password(url: str) -> str:
    """``url`` with its password (``scheme://user:password@host``) shown as ``***``, for
    error messages and reprs."""
    return _URL_PASSWORD.sub(r"\1***@", url)


def default_clock() -> float:
    """The wall clock (``time.time``); transports accept any ``clock`` instead."""
    return time.time()
