"""Stopping a certification on SIGINT or SIGTERM, even when Python swallows the signal.

Python runs a signal's handler in the main thread, between two bytecodes of whatever runs
there, and the exception the handler raises surfaces at that point.  If the point is inside a
garbage-collection callback, a ``__del__`` or a weakref callback, Python prints "Exception
ignored in ..." and carries on as if no signal had come.  Hypothesis registers a gc callback
(it times collections), so a certification interrupted at the wrong moment ran to its end and
exited 0, "passed".  For a conformance kit that is the worst answer: a CI runner that killed a
run on its timeout would read it as success.

So a stop here is a record, not only an exception.  While :func:`stop_on_signals` is in force,
SIGINT and SIGTERM are recorded and then raised (as ``KeyboardInterrupt`` and
:class:`Terminated`), and the certifier looks at the record at its checkpoints
(:func:`raise_if_stopped`): before each example and program, while it waits for search
processes, and before it returns a report.  A swallowed signal stops the run at the next
checkpoint, a fraction of a second later, with the same exception the handler raised.

A checkpoint may never come: a transport's asyncio call that blocks its event loop and
swallows the exception, a call in C that lets no signal through.  So the first stop signal
also starts a timer: if the run is still inside :func:`stop_on_signals` :data:`STUCK_AFTER`
seconds later, the *last resorts* registered with :func:`last_resort` run in the timer's thread
(the engine's hands over the report so far and ends its processes, the command's writes the
report and removes its files), and the process exits ``128 +`` the signal's number.

The certifier may stop a run itself, from another thread: :func:`stop_from_thread` (the memory
limit's watch, harel_ref.certify._memory).  It sends the main thread a real stop signal
(``pthread_kill``, which, unlike ``interrupt_main``, also breaks a blocking wait such as the
wait for a transport's call), whose handler raises the stop's own exception; and the stop is
recorded, checked at the checkpoints and backed by the same timer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Terminated", "describe", "exit_status", "last_resort", "raise_if_stopped", "signals_deferred",
           "stop_from_thread", "stop_on_signals", "stopped_by", "stopping"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

STUCK_AFTER = 6.0
"""Seconds a run may take to stop by itself after a stop signal before the last resorts end it
(SPEC.md C8: a run stops within 10 s)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived.  A KeyboardInterrupt, so that Hypothesis and the certifier stop on it as
    on Ctrl-C (a SystemExit raised inside an example is reported as the example's failure)."""


_received: list[int] = []  # the stop signals that arrived while stop_on_signals() was in force
_requested: list[KeyboardInterrupt] = []  # a stop asked for by stop_from_thread() meanwhile
_waking: int | None = None  # the signal stop_from_thread() sent the main thread: its handler raises the stop
_deferring = 0  # how many signals_deferred() blocks the main thread is inside
_resorts: list[Callable[[KeyboardInterrupt, dict[str, Any]], None]] = []  # last_resort() actions, outermost first
_timer: threading.Timer | None = None  # started by the first stop signal of the run
_timer_lock = threading.RLock()  # a signal's handler (main thread) and stop_from_thread (another) may race


def _exception(signum: int) -> KeyboardInterrupt:
    return Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()


def describe(stop: KeyboardInterrupt) -> str:
    """What stopped a run, for a report: ``SIGTERM``, ``SIGINT``, or the ``why`` of a stop the
    certifier asked for (:func:`stop_from_thread`)."""
    return getattr(stop, "why", None) or ("SIGTERM" if isinstance(stop, Terminated) else "SIGINT")


def exit_status(stop: KeyboardInterrupt) -> int:
    """What a command stopped by ``stop`` exits with: ``128 +`` the signal's number, or the
    ``exit_status`` of a stop the certifier asked for."""
    if (status := getattr(stop, "exit_status", None)) is not None:
        return status
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def _record_and_raise(signum: int, frame: object) -> None:
    global _waking
    if _waking == signum and _requested:  # stop_from_thread's wake-up call
        _waking = None
        if not _deferring:
            raise _requested[0]
        return
    _received.append(signum)
    _start_timer(_exception(signum))
    if not _deferring:
        raise _exception(signum)


def _start_timer(stop: KeyboardInterrupt) -> None:
    global _timer
    with _timer_lock:
        if _timer is None:
            _timer = threading.Timer(STUCK_AFTER, _stuck, args=(stop,))
            _timer.daemon = True
            _timer.start()


def _stuck(stop: KeyboardInterrupt) -> None:
    """The run did not stop within :data:`STUCK_AFTER` seconds: the last resorts, innermost
    first (each may leave something in ``handed`` for the next), then the exit."""
    print(f"harel-ref: stopped by {describe(stop)} {STUCK_AFTER:g} s ago, the run has not stopped (a transport's "
          "call that lets no signal through?): writing the report so far and exiting", file=sys.stderr, flush=True)
    handed: dict[str, Any] = {}
    for action in reversed(list(_resorts)):
        try:
            action(stop, handed)
        except BaseException as exc:  # the next one, and the exit, must still come
            print(f"harel-ref: a last resort failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(handed.get("exit_status", exit_status(stop)))


@contextlib.contextmanager
def last_resort(action: Callable[[KeyboardInterrupt, dict[str, Any]], None]) -> Iterator[None]:
    """While inside, ``action(stop, handed)`` runs in the timer's thread if a run stopped (by a
    signal, or by :func:`stop_from_thread`) has not stopped :data:`STUCK_AFTER` seconds later
    (see the module docstring); ``stop`` is the exception that was raised.  The innermost runs
    first; ``handed`` carries what one leaves to the next (the engine's leaves the report so
    far as ``handed["report"]``, the command's may set ``handed["exit_status"]``)."""
    _resorts.append(action)
    try:
        yield
    finally:
        _resorts.remove(action)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Record and raise SIGINT and SIGTERM while inside (see the module docstring).

    A signal whose handler is the program's own is left to it; only Python's defaults (SIGINT
    raising KeyboardInterrupt, SIGTERM ending the process at once, leaving files and tables
    behind) are replaced.  Outside the main thread, and inside another ``stop_on_signals``,
    this does nothing; the outermost one forgets the signals of a run before it, puts the
    handlers back as it leaves, and then raises a signal that came after the last checkpoint
    (unless the block already ends with an exception)."""
    global _timer, _waking
    if not _in_main_thread() or _installed():
        yield
        return
    _received.clear()
    _requested.clear()
    _waking = None
    _timer = None
    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            previous[signum] = signal.signal(signum, _record_and_raise)
    try:
        yield
    finally:
        with signals_deferred():  # signal.signal runs a pending handler first: recorded, not raised
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            with _timer_lock:
                if _timer is not None:  # the run stopped by itself
                    _timer.cancel()
    _raise_recorded()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _installed() -> bool:
    return any(signal.getsignal(signum) is _record_and_raise for signum in STOP_SIGNALS)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Finish what is inside before a stop signal is raised: a clean-up, a report being
    written.  A signal that comes meanwhile is recorded, not raised: the next checkpoint
    (:func:`raise_if_stopped`, or the end of :func:`stop_on_signals`) raises it.  Only the
    main thread runs signal handlers, so in another thread this does nothing."""
    global _deferring
    if not _in_main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1


def stopped_by() -> int | None:
    """The first stop signal of the run under way (inside :func:`stop_on_signals`), or None."""
    return _received[0] if _received and _installed() else None


def stopping() -> bool:
    """Whether the run under way was stopped, by a signal or by :func:`stop_from_thread`: what
    it closes, it closes without waiting long."""
    return bool((_received or _requested) and _installed())


def stop_from_thread(stop: KeyboardInterrupt) -> bool:
    """Stop the run under way (inside :func:`stop_on_signals`, in the main thread) from another
    thread: ``stop`` is raised in the main thread at once (as a signal's exception would be),
    and again at each checkpoint, and the last resorts come :data:`STUCK_AFTER` seconds later
    if it has not stopped.  Returns False, doing nothing, when no run is under way or it is
    already stopping."""
    global _waking
    if not _installed() or _received or _requested:
        return False
    _requested.append(stop)
    _start_timer(stop)
    # A stop signal whose handler is ours: SIGINT, or SIGTERM where SIGINT was inherited ignored.
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is _record_and_raise:
            _waking = signum
            signal.pthread_kill(threading.main_thread().ident, signum)
            break
    return True


def raise_if_stopped() -> None:
    """A checkpoint: raise the stop again if a signal came, whether or not its exception got
    through.  Only while a :func:`stop_on_signals` is in force: a signal that stopped an
    earlier run does not stop a later one (in a thread, say)."""
    if _installed():
        _raise_recorded()


def _raise_recorded() -> None:
    if _received:
        raise _exception(_received[0])
    if _requested:
        raise _requested[0]
