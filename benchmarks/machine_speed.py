"""How fast the lockstep machine runs against the in-memory transport, sync and async.

Prints steps per second (a step is one rule: publish, claim, ack, ...) and examples per
second, side by side in one run.  Usage: python benchmarks/machine_speed.py [examples]
"""

from __future__ import annotations

import sys
import time

from hypothesis import Phase, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from harel_ref.stateful import make_machine
from harel_ref.stateful.backends.memory import memory, memory_async


def measure(backend, examples: int, steps: int) -> tuple[float, float, int]:
    counted = {"steps": 0}

    class Counted(make_machine(backend)):
        @invariant()
        def count_step(self):  # invariants run after every step (and once at the start)
            counted["steps"] += 1

    start = time.perf_counter()
    run_state_machine_as_test(
        Counted,
        settings=settings(
            max_examples=examples, stateful_step_count=steps, derandomize=True,
            database=None, deadline=None, phases=[Phase.generate],
        ),
    )
    elapsed = time.perf_counter() - start
    return counted["steps"] / elapsed, examples / elapsed, counted["steps"]


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    print(f"lockstep machine, {examples} examples of up to 50 steps, derandomized")
    results = {}
    for backend in (memory(), memory_async()):
        steps_per_s, examples_per_s, steps = measure(backend, examples, 50)
        results[backend.name] = steps_per_s
        print(f"  {backend.name:14} {steps_per_s:9.0f} steps/s  {examples_per_s:7.1f} examples/s  ({steps} steps)")
    print(f"  async/sync ratio: {results['memory-async'] / results['memory']:.2f}")


if __name__ == "__main__":
    main()
