"""A thread of a connection's own, for the asyncio twin of a transport whose driver blocks.

:class:`ConnectionThread` runs each job it is given in one thread, one at a time, in the order
given, and wakes the event loop once when a job is done.  One job is a whole operation (every
statement of a claim, or a publish's ``BEGIN IMMEDIATE ... COMMIT``), so an operation costs one
trip to the thread and back, whatever it holds.

Why not ``asyncio.to_thread`` or aiosqlite: measured on the 2-core VM (docs/performance.md), a
trip through ``to_thread`` costs about 90 µs, through aiosqlite about 60 µs, and through this
thread about 20 µs.  The difference is the wake-up of the loop: ``call_soon_threadsafe`` writes
to the loop's self-pipe socket, while this thread writes to an ``eventfd`` the loop watches
(Linux; elsewhere it falls back to ``call_soon_threadsafe``).

A job whose awaiting task is cancelled still runs to its end in the thread, and the jobs after
it wait for it: the connection never serves two jobs at once.  ``stop()`` ends the thread after
the jobs already given; a ConnectionThread that is garbage-collected without ``stop()`` ends its
thread too (it leaves its eventfd to the loop it was registered with).
"""

from __future__ import annotations

import asyncio
import collections
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["ConnectionThread"]

_STOP, _STOP_AND_CLOSE = object(), object()


class ConnectionThread:
    """One daemon thread that runs jobs for the event loop: ``await thread.run(function, *args)``."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if hasattr(os, "eventfd") else None
        self._listening: asyncio.AbstractEventLoop | None = None  # the loop watching _wakeup
        # The thread holds no reference to self, so an abandoned ConnectionThread is collected.
        threading.Thread(target=_serve, args=(self._jobs, self._done, self._wakeup), name=name, daemon=True).start()
        self._stopped = weakref.finalize(self, self._jobs.put, _STOP)

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the thread, after the jobs given before; its result or error."""
        loop = asyncio.get_running_loop()
        if self._wakeup is not None and loop is not self._listening:
            self._listen(loop)
        future = loop.create_future()
        self._jobs.put((future, function, args))
        return await future

    def stop(self) -> None:
        """End the thread once the jobs already given are done.  Call it from the event loop."""
        if not self._stopped.alive:
            return
        self._stopped.detach()
        if self._wakeup is None:
            self._jobs.put(_STOP)
            return
        if self._listening is not None and not self._listening.is_closed():
            self._listening.remove_reader(self._wakeup)
        self._jobs.put(_STOP_AND_CLOSE)  # the thread closes the eventfd: it is the one writing it

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._listening is not None and not self._listening.is_closed():
            self._listening.remove_reader(self._wakeup)
        loop.add_reader(self._wakeup, _settle_done, self._wakeup, self._done)
        self._listening = loop


def _serve(jobs: queue.SimpleQueue[Any], done: collections.deque[Any], wakeup: int | None) -> None:
    while True:
        job = jobs.get()
        if job is _STOP or job is _STOP_AND_CLOSE:
            if job is _STOP_AND_CLOSE:
                os.close(wakeup)
            return
        future, function, args = job
        try:
            outcome = (True, function(*args))
        except BaseException as exc:  # handed to the awaiting task, as to_thread would
            outcome = (False, exc)
        if wakeup is None:
            try:
                future.get_loop().call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # that loop is closed: nobody awaits the answer
                pass
        else:
            done.append((future, *outcome))
            os.eventfd_write(wakeup, 1)


def _settle_done(wakeup: int, done: collections.deque[Any]) -> None:
    """The loop's reader of the eventfd: hand every finished job's outcome to its future."""
    try:
        os.eventfd_read(wakeup)
    except BlockingIOError:  # an earlier call took this write's items already
        pass
    running = asyncio.get_running_loop()
    while done:
        future, succeeded, value = done.popleft()
        owner = future.get_loop()
        if owner is running:
            _settle(future, succeeded, value)
        elif not owner.is_closed():  # a job given under an earlier loop
            owner.call_soon_threadsafe(_settle, future, succeeded, value)


def _settle(future: asyncio.Future[Any], succeeded: bool, value: Any) -> None:
    if future.cancelled():  # the caller gave up waiting; the job ran all the same
        return
    if succeeded:
        future.set_result(value)
    else:
        future.set_exception(value)
