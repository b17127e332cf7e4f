"""The runs of one program, made several at once while they wait (SPEC.md C9a).

:func:`~harel_ref.stateful.parallel.check_program` makes up to ``repeats`` runs of a program and
judges each.  A run of a server transport, of one on a wall clock, or of a store that takes a
round trip per call spends most of its time waiting: for answers, and for leases and parks to
pass.  Runs are independent (each on a namespace of its own), so such waits can overlap:
:func:`runs_in_order` makes the first two runs one after another, and when the ones whose
branches ran in this process kept it busy for less than :data:`WAITING` of their time, it
makes the rest in :data:`LANES` threads at once, each keeping a bench of its own.  The runs
come back in their order (1, 2, 3, ...), so the caller judges them as it would runs made one
at a time: the first refused run is the same one, and a run that raised raises at its place.
A run that keeps the process busy (an in-memory store, SQLite's own work) is made one at a
time, as before: threads would only share the one GIL.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._async import release_call_thread

__all__ = ["LANES", "WAITING", "runs_in_order", "waited"]

LANES = 4
"""How many runs of one program are made at once when they wait.  A lane keeps its transports
open between runs, so a server sees up to this many times a run's connections."""

WAITING = 0.25
"""A run that kept this process's CPU busy for less than this part of its wall time is waiting:
the first two runs of a program are measured (those whose branches ran here, not in processes)."""

MEASURED = 2
"""How many runs are made one after another, and measured, before lanes may begin."""

Make = Callable[[int, Any], tuple[Any, Any]]
"""``make(number, kept) -> (run, kept)``: make run ``number`` on ``kept`` (None: open anew) and
return the run and what the next run may keep (None: nothing); on an exception it has closed
what it used."""


def runs_in_order(make: Make, close: Callable[[Any], None], repeats: int, *, here: Callable[[int], bool],
                  lanes: int = LANES) -> Iterator[tuple[int, Any]]:
    """Runs ``1..repeats`` made by ``make``, as ``(number, run)`` in their order; what ``make``
    raised, at its run's place.  ``here(number)``: whether run ``number``'s branches run in this
    process, so that its CPU time says whether it waited.  ``close(kept)`` closes what a run
    left for the next.  The caller may stop iterating at any run: the lanes then end after the
    run each is making, and close what they kept."""
    kept, busy, wall, number = None, 0.0, 0.0, 0
    try:
        while number < repeats:
            if number == MEASURED and lanes > 1 and waited(busy, wall):
                close(kept)  # each lane opens its own, in its own thread
                kept = None
                yield from _Lanes(make, close, range(number + 1, repeats + 1), lanes).in_order()
                return
            number += 1
            cpu, began = time.process_time(), time.perf_counter()
            held, kept = kept, None  # make closes it if it raises
            run, kept = make(number, held)
            if number <= MEASURED and here(number):
                busy, wall = busy + time.process_time() - cpu, wall + time.perf_counter() - began
            yield number, run
    finally:
        close(kept)


def waited(busy: float, wall: float) -> bool:
    """Whether runs that kept this process busy ``busy`` seconds of their ``wall`` seconds
    waited: for less than :data:`WAITING` of them (none measured: no)."""
    return wall > 0 and busy < WAITING * wall


class _Lanes:
    """Threads that make the runs ``numbers`` between them, at most ``2 * lanes`` ahead of the
    run the caller takes next."""

    def __init__(self, make: Make, close: Callable[[Any], None], numbers: range, lanes: int) -> None:
        self._make, self._close, self._numbers = make, close, iter(numbers)
        self._first, self._last = numbers.start, numbers.stop - 1
        self._made: dict[int, tuple[bool, Any]] = {}  # number -> (raised, the run or what it raised)
        self._changed = threading.Condition()
        self._ahead = threading.Semaphore(2 * lanes)
        self._stop = threading.Event()
        # each lane in a copy of this thread's context: the call limits its transports take
        self._threads = [threading.Thread(target=contextvars.copy_context().run, args=(self._lane,),
                                          name=f"harel-ref-lane-{n}", daemon=True) for n in range(lanes)]

    def in_order(self) -> Iterator[tuple[int, Any]]:
        for thread in self._threads:
            thread.start()
        try:
            for number in range(self._first, self._last + 1):
                raised, outcome = self._wait_for(number)
                self._ahead.release()
                if raised:
                    raise outcome
                yield number, outcome
        finally:
            self._stop.set()
            for _ in self._threads:
                self._ahead.release()  # a lane waiting for room wakes, sees the stop and ends
            for thread in self._threads:
                thread.join()

    def _wait_for(self, number: int) -> tuple[bool, Any]:
        with self._changed:
            while number not in self._made:
                if not any(thread.is_alive() for thread in self._threads):
                    raise RuntimeError(f"run {number} of the program was never made: every lane ended")
                self._changed.wait(timeout=1.0)
            return self._made.pop(number)

    def _lane(self) -> None:
        kept = None
        try:
            while True:
                self._ahead.acquire()
                if self._stop.is_set():
                    return
                with self._changed:
                    number = next(self._numbers, None)
                if number is None:
                    return
                held, kept = kept, None  # make closes it if it raises
                try:
                    run, kept = self._make(number, held)
                except BaseException as exc:  # the caller raises it at its place; this lane ends
                    self._put(number, True, exc)
                    return
                self._put(number, False, run)
        finally:
            with contextlib.suppress(Exception):
                self._close(kept)
            release_call_thread()

    def _put(self, number: int, raised: bool, outcome: Any) -> None:
        with self._changed:
            self._made[number] = (raised, outcome)
            self._changed.notify_all()
