"""The shell every transport shares: the five methods of the Protocol, written once.

Each call goes through the same steps, in the same order, whatever the storage:

1. check the arguments (R13), before anything else;
2. check that the transport is open (R14);
3. take a new lease token (claim) and read the clock once (claim, ack and nack; R13 refuses a
   clock that answers no time before anything is written);
4. run the backend's *steps* for the operation on its connection;
5. hand back the answer the steps return, or the error the driver made of a failure (R17).

So a backend is its own three pieces, and nothing else:

- **a core**: the operations as steps, with no I/O.  Each is a generator that yields what to
  send (an SQL statement, a script call, an HTTP request), is sent back each answer, and
  returns the operation's result (a :class:`Lease`, True or False).  One core serves both twins.
  A store inside the process (:mod:`~harel_ref.transport.memory`) has nothing to send: its
  operations do the work and return the answer, and its driver hands it on;
- **a sync driver**: :meth:`Shell._drive` carries the steps out on the connection and turns the
  driver library's errors into R17's classes; :meth:`Shell._release` closes the connection;
- **an async driver**: the same two, awaited, in :class:`AsyncShell`.

:func:`run_steps` and :func:`run_steps_async` are the one loop that carries steps out, once per
direction: every driver is that loop with a ``perform`` of its own, which takes one step and
answers it (an SQL statement run on the connection, a script called, a request sent).  By
default ``_drive`` is that loop, and a backend implements ``_perform`` (Mongo's, SQS's).  A
plan carried out inside the steps of another kind (SQLite's statements between ``BEGIN`` and
``COMMIT``, a pause before each retry) goes through :func:`run_steps_within`.  No backend writes
the loop again (``tests/test_shell.py`` looks for one).

``_serial`` is what a call holds from step 2 to step 5: a lock when the connection serves one
call at a time (an SQLite connection, whose transaction belongs to the connection, not the
caller), nothing when the driver's client may be shared (a pool, a Redis client, httpx).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, Protocol, TypeVar

from ._base import (
    AsyncClosesOnExit,
    ClosedGuard,
    ClosesOnExit,
    Clock,
    Lease,
    check_claim_args,
    check_delay,
    check_lease,
    check_publish_args,
    new_token,
    read_clock,
)

__all__ = ["AsyncShell", "Core", "Shell", "Steps", "run_steps", "run_steps_async", "run_steps_within"]

T = TypeVar("T")

Steps = Generator[Any, Any, T]
"""An operation as a backend runs it: yields what to send, is sent each answer, returns the result."""


def run_steps(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    """Carry ``steps`` out: each step it yields goes to ``perform``, whose answer is sent back;
    the operation's result is what the steps return.  A driver's loop, for ``_drive``."""
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:  # the steps' own end, never one raised by perform
            return done.value
        answer = perform(step)


async def run_steps_async(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run_steps` with ``perform`` awaited."""
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value
        answer = await perform(step)


def run_steps_within(steps: Steps[T], perform: Callable[[Any], Steps[Any]]) -> Steps[T]:
    """:func:`run_steps` as steps of another kind: each step of ``steps`` is carried out by the
    steps ``perform`` makes of it (yielded out, for the caller's driver), and their result is
    the answer sent back."""
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value
        answer = yield from perform(step)


class Core(Protocol):
    """A backend's operations as :data:`Steps`, with the checked arguments, the token and the time."""

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Steps[None]: ...

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Steps[Lease | None]: ...

    def ack(self, lease: Lease, now: float) -> Steps[bool]: ...

    def nack(self, lease: Lease, now: float, delay: float) -> Steps[bool]: ...


class _Checks:
    """The argument checks of step 1 (R13).  A backend whose storage takes less (SQS: whole
    seconds up to 12 hours, ASCII group ids) sets its own, which call these first."""

    _check_publish = staticmethod(check_publish_args)
    _check_claim = staticmethod(check_claim_args)
    _check_delay = staticmethod(check_delay)


class Shell(_Checks, ClosedGuard, ClosesOnExit):
    """The synchronous transport of a backend that sets ``_core`` and ``_clock`` and implements
    ``_drive`` and ``_release``."""

    _core: Core
    _clock: Clock
    _serial: Any = contextlib.nullcontext()  # a threading.Lock where calls must not overlap

    def _drive(self, operation: str, steps: Steps[T]) -> T:
        """Carry out ``steps`` on the connection; R17's error for a failure of ``operation``.
        By default one step at a time, each by ``_perform``."""
        return run_steps(steps, lambda step: self._perform(operation, step))

    def _perform(self, operation: str, step: Any) -> Any:
        """One step's request and its answer (for the default ``_drive``)."""
        raise NotImplementedError

    def _release(self) -> None:
        """Close the connection (once; the transport is already marked closed)."""

    def _now(self) -> float:
        return read_clock(self._clock)  # a time, or ClockError before anything is written (R13)

    def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        group_id, event, priority, routing_key = self._check_publish(group_id, event, priority, routing_key)
        with self._serial:
            self._check_open()
            return self._drive("publish", self._core.publish(group_id, event, priority, routing_key))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0,
              routing_keys: Iterable[str] | None = None) -> Lease | None:
        worker_id, visibility, min_priority, keys = self._check_claim(worker_id, visibility, min_priority, routing_keys)
        with self._serial:
            self._check_open()
            token, now = new_token(worker_id), self._now()
            return self._drive("claim", self._core.claim(token, now, visibility, min_priority, keys))

    def ack(self, lease: Lease) -> bool:
        lease = check_lease(lease)
        with self._serial:
            self._check_open()
            return self._drive("ack", self._core.ack(lease, self._now()))

    def nack(self, lease: Lease, delay: float = 0) -> bool:
        lease, delay = check_lease(lease), self._check_delay(delay)
        with self._serial:
            self._check_open()
            return self._drive("nack", self._core.nack(lease, self._now(), delay))

    def close(self) -> None:
        with self._serial:
            if not self._closed:
                self._closed = True
                self._release()


class AsyncShell(_Checks, ClosedGuard, AsyncClosesOnExit):
    """The asyncio twin of :class:`Shell`: the same steps, with ``_drive`` and ``_release``
    awaited and ``_serial`` an ``asyncio.Lock`` where calls must not overlap."""

    _core: Core
    _clock: Clock
    _serial: Any = contextlib.nullcontext()

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        return await run_steps_async(steps, lambda step: self._perform(operation, step))

    async def _perform(self, operation: str, step: Any) -> Any:
        raise NotImplementedError

    async def _release(self) -> None:
        """Close the connection (once; the transport is already marked closed)."""

    def _now(self) -> float:
        return read_clock(self._clock)  # a time, or ClockError before anything is written (R13)

    async def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        group_id, event, priority, routing_key = self._check_publish(group_id, event, priority, routing_key)
        async with self._serial:
            self._check_open()
            return await self._drive("publish", self._core.publish(group_id, event, priority, routing_key))

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0,
                    routing_keys: Iterable[str] | None = None) -> Lease | None:
        worker_id, visibility, min_priority, keys = self._check_claim(worker_id, visibility, min_priority, routing_keys)
        async with self._serial:
            self._check_open()
            token, now = new_token(worker_id), self._now()
            return await self._drive("claim", self._core.claim(token, now, visibility, min_priority, keys))

    async def ack(self, lease: Lease) -> bool:
        lease = check_lease(lease)
        async with self._serial:
            self._check_open()
            return await self._drive("ack", self._core.ack(lease, self._now()))

    async def nack(self, lease: Lease, delay: float = 0) -> bool:
        lease, delay = check_lease(lease), self._check_delay(delay)
        async with self._serial:
            self._check_open()
            return await self._drive("nack", self._core.nack(lease, self._now(), delay))

    async def close(self) -> None:
        async with self._serial:
            if not self._closed:
                self._closed = True
                await self._release()
