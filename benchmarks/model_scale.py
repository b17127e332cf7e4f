"""How the model and the machine's judging scale with the number of groups (SPEC.md C13).

For queues of 10 to 10,000 groups, each holding one message with every other group's head
leased (the claim that must find the one free group behind them all), prints the time of:

- ``claim_outcomes``: every answer a claim may give (sorted by stamp and arrival, the groups
  ahead of each found by bisection);
- ``claimable``: whether one group's head is allowed, the question the lockstep machine asks
  of every claim that answered a message (one pass over the groups);
- the rule pair by pair (R4 as SPEC.md states it, every group against every other), as the
  model computed it before C13, up to 1,000 groups.

Each figure is the minimum, median and maximum of ``--repeats`` runs, each on a fresh model,
with the load average it ran under.  Usage: python benchmarks/model_scale.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from harel_ref.model import QueueModel, When
from harel_ref.model import _queue


def backlog(groups: int) -> QueueModel:
    """``groups`` groups of one message, every one but the last leased, claimed one by one."""
    q = QueueModel("claim")
    for number in range(groups):
        q.publish(f"g{number}", "e")
    for number in range(groups - 1):
        q.take(q.head(f"g{number}"), f"t{number}", 1000.0 + number, 60.0)
    return q


def pairwise(q: QueueModel, now: When) -> frozenset:
    eligible = list(q._groups.values())
    allowed = set()
    for group in eligible:
        ahead = [a for a in eligible if a is not group and q._before(a, group)]
        if _queue._may_be_first_free(group, min([math.inf, *map(_queue._in_flight_until, ahead)]), now):
            allowed.add(_queue._head(group))
    return frozenset(allowed)


def timed(call, repeats: int, groups: int) -> tuple[float, float, float]:
    seconds = []
    for _ in range(repeats):
        q = backlog(groups)
        now = When.at(1000.0 + groups)
        began = time.perf_counter()
        call(q, now, groups)
        seconds.append(time.perf_counter() - began)
    return min(seconds), statistics.median(seconds), max(seconds)


def ms(figures: tuple[float, float, float]) -> str:
    return " / ".join(f"{1000 * f:.3f}" for f in figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores; "
          f"{args.repeats} fresh models each; ms, min / median / max\n")
    print("| groups | claim_outcomes | claimable (last group) | pair by pair | pair by pair / claim_outcomes |")
    print("|---|---|---|---|---|")
    for groups in (10, 100, 1000, 10_000):
        outcomes = timed(lambda q, now, n: q.claim_outcomes(now), args.repeats, groups)
        one = timed(lambda q, now, n: q.claimable(f"g{n - 1}", now), args.repeats, groups)
        if groups <= 1000:
            slow = timed(lambda q, now, n: pairwise(q, now), args.repeats, groups)
            ratio = f"{slow[1] / outcomes[1]:.0f}x"
            print(f"| {groups:,} | {ms(outcomes)} | {ms(one)} | {ms(slow)} | {ratio} |")
        else:
            print(f"| {groups:,} | {ms(outcomes)} | {ms(one)} | not run (minutes) | |")
    q = backlog(1000)
    assert q.claim_outcomes(When.at(2000.0)) == pairwise(q, When.at(2000.0))  # alike, as tests/test_model_scale.py checks
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
