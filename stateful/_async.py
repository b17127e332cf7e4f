"""Open transports for the checkers: drive an asyncio transport from synchronous code (so one
machine checks both twins), speak harel's Protocol, and contain a transport's panics."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ._harel import AsyncHarelAdapter, HarelAdapter, call_factory

__all__ = ["AsyncPanicGuard", "BlockingTransport", "PanicGuard", "TransportPanic", "open_transport"]


class TransportPanic(Exception):
    """The transport raised a ``BaseException`` that is not a request to stop, such as pyo3's
    ``PanicException`` (a Rust panic in a binding like ``libsql``'s).  The checkers report it
    as the call's failure, as they would any other error."""


class PanicGuard:
    """A transport whose calls raise :class:`TransportPanic` instead of a foreign
    ``BaseException``: one that escaped would stop a whole certification, losing every verdict
    already found."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def publish(self, *args, **kwargs):
        return _contained(self.transport.publish, args, kwargs)

    def claim(self, *args, **kwargs):
        return _contained(self.transport.claim, args, kwargs)

    def ack(self, *args, **kwargs):
        return _contained(self.transport.ack, args, kwargs)

    def nack(self, *args, **kwargs):
        return _contained(self.transport.nack, args, kwargs)

    def close(self, *args, **kwargs):
        return _contained(self.transport.close, args, kwargs)


class AsyncPanicGuard:
    """:class:`PanicGuard` for an asyncio transport (what :class:`BlockingTransport` drives,
    and what the parallel search and the soak await directly as its ``transport``)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    async def publish(self, *args, **kwargs):
        return await _contained_async(self.transport.publish, args, kwargs)

    async def claim(self, *args, **kwargs):
        return await _contained_async(self.transport.claim, args, kwargs)

    async def ack(self, *args, **kwargs):
        return await _contained_async(self.transport.ack, args, kwargs)

    async def nack(self, *args, **kwargs):
        return await _contained_async(self.transport.nack, args, kwargs)

    async def close(self, *args, **kwargs):
        return await _contained_async(self.transport.close, args, kwargs)


_STOPS = (Exception, KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError)
"""What passes a guard unchanged: errors, and requests to stop."""


def _contained(method, args, kwargs):
    try:
        return method(*args, **kwargs)
    except _STOPS:
        raise
    except BaseException as exc:
        raise TransportPanic(f"{type(exc).__name__}: {exc}") from exc


async def _contained_async(method, args, kwargs):
    try:
        answer = method(*args, **kwargs)
        if not inspect.isawaitable(answer):
            raise TypeError(
                f"{type(method.__self__).__name__} was declared async, but {method.__name__}() returned "
                f"{answer!r} instead of an awaitable; declare the backend sync instead"
            )
        return await answer
    except _STOPS:
        raise
    except BaseException as exc:
        raise TransportPanic(f"{type(exc).__name__}: {exc}") from exc


class BlockingTransport:
    """The sync Protocol over an :class:`~harel_ref.AsyncTransport`, on a private event loop.

    Every call runs the coroutine to completion on ``loop``; the loop belongs to the caller,
    who closes it after the transport.
    """

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop

    def publish(self, group_id, event, priority=0, routing_key=None):
        return self._run(self.transport.publish(group_id, event, priority, routing_key))

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        return self._run(self.transport.claim(worker_id, visibility, min_priority, routing_keys))

    def ack(self, lease):
        return self._run(self.transport.ack(lease))

    def nack(self, lease, delay=0):
        return self._run(self.transport.nack(lease, delay))

    def close(self):
        return self._run(self.transport.close())

    def _run(self, awaitable: Any) -> Any:
        if not inspect.isawaitable(awaitable):
            raise TypeError(
                f"{type(self.transport).__name__} was declared async, but a method returned "
                f"{awaitable!r} instead of an awaitable; declare the backend sync instead"
            )
        return self._loop.run_until_complete(awaitable)


def open_transport(factory, clock, namespace, loop: asyncio.AbstractEventLoop | None,
                   protocol: str = "harel-ref") -> Any:
    """Call ``factory(clock, namespace)`` (or ``factory(clock)``); with a ``loop``, await it and
    wrap the async result.  A transport of harel's ``protocol`` is adapted to this package's
    (:mod:`stateful._harel`)."""
    made = call_factory(factory, clock, namespace)
    if loop is None:
        if inspect.isawaitable(made):
            raise TypeError(
                "the factory returned an awaitable: declare the backend async (is_async=True "
                "or --async) so the checker awaits it"
            )
        return PanicGuard(HarelAdapter(made) if protocol == "harel" else made)
    if inspect.isawaitable(made):
        made = loop.run_until_complete(made)
    return BlockingTransport(AsyncPanicGuard(AsyncHarelAdapter(made) if protocol == "harel" else made), loop)
