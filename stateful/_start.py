"""When the branches of a concurrent run make their first call: a start line, staggered.

A race shows only when one branch's call lands inside another's window, often the few
microseconds between two statements.  Two things keep branches from meeting there:

- **Waking up.**  A barrier releases its waiters one by one; a process woken by it (a futex,
  then the scheduler) starts a millisecond or more after the first, longer than a whole call
  of an in-process transport.  So every branch waits for one moment instead, read from
  ``time.perf_counter`` (one clock across the processes of a Linux host), sleeping until a
  few milliseconds before it and spinning the rest.
- **Always the same phase.**  Started at the same moment, two branches meet at the same point
  of each other's calls run after run, and a window elsewhere is never hit.  So each branch
  starts at its own offset, drawn anew for every run from zero to the length of a typical call:
  over the runs of a program, each call's start sweeps across the other's whole call.

:class:`StartLine` learns both lengths from the last runs it has seen: how long the branches
took to be ready (opening a transport on a server takes longer than on a file), and how long
their calls took.
"""

from __future__ import annotations

import collections
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["StartLine", "wait_until"]

FIRST_LEAD = 0.05
"""Seconds from sending the branches out to the start line, before any run was seen."""

LEAD_BOUNDS = (0.002, 1.0)
"""The shortest and the longest lead a start line learns."""

SPIN = 0.003
"""Seconds a branch spins before its start: a process woken from a sleep a millisecond before
it started late by 0.3 ms or more in a quarter of the runs here (two branches and the
certifier on two cores); spinning the last 3 ms brought the median gap between two branches'
first calls from 340 µs to 70 µs, against 60 µs planned."""

REMEMBERED = 20
"""How many runs a start line learns from: the lead is half as long again as the slowest of
them took to be ready, the spread the median length of their calls."""


class StartLine:
    """The moments the branches of each run start at (see the module docstring)."""

    def __init__(self, seed: int | None = None) -> None:
        self.lead = FIRST_LEAD
        self.spread = 0.0  # how far apart branches start: a typical call's length, once seen
        self._random = random.Random(seed)
        self._sent = 0.0
        self._took: collections.deque[float] = collections.deque(maxlen=REMEMBERED)  # sent to ready, per run
        self._lengths: collections.deque[float] = collections.deque(maxlen=4 * REMEMBERED)  # of calls

    def next(self, parties: int) -> list[float]:
        """The start of each of ``parties`` branches, for a run whose branches are sent now."""
        self._sent = time.perf_counter()
        line = self._sent + self.lead
        return [line + self._random.uniform(0.0, self.spread) for _ in range(parties)]

    def learn(self, moments: Sequence[float], ready: Sequence[float], records: Sequence[Any]) -> None:
        """After a run: ``ready``, when each branch was ready to start; ``records``, its calls."""
        self._took.append(max(ready) - self._sent)
        low, high = LEAD_BOUNDS
        self.lead = min(high, max(low, 1.5 * max(self._took) + 0.001))
        self._lengths.extend(record.complete - record.invoke for record in records if record.complete is not None)
        if self._lengths:
            self.spread = statistics.median(self._lengths)


def wait_until(moment: float) -> None:
    """Return at ``moment`` (``time.perf_counter``), or at once if it is past: asleep until
    :data:`SPIN` seconds before it, then spinning."""
    left = moment - time.perf_counter()
    if left > 2 * SPIN:
        time.sleep(left - SPIN)
    while time.perf_counter() < moment:
        pass
