"""What drawing a machine's initialize rules from strategies built once saves (stateful/_initialize.py).

Runs the lockstep machine both ways, interleaved, on workload shapes a certification meets: a
passing transport searched (examples long, no shrinking), and broken ones searched and shrunk
(a failure shrinks through hundreds of short examples, where building the initialize rules'
strategy anew weighed most).  Each row is the CPU seconds of one run, min, median and max over
``--repeats`` fresh runs each way, and the ratio of the medians; "same" says whether both ways
drew the same choices in every example (they must).  Usage:

    python benchmarks/initialize_rules.py [--repeats 3] [--examples 60] [--shapes 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.control import current_build_context
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # broken.py

import broken  # noqa: E402
from harel_ref.stateful import Backend, Capabilities, make_machine  # noqa: E402
from harel_ref.transport import InMemoryTransport  # noqa: E402

SHAPES = {
    "in-memory, passes (searched)": InMemoryTransport,
    "group ids fold case (searched, shrunk)": broken.GroupIdsFoldCase,
    "nack to the back (searched, shrunk)": broken.NackToBack,
    "fairness ignored (searched, shrunk)": broken.FairnessIgnored,
}


def run(transport_class: type, built_once: bool, examples: int) -> tuple[float, list[tuple]]:
    """CPU seconds of one derandomized run, and every example's choices."""
    seen: list[tuple] = []
    backend = Backend("bench", lambda clock, namespace: transport_class(clock=clock), Capabilities())

    class Machine(make_machine(backend)):
        _initialize_built_once = built_once

        def teardown(self):
            seen.append(tuple(current_build_context().data.choices))
            super().teardown()

    start = time.process_time()
    try:
        run_state_machine_as_test(Machine, settings=settings(  # as a certification's search is set
            max_examples=examples, stateful_step_count=20, derandomize=True, database=None, deadline=None,
            phases=(Phase.explicit, Phase.generate, Phase.shrink), report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck)))
    except AssertionError:
        pass  # a broken transport's failure, shrunk
    return time.process_time() - start, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="only the first N shapes")
    args = parser.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| shape | Hypothesis's way: min / median / max s | built once: min / median / max s | ratio | same |")
    print("|---|---|---|---|---|")
    for name, transport_class in list(SHAPES.items())[:args.shapes]:
        times: dict[bool, list[float]] = {False: [], True: []}
        choices: dict[bool, list] = {}
        for _ in range(args.repeats):
            for built_once in (False, True):  # interleaved
                seconds, choices[built_once] = run(transport_class, built_once, args.examples)
                times[built_once].append(seconds)
        shown = {way: f"{min(t):.2f} / {statistics.median(t):.2f} / {max(t):.2f}" for way, t in times.items()}
        ratio = statistics.median(times[True]) / statistics.median(times[False])
        same = "yes" if choices[True] == choices[False] else "NO"
        print(f"| {name} ({len(choices[True])} examples) | {shown[False]} | {shown[True]} | {ratio:.2f} | {same} |",
              flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
