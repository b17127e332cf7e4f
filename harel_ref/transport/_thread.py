"""A thread of a connection's own, for the asyncio twin of a transport whose driver blocks.

:class:`ConnectionThread` runs each job it is given in one thread, one at a time, in the order
given, and wakes the event loop once when a job is done.  One job is a whole operation (every
statement of a claim, or a publish's ``BEGIN IMMEDIATE ... COMMIT``), so an operation costs one
trip to the thread and back, whatever it holds.

Why not ``asyncio.to_thread`` or aiosqlite: a trip through this thread costs a fraction of
theirs (``benchmarks/thread_hop.py``; figures in docs/performance.md).  The difference is the
wake-up of the loop: ``call_soon_threadsafe`` writes to the loop's self-pipe socket, while this
thread writes to an ``eventfd`` the loop watches (Linux; elsewhere it falls back to
``call_soon_threadsafe``).

A job whose awaiting task is cancelled still runs to its end in the thread, and the jobs after
it wait for it: the connection never serves two jobs at once.  A job may also be given with
nobody to await it (``submit``).  Work done outside the thread must wait for the jobs given
before it: ``idle()`` returns once they are done.  ``stop()`` ends the thread after
the jobs already given, whose outcomes are still handed over; the loop then stops watching the
eventfd and closes it.  A ConnectionThread that is garbage-collected without ``stop()`` ends
its thread the same way (and its eventfd is closed by the thread if no loop ever watched it, or
by the loop that watches it, if that loop runs again).
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

_STOP = object()  # in the jobs: end the thread
_STOPPED = object()  # in the outcomes: the thread has ended, the eventfd can be closed


class ConnectionThread:
    """One daemon thread that runs jobs for the event loop: ``await thread.run(function, *args)``,
    and at the end ``await thread.stop()``."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._given = 0  # jobs put in _jobs; the thread counts those it finished in _finished
        self._finished = [0]
        self._done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if hasattr(os, "eventfd") else None
        self._listening: asyncio.AbstractEventLoop | None = None  # the loop watching _wakeup
        self._watched = [False]  # shared with the thread: has any loop ever watched _wakeup?
        # The thread holds no reference to self, so an abandoned ConnectionThread is collected.
        try:
            threading.Thread(target=_serve, args=(self._jobs, self._done, self._wakeup, self._watched, self._finished),
                             name=name, daemon=True).start()
        except BaseException:  # no thread to be had (a limit reached): nothing left open
            if self._wakeup is not None:
                os.close(self._wakeup)
            raise
        self._stopped = weakref.finalize(self, self._jobs.put, (_STOP, None))

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the thread, after the jobs given before; its result or error."""
        if not self._stopped.alive:
            raise RuntimeError("this ConnectionThread was stopped")
        loop = asyncio.get_running_loop()
        if self._wakeup is not None and loop is not self._listening:
            self._listen(loop)
        future = loop.create_future()
        self._give((future, function, args))
        return await future

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """``function(*args)`` in the thread, after the jobs given before, with nobody awaiting
        it: its result is dropped, and so is its error (``function`` handles its own)."""
        if not self._stopped.alive:
            raise RuntimeError("this ConnectionThread was stopped")
        self._give((None, function, args))

    def busy(self) -> bool:
        """Whether a job given is not done yet (its caller may have stopped waiting for it)."""
        return self._finished[0] != self._given

    async def idle(self) -> None:
        """Return once every job given so far is done (at once if they are).  Cancelled while it
        waits, it leaves them running: the next idle() waits for them again."""
        if self.busy():
            await self.run(_nothing)  # jobs run in the order given: this one comes after them all

    def _give(self, job: tuple[Any, ...]) -> None:
        self._given += 1
        self._jobs.put(job)

    async def stop(self) -> None:
        """End the thread once the jobs already given are done (their outcomes are handed over);
        return when it has ended and the loop has closed the eventfd."""
        if not self._stopped.alive:
            return
        self._stopped.detach()
        ended = asyncio.get_running_loop().create_future()
        if self._wakeup is not None and self._listening is not asyncio.get_running_loop():
            self._listen(asyncio.get_running_loop())
        self._jobs.put((_STOP, ended))
        await ended

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._listening is not None and not self._listening.is_closed():
            self._listening.remove_reader(self._wakeup)
        loop.add_reader(self._wakeup, _settle_done, self._wakeup, self._done)
        self._listening = loop
        self._watched[0] = True


def _nothing() -> None:
    pass


def _serve(jobs: queue.SimpleQueue[Any], done: collections.deque[Any], wakeup: int | None,
           watched: list[bool], finished: list[int]) -> None:
    while True:
        # Hold nothing of the last job while waiting for the next: a job's function or error
        # can refer to the transport, which holds this thread's ConnectionThread, and would
        # keep an abandoned one from being collected (and this thread from ending).
        job = future = function = args = outcome = None
        job = jobs.get()
        if job[0] is _STOP:  # (_STOP, the future stop() awaits, or None when collected)
            _, ended = job
            if wakeup is None:
                if ended is not None:
                    _hand_over(ended, True, None)
            elif not watched[0]:  # collected before any call: no loop will ever read the eventfd
                os.close(wakeup)
            else:  # the loop closes the eventfd once it has read every outcome, and this write
                done.append((_STOPPED, ended, threading.current_thread()))
                os.eventfd_write(wakeup, 1)
            return
        future, function, args = job
        try:
            outcome = (True, function(*args))
        except BaseException as exc:  # handed to the awaiting task, as to_thread would
            outcome = (False, exc)
        finished[0] += 1  # before the answer is handed over: the awaiting task then sees it done
        if future is None:  # submitted: nobody awaits it
            continue
        if wakeup is None:
            _hand_over(future, *outcome)
        else:
            done.append((future, *outcome))
            job = future = function = args = outcome = None  # handed over: hold none of it (above)
            os.eventfd_write(wakeup, 1)


def _settle_done(wakeup: int, done: collections.deque[Any]) -> None:
    """The loop's reader of the eventfd: hand every finished job's outcome to its future."""
    try:
        os.eventfd_read(wakeup)
    except BlockingIOError:  # an earlier call took this write's items already
        pass
    running = asyncio.get_running_loop()
    while done:
        outcome = done.popleft()
        if outcome[0] is _STOPPED:
            _, ended, thread = outcome
            thread.join()  # it may still be in its last write: at most that long
            running.remove_reader(wakeup)
            os.close(wakeup)
            if ended is not None:
                _settle(ended, True, None)
            return
        future, succeeded, value = outcome
        owner = future.get_loop()
        if owner is running:
            _settle(future, succeeded, value)
        elif not owner.is_closed():  # a job given under an earlier loop
            owner.call_soon_threadsafe(_settle, future, succeeded, value)


def _hand_over(future: asyncio.Future[Any], succeeded: bool, value: Any) -> None:
    """From the thread, without an eventfd: the outcome to the future's loop."""
    try:
        future.get_loop().call_soon_threadsafe(_settle, future, succeeded, value)
    except RuntimeError:  # that loop is closed: nobody awaits the answer
        pass


def _settle(future: asyncio.Future[Any], succeeded: bool, value: Any) -> None:
    if future.cancelled():  # the caller gave up waiting; the job ran all the same
        return
    if succeeded:
        future.set_result(value)
    else:
        future.set_exception(value)
