"""The runs of one program, made several at once while they wait (SPEC.md C9a).

:func:`~harel_ref.stateful.parallel.check_program` makes up to ``repeats`` runs of a program and
judges each.  A run of a server transport, of one on a wall clock, or of a store that takes a
round trip per call spends most of its time waiting: for answers, and for leases and parks to
pass.  Runs are independent (each on a namespace of its own), so such waits can overlap:
:func:`runs_in_order` makes the first two runs one after another, and when the second, its
branches in this process, took :data:`LONG_RUN` or more and kept it busy for less than
:data:`WAITING` of its time, it makes the rest in :data:`LANES` threads at once, each keeping a
bench of its own.  The runs come back in their order (1, 2, 3, ...), so the caller judges them
as it would runs made one at a time: a run that raised raises at its place.  A run that keeps the
process busy, or takes a moment (the in-memory store, SQLite's own work), is made one at a time,
as before: threads would only share the one GIL.

What runs beside a run can still change it where a store's limits are the server's, not the
namespace's (connections, rates): each run says whether it was made with others at once, and a
run made so that raised raises :class:`SeenBeside`, so that the caller makes the runs again one
at a time before it believes it (``check_program`` does the same for a refusal such a run
showed).  A lane keeps call limits of its own
(:func:`~harel_ref.stateful._async.limits_of_its_own`): a hang in a run made beside others
breaks nothing of the caller's.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._async import limits_of_its_own, release_call_thread

__all__ = ["LANES", "LANES_ON_A_WALL_CLOCK", "LONG_RUN", "MEASURED", "WAITING", "SeenBeside", "lanes_of_runs",
           "run_slots", "runs_in_order", "waited"]

LANES = 4
"""How many runs of one program are made at once when they wait.  A lane keeps its transports
open between runs, so a server sees up to this many times a run's connections."""

LANES_ON_A_WALL_CLOCK = 8
""":data:`LANES` for a transport that keeps time itself (SQS): each of its runs sleeps a second
or two while its leases pass, and little else."""

WAITING = 0.25
"""A run that kept this process's CPU busy for less than this part of its wall time is waiting:
the second run of a program is measured, if its branches ran here, not in processes (the first
opens the transports, which on a server is mostly waiting, however the runs go)."""

LONG_RUN = 0.005
"""Seconds the measured run must take for lanes to be worth their threads: a run of
the in-memory store takes about 1 ms, and under load its time off the CPU would look like waiting."""

MEASURED = 2
"""How many runs are made one after another before lanes may begin; the last of them is measured."""

JOIN_GRACE = 5.0
"""Seconds a caller that stopped iterating waits, in all, for the lanes to end the runs they are
making; a lane still making one after that ends on its own (it closes what it kept)."""

class SeenBeside(Exception):
    """What a run made beside other runs showed (it raised: its ``__cause__``; or its caller
    refused it): it may be theirs, where a store's limits are the server's.  Make the runs
    again one at a time to know."""


Make = Callable[[int, Any], tuple[Any, Any]]
"""``make(number, kept) -> (run, kept)``: make run ``number`` on ``kept`` (None: open anew) and
return the run and what the next run may keep (None: nothing); on an exception it has closed
what it used."""


def runs_in_order(make: Make, close: Callable[[Any], None], repeats: int, *, here: Callable[[int], bool],
                  lanes: int = LANES) -> Iterator[tuple[int, Any, bool]]:
    """Runs ``1..repeats`` made by ``make``, as ``(number, run, alone)`` in their order (``alone``:
    no other run was made at the same time); what ``make`` raised, at its run's place (as a
    :class:`SeenBeside` where the run was not made alone).
    ``here(number)``: whether run ``number``'s branches run in this process, so that its CPU time
    says whether it waited.  ``close(kept)`` closes what a run left for the next.  The caller may
    stop iterating at any run: the lanes then end after the run each is making."""
    kept, busy, wall, number = None, 0.0, 0.0, 0
    try:
        while number < repeats:
            if number == MEASURED and repeats - number >= lanes > 1 and waited(busy, wall):
                close(kept)  # each lane opens its own, in its own thread
                kept = None
                yield from _Lanes(make, close, range(number + 1, repeats + 1), lanes).in_order()
                return
            number += 1
            cpu, began = time.process_time(), time.perf_counter()
            held, kept = kept, None  # make closes it if it raises
            run, kept = make(number, held)
            if number == MEASURED and here(number):  # the first run opened the transports: not it
                busy, wall = time.process_time() - cpu, time.perf_counter() - began
            yield number, run, True
    finally:
        close(kept)


def lanes_of_runs(repeats: int, *, wall: bool) -> int:
    """The lanes :func:`runs_in_order` is given for a program of ``repeats`` runs: :data:`LANES`,
    and on a wall clock as many as the runs left after the measured ones, up to
    :data:`LANES_ON_A_WALL_CLOCK` (lanes start only where as many runs are left as there are lanes)."""
    return max(LANES, min(LANES_ON_A_WALL_CLOCK, repeats - MEASURED)) if wall else LANES


def run_slots(repeats: int, lanes: int) -> float:
    """How many runs' time ``repeats`` runs take when they wait (:func:`runs_in_order`): the
    measured ones one after another, the rest ``lanes`` at once where as many are left."""
    left = repeats - MEASURED
    return MEASURED + left / lanes if left >= lanes > 1 else float(repeats)


def waited(busy: float, wall: float) -> bool:
    """Whether a run that kept this process busy ``busy`` seconds of its ``wall`` seconds
    waited: it took :data:`LONG_RUN` or more, busy less than :data:`WAITING` of it (none
    measured, ``wall`` 0: no)."""
    return wall >= LONG_RUN and busy < WAITING * wall


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
        # each lane in a copy of this thread's context: the call deadline its transports take
        self._threads = [threading.Thread(target=contextvars.copy_context().run, args=(self._lane,),
                                          name=f"harel-ref-lane-{n}", daemon=True) for n in range(lanes)]

    def in_order(self) -> Iterator[tuple[int, Any, bool]]:
        grace = JOIN_GRACE
        try:
            for thread in self._threads:
                thread.start()
            for number in range(self._first, self._last + 1):
                raised, outcome = self._wait_for(number)
                self._ahead.release()
                if raised:
                    if not isinstance(outcome, Exception):  # a stop, or the interpreter's end
                        raise outcome
                    raise SeenBeside(f"run {number}, made beside others, raised {outcome!r}") from outcome
                yield number, outcome, False
        except (KeyboardInterrupt, SystemExit):
            grace = 0.0  # a stop: no wait for runs nobody will judge
            raise
        finally:
            self._stop.set()
            ends = time.monotonic() + grace
            for thread in self._threads:
                if thread.ident is not None:
                    thread.join(timeout=max(0.0, ends - time.monotonic()))

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
            with limits_of_its_own():
                while not self._stop.is_set():
                    if not self._ahead.acquire(timeout=0.2):
                        continue  # no room yet: the caller has not judged the runs ahead
                    with self._changed:
                        number = next(self._numbers, None)
                    if number is None or self._stop.is_set():
                        return
                    held, kept = kept, None  # make closes it if it raises
                    try:
                        run, kept = self._make(number, held)
                    except BaseException as exc:  # the caller raises it at its place; this lane ends
                        self._put(number, True, exc)
                        return
                    self._put(number, False, run)
        finally:
            try:
                self._close(kept)
            except Exception:  # noqa: BLE001 - the runs' own outcomes are what count
                pass
            release_call_thread()

    def _put(self, number: int, raised: bool, outcome: Any) -> None:
        with self._changed:
            self._made[number] = (raised, outcome)
            self._changed.notify_all()
