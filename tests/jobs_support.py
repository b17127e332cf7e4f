"""Functions a search process of ``tests/test_jobs.py`` runs: module-level, so that a spawned
process can import them by name."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def run_nothing(target, context, task, started, event):
    """A search that finds nothing."""
    return None


def terminated_while_cleaning_up(target):
    """A clean-up during which the parent's SIGTERM arrives (as close() sends it to a worker
    that overstays its grace): it is deferred until the clean-up is done."""
    os.kill(os.getpid(), signal.SIGTERM)


def floods_then_waits(target, context, task, started, event):
    """A search that sends more progress than a pipe holds (a stopping parent reads none of
    it), says so in the file ``context["flooded"]``, and runs until it is stopped."""
    for _ in range(256):
        event("note", "x" * 1024)
    Path(context["flooded"]).touch()
    while True:
        time.sleep(0.05)
