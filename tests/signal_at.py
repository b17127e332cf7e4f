"""Run ``harel-ref certify`` and send it a real signal at a chosen point of the run.

    python tests/signal_at.py POINT SIGNAL HOW certify ARGS...

The signal is sent by the process to itself (``os.kill``), which Python handles before
``os.kill`` returns: the signal lands exactly at POINT, whatever the machine's speed.  As it
ends, it says on stderr how long the run took to stop after the signal.

POINT is one of :data:`POINTS`.  SIGNAL is ``SIGINT`` or ``SIGTERM``.  HOW is:

- ``raised``: the handler's exception surfaces where the signal landed;
- ``swallowed``: the signal lands inside a ``__del__``, where Python prints "Exception ignored"
  and goes on, as it did when a SIGTERM landed in Hypothesis's garbage-collection callback and
  the run went on to exit 0;
- ``twice``: raised at POINT, and sent again as the certifier closes its processes (an
  impatient second Ctrl-C);
- ``group``: sent to the whole process group, the search processes too, as a terminal's
  Ctrl-C is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from harel_ref import _cli
from harel_ref.certify import _certify, _driver, _engine, _report
from harel_ref.stateful import soak

POINTS = ("first-property", "between-verdicts", "last-property", "soak", "shrinking", "found", "closing", "report",
          "clean-up")


class _SignalOnDeletion:
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)


_SENT: list[float] = []  # time.monotonic() as the first signal was sent


def _send(signum: int, how: str) -> None:
    _SENT.append(time.monotonic())
    if how == "group":
        os.killpg(os.getpgrp(), signum)
    elif how == "swallowed":
        _SignalOnDeletion(signum)  # deleted at once: the handler's exception is ignored
    else:
        os.kill(os.getpid(), signum)


def _before(owner: object, name: str, when: Callable[..., bool], signal_now: Callable[[], None]) -> None:
    """Patch ``owner.name`` to call ``signal_now()`` before the first call for which
    ``when(*args)`` holds (the signal lands as that call begins)."""
    original = getattr(owner, name)
    sent = []

    def patched(*args, **kwargs):
        if not sent and when(*args):
            sent.append(True)
            signal_now()
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def _after(owner: object, name: str, when: Callable[..., bool], signal_now: Callable[[], None]) -> None:
    """Patch ``owner.name`` to call ``signal_now()`` after the first call for which
    ``when(*args)`` holds (the signal lands as that call has returned)."""
    original = getattr(owner, name)
    sent = []

    def patched(*args, **kwargs):
        answer = original(*args, **kwargs)
        if not sent and when(*args):
            sent.append(True)
            signal_now()
        return answer

    setattr(owner, name, patched)


def _arm(point: str, signum: int, how: str) -> None:
    """Make the signal land at ``point``."""
    send = lambda: _send(signum, how)  # noqa: E731
    console = _cli.Console
    chosen: list[str] = []
    _before(console, "planned", lambda self, plan: chosen.extend(plan.properties) or False, send)
    if point == "first-property":
        _before(console, "started", lambda self, prop: True, send)
    elif point == "last-property":
        _before(console, "started", lambda self, prop: prop == chosen[-1], send)
    elif point == "between-verdicts":  # as the second verdict is told, after the first was
        _before(console, "finished", lambda self, verdict: verdict.property == chosen[1], send)
    elif point == "soak":  # as the soak opens its first transport
        _before(soak, "open_transport", lambda *args: True, send)
    elif point == "shrinking":  # as a search that found a failure starts its first shrink step
        _before(_driver.Search, "next_example", lambda search: search.first is not None, send)
    elif point == "found":  # as the certifying process hears that a search found a failure (wherever it runs)
        _after(_engine.Certification, "event", lambda self, number, name, *args: name == "found", send)
    elif point == "closing":  # as the certifier ends its processes, after the searches
        _before(_certify, "_close_all", lambda *args: True, send)
    elif point == "report":
        _before(_report.Report, "write", lambda *args: True, send)
    elif point == "clean-up":
        _before(_cli, "remove_directory", lambda *args: True, send)
    else:
        raise SystemExit(f"unknown point {point!r}; choose from {POINTS}")
    if how == "twice" and point != "closing":
        _before(_certify, "_close_all", lambda *args: True, lambda: os.kill(os.getpid(), signum))


if __name__ == "__main__":
    point, name, how, *argv = sys.argv[1:]
    _arm(point, getattr(signal, name), how)
    try:
        sys.exit(_cli.main(argv))
    finally:  # how long the run took to stop, for docs/concurrency.md's measurements
        if _SENT:
            print(f"signal_at: the run stopped {time.monotonic() - _SENT[0]:.2f} s after the signal", file=sys.stderr)
