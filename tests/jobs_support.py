"""Functions a search process of ``tests/test_jobs.py`` runs: module-level, so that a spawned
process can import them by name."""

from __future__ import annotations

import os
import signal


def run_nothing(target, context, task, started, event):
    """A search that finds nothing."""
    return None


def terminated_while_cleaning_up(target):
    """A clean-up during which the parent's SIGTERM arrives (as close() sends it to a worker
    that overstays its grace): it is deferred until the clean-up is done."""
    os.kill(os.getpid(), signal.SIGTERM)
