"""Run ``harel-ref certify`` and send it a real signal at a chosen point of the run.

    python tests/signal_at.py POINT SIGNAL HOW certify ARGS...

The signal is sent by the process to itself (``os.kill``), which Python handles before
``os.kill`` returns: the signal lands exactly at POINT, whatever the machine's speed.

POINT is one of :data:`POINTS`.  SIGNAL is ``SIGINT`` or ``SIGTERM``.  HOW is ``raised`` (the
handler's exception surfaces where the signal landed) or ``swallowed``: the signal lands inside
a ``__del__``, where Python prints "Exception ignored" and goes on, as it did when a SIGTERM
landed in Hypothesis's garbage-collection callback and the run went on to exit 0.
"""

from __future__ import annotations

import os
import signal
import sys

from harel_ref import _cli
from harel_ref.certify import _report

POINTS = ("first-property", "between-verdicts", "last-property", "report", "clean-up")


class _SignalOnDeletion:
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)


def _send(signum: int, how: str) -> None:
    if how == "swallowed":
        _SignalOnDeletion(signum)  # deleted at once: the handler's exception is ignored
    else:
        os.kill(os.getpid(), signum)


def _arm(point: str, signum: int, how: str) -> None:
    """Patch the function that runs at ``point`` to send the signal once, there."""
    sent = []

    def once() -> None:
        if not sent:
            sent.append(True)
            _send(signum, how)

    console = _cli.Console
    if point in ("first-property", "last-property"):
        started = console.started

        def started_then_signal(self, prop):
            started(self, prop)
            if point == "first-property" or prop == self.plan_properties[-1]:
                once()

        planned = console.planned

        def planned_and_kept(self, plan):
            self.plan_properties = plan.properties
            planned(self, plan)

        console.planned, console.started = planned_and_kept, started_then_signal
    elif point == "between-verdicts":
        finished = console.finished

        def finished_then_signal(self, verdict):
            finished(self, verdict)
            once()

        console.finished = finished_then_signal
    elif point == "report":
        write = _report.Report.write

        def signal_then_write(self, directory):
            once()
            return write(self, directory)

        _report.Report.write = signal_then_write
    elif point == "clean-up":
        remove = _cli.remove_directory

        def signal_then_remove(directory):
            once()
            remove(directory)

        _cli.remove_directory = signal_then_remove
    else:
        raise SystemExit(f"unknown point {point!r}; choose from {POINTS}")


if __name__ == "__main__":
    point, name, how, *argv = sys.argv[1:]
    _arm(point, getattr(signal, name), how)
    sys.exit(_cli.main(argv))
