"""One lockstep search whose examples run several at once, in *lanes* (SPEC.md C2a).

On a transport that keeps time on a wall clock (``Capabilities.clock == "wall"``: SQS), every
lease, park and shrink step lasts real seconds, and an example spends nearly all its time
asleep.  Its examples are independent (each opens transports on a namespace of its own), so
such a search is split into up to :data:`WALL_CLOCK_LANES` lanes, each a thread running its
share of the examples as a Hypothesis search of its own, with a seed of its own
(``"<seed>/lane<i>"``; lane 0 keeps the run's seed), its own call limits and, for lane 0
only, the probes.  The threads sleep at once, so the search takes about its longest lane.

The lanes are then read as one search, **in lane order**, so that which lane finished first
never shows: the search's failure is that of the first lane (by number) that found one, and
counts the examples of that lane and of those before it; a lane after it is stopped at its
next example once a lane before it found its failure, since nothing it finds could be shown.
How many lanes a search runs in depends only on the transport's capabilities, ``--lanes``
(``certify(lanes=)``, any transport, or a bundled transport's default, ``Backend.lanes``) and
the examples it is to run, so the same seed makes the same lanes, and the report's replay
command makes them again (C1)."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

from harel_ref.stateful import Capabilities
from harel_ref.stateful._async import STOP_WAIT, limit_calls, raise_stop_in
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._properties import tally

from ._driver import Search, run_search
from ._entries import gave_up
from ._profiles import Profile

__all__ = ["LANE_EXAMPLES", "MAX_LANES", "WALL_CLOCK_LANES", "lanes_for", "lanes_of", "run_lockstep"]


WALL_CLOCK_LANES = 8
"""Lanes of a lockstep search on a wall clock: SQS's examples spend nearly all their time
asleep, so eight lanes keep well under one core busy."""

MAX_LANES = 32
"""The most lanes a search may be asked for (``--lanes``): each is a thread with transports of
its own, and one interpreter runs their Python one at a time."""

LANE_EXAMPLES = 10
"""The fewest examples a lane runs: Hypothesis begins each search with its simplest example, so
a lane of very few would spend a large share of them on the same ones as the others."""


def lanes_for(caps: Capabilities) -> int:
    """How many lanes a lockstep search of a transport with ``caps`` may run in, unless lanes
    were asked for (``--lanes``, or a bundled transport's ``Backend.lanes``)."""
    return WALL_CLOCK_LANES if caps.clock == "wall" else 1


def lanes_of(lanes: int, examples: int) -> int:
    """How many lanes a search of ``examples`` examples runs in, given ``lanes``: as many, but
    each of at least :data:`LANE_EXAMPLES` examples."""
    return max(1, min(lanes, examples // LANE_EXAMPLES))


def run_lockstep(machine: type, profile: Profile, run_seed: int, search: Search, examples: int,
                 aside: Callable[[Fact], bool], lanes: int = 1) -> None:
    """:func:`~._driver.run_search` of ``examples`` examples in :func:`lanes_of` lanes (one:
    as it is), what they saw read into ``search`` in lane order.  A stop while they run stops
    every lane, as it stops a search thread, before it goes on up."""
    count = lanes_of(lanes, examples)
    if count == 1:
        run_search(machine, profile, run_seed, search, examples, aside)
        return
    shares = [examples // count + (number < examples % count) for number in range(count)]
    running = _Lanes(search, count)
    for number, share in enumerate(shares):
        lane_profile = profile if number == 0 else dataclasses.replace(profile, probe=0)  # probes: lane 0's
        lane_seed = run_seed if number == 0 else f"{run_seed}/lane{number}"
        running.start(number, lambda lane, p=lane_profile, s=lane_seed, n=share: run_search(machine, p, s, lane, n, aside))
    try:
        for ended in running.ended:  # Event.wait, not Thread.join: see in_line_calls
            while not ended.wait(0.25):
                pass
    except BaseException:
        running.stop()
        raise
    raised = next((error for error in running.errors if error is not None), None)
    if raised is not None:
        raise raised
    _read_lanes(search, running.searches)


class _Lanes:
    """The lanes of one search as they run: a fresh :class:`Search` each, with the caller's
    time and shrink limits, telling the caller's ``on_example`` the examples begun in all of
    them and its ``on_found`` a lane's failure while no lane before it has found one."""

    def __init__(self, search: Search, count: int) -> None:
        self.search, self.lock = search, threading.Lock()
        self.begun, self.first_found, self.stopped = 0, count, False
        self.searches = [Search(deadline=search.deadline, grace=search.grace, shrink_limit=search.shrink_limit,
                                on_example=self._on_example, on_found=self._on_found_in(number),
                                halted=self._halted_after(number)) for number in range(count)]
        self.threads: list[threading.Thread] = []
        self.ended = [threading.Event() for _ in range(count)]
        self.errors: list[BaseException | None] = [None] * count

    def start(self, number: int, run: Callable[[Search], None]) -> None:
        """Start lane ``number``: ``run(its search)`` in a thread, with call limits of its own."""
        def lane() -> None:
            try:
                with limit_calls(self.search.limits.deadline) as limits:
                    self.searches[number].limits = limits
                    run(self.searches[number])
            except BaseException as exc:  # a stop, or the certifier's own error: the caller raises it
                self.errors[number], self.stopped = exc, True
            finally:
                self.ended[number].set()

        thread = threading.Thread(target=lane, name=f"harel-ref-search-lane-{number}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Stop every lane still running, and wait for them as :func:`in_line_calls` waits."""
        self.stopped = True
        for thread, ended in zip(self.threads, self.ended):
            if not ended.is_set():
                raise_stop_in(thread)
        until = time.monotonic() + STOP_WAIT + 1.0  # a lane watching a search thread waits STOP_WAIT for it
        for ended in self.ended:
            ended.wait(max(0.0, until - time.monotonic()))

    def _halted_after(self, number: int) -> Callable[[], bool]:
        return lambda: self.stopped or self.first_found < number

    def _on_example(self, _: int) -> None:
        with self.lock:
            self.begun += 1
            if self.search.on_example is not None:
                self.search.on_example(self.begun)

    def _on_found_in(self, number: int) -> Callable[[Search], None]:
        def on_found(seen: Search) -> None:
            with self.lock:
                if number > self.first_found:
                    return  # a lane before it found one: this one can never be shown
                self.first_found = number
                if self.search.on_found is not None:
                    self.search.on_found(seen)
        return on_found


def _read_lanes(search: Search, lanes: list[Search]) -> None:
    """What the lanes saw, as one search, into ``search``: the failure of the first lane that
    found one (else the first that ended with Hypothesis giving up), and the counts of the
    lanes up to it (all of them when none did).  A hang in any lane breaks the caller's
    transport for the rest of its search, as a hang always does."""
    found = [number for number, lane in enumerate(lanes) if lane.outcome() is not None]
    decided = next((number for number in found if not gave_up(lanes[number].outcome())), found[0] if found else None)
    base = lanes[decided] if decided is not None else lanes[0]
    counted = lanes[: decided + 1] if decided is not None else lanes
    reached: collections.Counter = collections.Counter()
    aside_facts: dict = {}
    echoes: dict = {}
    for lane in counted:
        tally(reached, lane.reached)
        for key, fact in lane.aside_facts.items():
            aside_facts.setdefault(key, fact)
        for key, echo in lane.echoes.items():
            echoes.setdefault(key, echo)
    merged = {field.name: getattr(base, field.name) for field in dataclasses.fields(Search)}
    for name in ("examples", "wanted", "set_aside", "unjudged", "ended_at_echo", "clean", "probes_unrun"):
        merged[name] = sum(getattr(lane, name) for lane in counted)
    merged.update(
        lanes=len(lanes), cut_short=any(lane.cut_short for lane in counted),
        storage_failed=next((lane.storage_failed for lane in counted if lane.storage_failed), None),
        unjudged_examples=[unjudged for lane in counted for unjudged in lane.unjudged_examples],
        echo=next((lane.echo for lane in counted if lane.echo is not None), None),
        ended_echo=next((lane.ended_echo for lane in counted if lane.ended_echo is not None), None),
        echoes=echoes, aside_facts=aside_facts, reached=reached,
        limits=search.limits, on_example=search.on_example, on_found=search.on_found, halted=search.halted,
    )
    broken = [lane.limits.broken for lane in ([base] + lanes) if lane.limits.broken is not None]
    if broken:
        search.limits.declare(broken[0])
    vars(search).update(merged)
