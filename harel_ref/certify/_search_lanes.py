"""One lockstep search whose examples run several at once, in *lanes* (SPEC.md C2a).

On a transport that keeps time on a wall clock (``Capabilities.clock == "wall"``: SQS), every
lease, park and shrink step lasts real seconds, and an example spends nearly all its time
asleep.  Its examples are independent (each opens transports on a namespace of its own), so
such a search is split into :data:`WALL_CLOCK_LANES` lanes, each a thread running its share of
the examples as a Hypothesis search of its own, with a seed of its own
(``"<seed>/lane<i>"``; lane 0 keeps the run's seed), its own call limits and, for lane 0
only, the probes.  The threads sleep at once, so the search takes about its longest lane.

The lanes are then read as one search, **in lane order**, so that which lane finished first
never shows: the search's failure is that of the first lane (by number) that failed, and
counts the examples of that lane and of those before it; a lane after it is stopped at its
next example once a lane before it found its failure, since nothing it finds could be shown.
Whether a search is split depends only on the transport's capabilities, so the same seed makes
the same lanes, and the report's replay command makes them again (C1)."""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable

from harel_ref.stateful import Capabilities
from harel_ref.stateful._async import limit_calls
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._properties import tally

from ._driver import Search, run_search
from ._profiles import Profile

__all__ = ["LANE_EXAMPLES", "WALL_CLOCK_LANES", "lanes_for", "lanes_of", "run_lockstep"]


WALL_CLOCK_LANES = 8
"""Lanes of a lockstep search on a wall clock: SQS's examples spend about 95 % of their time
asleep (docs/certify-speed.md), so eight lanes keep well under one core busy."""


LANE_EXAMPLES = 10
"""The fewest examples a lane runs: Hypothesis begins each search with its simplest example, so
a lane of very few would spend a large share of them on the same ones as the others."""


def lanes_for(caps: Capabilities) -> int:
    """How many lanes a lockstep search of a transport with ``caps`` may run in."""
    return WALL_CLOCK_LANES if caps.clock == "wall" else 1


def lanes_of(lanes: int, examples: int) -> int:
    """How many lanes a search of ``examples`` examples runs in, given ``lanes``: as many, but
    each of at least :data:`LANE_EXAMPLES` examples."""
    return max(1, min(lanes, examples // LANE_EXAMPLES))


def run_lockstep(machine: type, profile: Profile, run_seed: int, search: Search, examples: int,
                 aside: Callable[[Fact], bool], lanes: int = 1) -> None:
    """:func:`~._driver.run_search` of ``examples`` examples in :func:`lanes_of` lanes (one:
    as it is), what they saw read into ``search`` in lane order."""
    lanes = lanes_of(lanes, examples)
    shares = [examples // lanes + (number < examples % lanes) for number in range(lanes)]
    shares = [share for share in shares if share > 0]
    if len(shares) <= 1:
        run_search(machine, profile, run_seed, search, examples, aside)
        return
    searches = _lane_searches(search, len(shares))
    errors: list[BaseException | None] = [None] * len(shares)
    ended = [threading.Event() for _ in shares]

    def lane(number: int) -> None:
        try:
            with limit_calls(search.limits.deadline) as limits:
                searches[number].limits = limits
                lane_profile = profile if number == 0 else dataclasses.replace(profile, probe=0)
                lane_seed = run_seed if number == 0 else f"{run_seed}/lane{number}"
                run_search(machine, lane_profile, lane_seed, searches[number], shares[number], aside)
        except BaseException as exc:  # a stop, or the certifier's own error: raised by the caller
            errors[number] = exc
        finally:
            ended[number].set()

    for number in range(len(shares)):
        threading.Thread(target=lane, args=(number,), name=f"harel-ref-lane-{number}", daemon=True).start()
    for event in ended:  # Event.wait, not Thread.join: see in_line_calls
        while not event.wait(0.25):
            pass
    raised = next((error for error in errors if error is not None), None)
    if raised is not None:
        raise raised
    _read_lanes(search, searches)


def _lane_searches(search: Search, count: int) -> list[Search]:
    """A fresh :class:`Search` per lane, with ``search``'s time and shrink limits.  Each tells
    ``search``'s ``on_example`` the examples begun in all lanes, and its ``on_found`` its own
    failure; a lane's failure stops the lanes after it."""
    lock, begun, first_found = threading.Lock(), [0], [count]

    def on_example(_: int) -> None:
        with lock:
            begun[0] += 1
            done = begun[0]
        if search.on_example is not None:
            search.on_example(done)

    def lane_search(number: int) -> Search:
        def on_found(seen: Search) -> None:
            with lock:
                first_found[0] = min(first_found[0], number)
            if search.on_found is not None:
                search.on_found(seen)

        return Search(deadline=search.deadline, grace=search.grace, shrink_limit=search.shrink_limit,
                      on_example=on_example, on_found=on_found, halted=lambda: first_found[0] < number)

    return [lane_search(number) for number in range(count)]


def _read_lanes(search: Search, lanes: list[Search]) -> None:
    """What the lanes saw, as one search, into ``search``: the first failed lane's failure, and
    the counts of the lanes up to it (all of them when none failed)."""
    failed = next((number for number, lane in enumerate(lanes) if lane.outcome() is not None), None)
    base = lanes[failed] if failed is not None else lanes[0]
    counted = lanes[: failed + 1] if failed is not None else lanes
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
    for name in ("examples", "set_aside", "unjudged", "ended_at_echo", "clean", "probes_unrun"):
        merged[name] = sum(getattr(lane, name) for lane in counted)
    merged.update(
        wanted=sum(lane.wanted for lane in lanes), lanes=len(lanes),
        cut_short=any(lane.cut_short for lane in counted),
        storage_failed=next((lane.storage_failed for lane in counted if lane.storage_failed), None),
        unjudged_examples=[unjudged for lane in counted for unjudged in lane.unjudged_examples],
        echo=next((lane.echo for lane in counted if lane.echo is not None), None),
        ended_echo=next((lane.ended_echo for lane in counted if lane.ended_echo is not None), None),
        echoes=echoes, aside_facts=aside_facts, reached=reached,
        # the caller's: a lane's hang breaks the transport for the rest of the caller's search
        limits=search.limits, on_example=search.on_example, on_found=search.on_found, halted=search.halted,
    )
    if base.limits.broken is not None:
        search.limits.declare(base.limits.broken)
    vars(search).update(merged)
