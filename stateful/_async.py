"""Open transports for the checkers: drive an asyncio transport from synchronous code (so one
machine checks both twins), speak harel's Protocol, and contain whatever a transport does.

Every transport the checkers open (:func:`open_transport`) is *guarded*: the checkers see one
of three things from each call, never anything else.

- **An answer, or an** ``Exception``: the call's outcome, which the checkers judge.
- **A** :class:`TransportFault` (an ``Exception`` too), when the transport did something no
  answer covers.  Its message starts with what happened:

  - ``panicked: PanicException: ...``: the call raised a ``BaseException`` that is not an
    ``Exception`` and not a request to stop, such as pyo3's ``PanicException`` (a Rust panic
    in a binding like ``libsql``'s): :class:`TransportPanic`;
  - ``crashed: claim ended the thread it ran on (SystemExit: 3)``: the call raised
    ``SystemExit`` on a thread of its own (below), which ends that thread, as Python ends any
    thread but the main one: :class:`TransportCrashed` (a branch process that dies is one too,
    see :mod:`harel_ref.stateful._processes`);
  - ``hung: claim did not return within 30 s``: :class:`TransportHung`.

- ``KeyboardInterrupt``, and ``SystemExit`` raised where the checker runs: requests to stop,
  passed on as they are.  An asyncio transport's ``SystemExit`` is one, too: asyncio raises it
  out of the event loop, on the thread that runs the loop (the checker's, or a search thread
  that hands it to the checker's).

**The call deadline.**  Inside :func:`limit_calls` (the certifier's searches run in one), each
call must return within ``deadline`` seconds.  A synchronous call runs on a *call thread*: a
daemon thread per calling thread (so a transport that is not thread-safe is still called from
one thread at a time, and from the thread that opened it), which the caller stops waiting for
at the deadline.  In a lockstep search the trip to a call thread and back would cost a third of
the search's time, so there the calls run in-line on a *search thread* of the search's own,
which the thread that started it watches (:func:`in_line_calls`): at the deadline it is the
search thread that is abandoned to the call.  A lockstep search of an asyncio transport runs
on a search thread too, though its calls are tasks: what a search costs then does not depend
on the caller's stack (:func:`harel_ref.certify._driver.run_search`).  A hung call cannot be
stopped in Python: its thread is abandoned, never joined, and does not keep the interpreter
from exiting.  An asyncio
call runs as a task; at the deadline the task is cancelled and not waited for (a transport that
swallows the cancellation is abandoned the same way).  What no deadline can catch: an asyncio transport that blocks its
event loop (a ``time.sleep`` inside ``async def``), and native code that hangs holding the GIL.

After a hang the transport cannot be trusted to answer again (a lock may still be held), so
the :class:`CallLimits` is marked *broken*: every later call under it fails at once with the
same fault, and the certifier stops the search there instead of hanging once more per call.
Outside :func:`limit_calls` there is no deadline and calls run in-line on the caller's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import inspect
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ._harel import AsyncHarelAdapter, HarelAdapter, call_factory

__all__ = [
    "AsyncGuarded",
    "BlockingTransport",
    "CallLimits",
    "Guarded",
    "TransportCrashed",
    "TransportFault",
    "TransportHung",
    "TransportPanic",
    "current_limits",
    "in_line_calls",
    "limit_calls",
    "limits_of_its_own",
    "open_transport",
    "raise_stop_in",
    "release_call_thread",
]

METHODS = ("publish", "claim", "ack", "nack", "close")


class TransportFault(RuntimeError):
    """The transport did something no answer covers (it panicked, crashed or hung).  The
    checkers report it as the failure of the call that did it; its message says which."""


class TransportPanic(TransportFault):
    """The transport raised a ``BaseException`` that is not an ``Exception`` and not a request
    to stop: ``panicked: <its class>: <its message>``."""


class TransportCrashed(TransportFault):
    """The transport ended the thread its call ran on, or the process a branch ran in:
    ``crashed: ...``."""


class TransportHung(TransportFault):
    """A call did not return within the call deadline: ``hung: ...``."""


@dataclass
class CallLimits:
    """The call deadline of the transports opened under :func:`limit_calls`, and whether one of
    them is broken (it hung, or a branch process died): from then on every call fails at once."""

    deadline: float | None = None
    broken: TransportFault | None = None

    def declare(self, fault: TransportFault) -> TransportFault:
        """Record that the transport is broken (the first fault is kept); return ``fault``."""
        if self.broken is None:
            self.broken = fault
        return fault

    def refuse(self, what: str) -> None:
        """Raise at once if the transport is broken, instead of calling it again."""
        if self.broken is not None:
            raise type(self.broken)(f"{self.broken} (so {what} was not called)")


_LIMITS: contextvars.ContextVar[CallLimits | None] = contextvars.ContextVar("harel_ref_call_limits", default=None)


@contextlib.contextmanager
def limit_calls(deadline: float | None) -> Iterator[CallLimits]:
    """Give every transport opened inside (in this thread) a call deadline of ``deadline``
    seconds (None: no deadline), and one :class:`CallLimits`: once one of them is broken,
    all are.  The limits are taken when a transport is opened, so threads that call a
    transport opened here are bound by them too."""
    token = _LIMITS.set(CallLimits(deadline))
    try:
        yield _LIMITS.get()
    finally:
        _LIMITS.reset(token)


@contextlib.contextmanager
def limits_of_its_own() -> Iterator[CallLimits]:
    """For a thread that makes calls beside its caller's (a lane of runs, ``_lanes.py``): limits
    of its own with the caller's deadline, so that a hang in a call its caller never asked for
    breaks nothing of the caller's, and its calls on call threads of its own, never in-line on
    the caller's search thread (:func:`in_line_calls`)."""
    watched = _WATCH.set(None)
    try:
        with limit_calls(current_limits().deadline) as limits:
            yield limits
    finally:
        _WATCH.reset(watched)


def current_limits() -> CallLimits:
    """The limits of :func:`limit_calls` in force here; outside one, limits of one's own (no
    deadline, broken for nobody else)."""
    return _LIMITS.get() or CallLimits()


# --- what a call that raised becomes ----------------------------------------------------------


def _contained(what: str, error: BaseException, *, own_thread: bool) -> BaseException:
    """What the checkers see when the call ``what`` raised ``error`` (see the module docstring):
    ``error`` itself, or the fault it is.  ``own_thread``: the call ran on a call thread."""
    if isinstance(error, (Exception, KeyboardInterrupt)):
        return error
    if isinstance(error, SystemExit):
        if not own_thread:
            return error
        code = f": {error.code}" if error.code is not None else ""
        return TransportCrashed(f"crashed: {what} ended the thread it ran on (SystemExit{code})")
    return TransportPanic(f"panicked: {type(error).__name__}: {error}")


def _raise_contained(what: str, error: BaseException, *, own_thread: bool):
    contained = _contained(what, error, own_thread=own_thread)
    if contained is error:
        raise error
    raise contained from error


def _hung(limits: CallLimits, what: str) -> TransportHung:
    return limits.declare(TransportHung(f"hung: {what} did not return within {limits.deadline:g} s"))


# --- synchronous calls: in-line, or on a call thread with a deadline ---------------------------


class _CallThread:
    """A daemon thread that makes the calls of one calling thread, one at a time.  It ends
    when it is released, or soon after the thread it serves has ended."""

    def __init__(self, owner: threading.Thread) -> None:
        self._owner = owner
        self._abandoned = False  # to a call that hung: it ends if that call ever returns
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=f"harel-ref-calls-{owner.name}", daemon=True).start()

    def call(self, limits: CallLimits, what: str, function: Callable[[], Any]) -> Any:
        """``function()`` made on this thread; :class:`TransportHung` if it has not returned
        within the deadline (this thread is then abandoned to it)."""
        done, outcome = threading.Event(), []
        self._jobs.put((function, outcome, done))
        if not done.wait(limits.deadline):
            self._abandoned = True
            _calls.thread = None  # the caller's next call gets a new thread
            raise _hung(limits, what)
        returned, value = outcome[0]
        if returned:
            return value
        _raise_contained(what, value, own_thread=True)

    def release(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=1.0)
            except queue.Empty:
                if self._owner.is_alive():
                    continue
                return
            if job is None:
                return
            function, outcome, done = job
            try:
                outcome.append((True, function()))
            except BaseException as exc:  # delivered to the caller, who decides
                outcome.append((False, exc))
            done.set()
            del job, function, outcome, done  # hold nothing of a call between calls
            if self._abandoned:
                return


_calls = threading.local()  # .thread: the current thread's _CallThread


def _call_thread() -> _CallThread:
    thread = getattr(_calls, "thread", None)
    if thread is None:
        thread = _calls.thread = _CallThread(threading.current_thread())
    return thread


def release_call_thread() -> None:
    """End the current thread's call thread now (a thread that is about to end calls this, so
    its call thread does not linger)."""
    thread = getattr(_calls, "thread", None)
    if thread is not None:
        _calls.thread = None
        thread.release()


def _call(limits: CallLimits, what: str, function: Callable[[], Any]) -> Any:
    """``function()``, contained, within the deadline of ``limits``: in-line on a search thread
    of :func:`in_line_calls`, else on the caller's call thread."""
    limits.refuse(what)
    if limits.deadline is None:
        try:
            return function()
        except BaseException as exc:
            _raise_contained(what, exc, own_thread=False)
    watch = _WATCH.get()
    if watch is not None:
        return watch.call(what, function)
    return _call_thread().call(limits, what, function)


# --- synchronous calls in-line, on a search thread that can be abandoned -----------------------


class _Abandoned(BaseException):
    """Raised on a search thread abandoned to a hung call, at that call's return or its next
    call: it unwinds the thread, and nothing the thread does after counts."""


class _Watch:
    """The call in progress on one search thread (:func:`in_line_calls`), and since when."""

    def __init__(self) -> None:
        self.began: float | None = None  # time.monotonic() at the start of the call in progress
        self.what = ""
        self.abandoned = False

    def call(self, what: str, function: Callable[[], Any]) -> Any:
        if self.abandoned:
            raise _Abandoned
        self.what, self.began = what, time.monotonic()
        try:
            value = function()
        except BaseException as exc:
            if self.abandoned:
                raise _Abandoned from None
            _raise_contained(what, exc, own_thread=True)  # SystemExit would end the search thread
        finally:
            self.began = None
        if self.abandoned:
            raise _Abandoned
        return value


_WATCH: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar("harel_ref_in_line_watch", default=None)

STOP_WAIT = 5.0
"""Seconds the thread that watches a search thread waits for it to end, once a stop (SIGINT,
SIGTERM, the memory limit) reached the watching thread and was raised in the search thread,
before it abandons it (under harel_ref.certify._signals' STUCK_AFTER, when its last resorts end
the run)."""


def in_line_calls(body: Callable[[], None], limits: CallLimits) -> TransportHung | None:
    """Run ``body`` on a *search thread* of its own, on which the synchronous calls of the
    transports opened there run in-line, while this thread watches the call in progress.

    The call deadline is kept without a call thread per call: a trip to one and back costs two
    thread switches (about 35 µs here), and a certification of the in-memory transport at the
    quick profile makes 266,000 calls, which took a third of its time.  A call that has not
    returned within ``limits.deadline`` is a hang, as on a call thread: it is declared in
    ``limits`` (every later call fails at once), the search thread is abandoned to it (it ends
    quietly if the call ever returns), and the :class:`TransportHung` is returned, its traceback
    the search thread's stack where it is stuck.  Else None once ``body`` ended,
    raising what it raised.  A stop (SIGINT, SIGTERM) that reaches this thread is raised in the
    search thread too, which is abandoned if it has not ended :data:`STOP_WAIT` seconds later.
    Only one thread runs at a time: this one waits."""
    watch, context, ended, done = _Watch(), contextvars.copy_context(), [], threading.Event()
    context.run(_WATCH.set, watch)

    def search() -> None:
        try:
            try:
                context.run(body)
            except _Abandoned:
                pass
            except BaseException as exc:  # delivered to the watching thread, which raises it
                ended.append(exc)
        except _Stopped:
            pass  # raised in it as it ended
        finally:
            done.set()

    thread = threading.Thread(target=search, name=f"harel-ref-search-{threading.current_thread().name}",
                              daemon=True)
    thread.start()
    try:
        # Event.wait, not Thread.join: on Python 3.11 and 3.12 a join that a signal's exception
        # interrupted marks a thread that still runs as ended, and every later join returns at once.
        while not done.wait(min(0.25, limits.deadline / 4)):
            began = watch.began
            if began is not None and time.monotonic() - began > limits.deadline:
                watch.abandoned = True
                stuck = sys._current_frames().get(thread.ident)
                return _hung(limits, watch.what).with_traceback(_traceback_of(stuck))
    except BaseException:
        if not done.is_set():
            _raise_in(thread, _Stopped)
        if done.wait(STOP_WAIT):
            _end(thread)
        watch.abandoned = True
        raise
    _end(thread)
    if ended:
        raise ended[0]
    return None


def _end(thread: threading.Thread) -> None:
    """Let a search thread that has set its ``done`` end before going on: it still runs for a
    moment after (under load, long enough to be listed by ``threading.enumerate`` once the
    certification has returned).  A join that no signal interrupted is safe on 3.11 too."""
    thread.join(STOP_WAIT)


class _Stopped(KeyboardInterrupt):
    """What a stop raises in a search thread (:func:`_raise_in`): a request to stop, passed on
    as such by every call, whatever stopped the run.  The thread that waits for the search
    thread raises the stop itself (it may take arguments, which an exception raised in another
    thread cannot be given)."""


def raise_stop_in(thread: threading.Thread) -> None:
    """Stop ``thread``, a thread that runs or watches a search, as a stop reaching it would:
    a search thread unwinds now, and a thread watching one (:func:`in_line_calls`) stops it,
    waiting up to :data:`STOP_WAIT` for it."""
    _raise_in(thread, _Stopped)


def _raise_in(thread: threading.Thread, error: type[_Stopped]) -> None:
    """Raise ``error`` in ``thread`` at its next bytecode, as a stop is raised in the main
    thread, so that its search unwinds now (its teardowns run) and not at its next example.  A
    thread blocked in C gets it once the call returns; one that swallows it, at its next
    checkpoint (harel_ref.certify._signals keeps a record of the stop)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(error))


def _traceback_of(frame: Any) -> types.TracebackType | None:
    """A traceback of a thread's stack, outermost frame first, from its innermost ``frame``:
    where a hung call is stuck, as if it had raised there."""
    stack = None
    while frame is not None:
        stack = types.TracebackType(stack, frame, frame.f_lasti, frame.f_lineno)
        frame = frame.f_back
    return stack


async def _call_async(limits: CallLimits, what: str, function: Callable[[], Any]) -> Any:
    """``await function()``, contained, within the deadline of ``limits``, as a task."""
    limits.refuse(what)
    try:
        awaitable = function()
    except BaseException as exc:
        _raise_contained(what, exc, own_thread=False)
    if not inspect.isawaitable(awaitable):
        raise TypeError(
            f"the transport was declared async, but {what} returned {awaitable!r} instead of an "
            "awaitable; declare the backend sync instead"
        )
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=limits.deadline)
    except BaseException:  # this call itself was cancelled or closed: the transport's goes too
        task.cancel()
        raise
    if not done:
        task.cancel()
        task._log_destroy_pending = False  # abandoned on purpose, not forgotten
        raise _hung(limits, what)
    try:
        return task.result()
    except BaseException as exc:  # CancelledError too: nothing here cancelled the task
        _raise_contained(what, exc, own_thread=False)


def _guarded(name: str):
    def method(self, *args, **kwargs):
        return _call(self._limits, name, lambda: getattr(self.transport, name)(*args, **kwargs))

    method.__name__ = name
    return method


def _guarded_async(name: str):
    async def method(self, *args, **kwargs):
        return await _call_async(self._limits, name, lambda: getattr(self.transport, name)(*args, **kwargs))

    method.__name__ = name
    return method


class Guarded:
    """A transport whose calls are contained (see the module docstring): what the checkers
    call instead of the transport itself."""

    def __init__(self, transport: Any, limits: CallLimits) -> None:
        self.transport = transport
        self._limits = limits

    publish, claim, ack, nack, close = (_guarded(name) for name in METHODS)


class AsyncGuarded:
    """:class:`Guarded` for an asyncio transport (what :class:`BlockingTransport` drives, and
    what the parallel search and the soak await directly as its ``transport``)."""

    def __init__(self, transport: Any, limits: CallLimits) -> None:
        self.transport = transport
        self._limits = limits

    publish, claim, ack, nack, close = (_guarded_async(name) for name in METHODS)


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
        call = asyncio.ensure_future(awaitable, loop=self._loop)
        try:
            return self._loop.run_until_complete(call)
        except BaseException:
            # A stop (KeyboardInterrupt, a signal's exception) raised inside the loop's turn
            # leaves the call's task pending: the next run of the loop (the example's teardown
            # closing its transports) would resume it and raise the stop again, out of close().
            call.cancel()
            raise


async def _opened(factory, clock, namespace) -> Any:
    """The transport an asyncio backend's factory opens, the factory called inside the loop the
    transport's calls will run on: a factory that asks for the current event loop (a plain
    function calling ``asyncio.get_event_loop()``) gets that loop, on whatever thread."""
    made = call_factory(factory, clock, namespace)
    return await made if inspect.isawaitable(made) else made


def open_transport(factory, clock, namespace, loop: asyncio.AbstractEventLoop | None,
                   protocol: str = "harel-ref") -> Any:
    """Call ``factory(clock, namespace)`` (or ``factory(clock)``) under the current call limits,
    and guard what it opens; with a ``loop``, await it and wrap the async result.  A transport
    of harel's ``protocol`` is adapted to this package's (:mod:`harel_ref.stateful._harel`)."""
    limits = current_limits()
    what = "opening the transport"
    if loop is None:
        made = _call(limits, what, lambda: call_factory(factory, clock, namespace))
        if inspect.isawaitable(made):
            if inspect.iscoroutine(made):
                made.close()  # never awaited, on purpose
            raise TypeError(
                "the factory returned an awaitable: declare the backend async (is_async=True "
                "or --async) so the checker awaits it"
            )
        return Guarded(HarelAdapter(made) if protocol == "harel" else made, limits)
    made = loop.run_until_complete(_call_async(limits, what, lambda: _opened(factory, clock, namespace)))
    return BlockingTransport(AsyncGuarded(AsyncHarelAdapter(made) if protocol == "harel" else made, limits), loop)
