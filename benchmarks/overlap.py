"""How often the branches of a concurrent run really meet: in threads, tasks and processes.

    python benchmarks/overlap.py [--runs 300] [--rounds 2]

A race shows only when one branch's call lands inside another's window, often the few
microseconds between two statements of one call.  For each way the concurrent search can run
branches, this runs the same two-branch programs ``--runs`` times and prints:

- **overlap**: the share of runs in which calls of both branches were under way at one moment
  (``parallel.overlapped``), for the bundled SQLite transport and its asyncio twin (tasks);
- **shown**: for each broken SQLite variant of ``tests/broken.py``, the share of runs whose
  history the checker refused: how often the race was hit inside the window its variant
  leaves open (between two statements, or between a check and a write);
- the start skew (median gap between the branches' first calls) and the median call length.

Branch processes run twice: waiting for the start line (``stateful/_start.py``), and as they did
before it, each as soon as a barrier woke it.

Modes run interleaved, ``--rounds`` times, so that a change of the machine's load falls on all
of them alike; the load average is printed with the table.  Runs on files in /dev/shm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the broken variants

import broken  # noqa: E402
from harel_ref.stateful import Capabilities  # noqa: E402
from harel_ref.stateful._processes import BranchProcesses, FactoryRecipe  # noqa: E402
from harel_ref.stateful._start import StartLine  # noqa: E402
from harel_ref.stateful.parallel import Ack, Claim, Program, Publish, judge, overlapped, run_program  # noqa: E402

ACK_AND_PUBLISH = Program((Publish("g1", "e1"), Claim()), ((Ack("p0"),), (Publish("g1", "e2"),)))
TWO_ACKS = Program((Publish("g1", "e1"), Claim()), ((Ack("p0"),), (Ack("p0"),)))
TWO_CLAIMS = Program((Publish("g1", "e1"), Publish("g2", "e2")), ((Claim(),), (Claim(),)))

SUBJECTS = [  # (row, factory name in tests/broken.py or a bundled one, program, judged for a race)
    ("harel-ref SqliteTransport, ack ∥ publish", "bundled:sqlite", ACK_AND_PUBLISH, False),
    ("harel-ref AsyncSqliteTransport, ack ∥ publish", "bundled:sqlite-async", ACK_AND_PUBLISH, False),
    ("PublishGroupFirstApart (no-loss)", "publish_group_first_apart", ACK_AND_PUBLISH, True),
    ("PublishGroupFirstOverANetwork (no-loss)", "publish_group_first_over_a_network", ACK_AND_PUBLISH, True),
    ("AckDropsItsGroupApart (no-loss)", "ack_drops_its_group_apart", ACK_AND_PUBLISH, True),
    ("AckCheckThenDelete (fencing)", "ack_check_then_delete", TWO_ACKS, True),
    ("ClaimWithoutTransaction (single-in-flight)", "claim_without_transaction", TWO_CLAIMS, True),
]


def subject(source: str, directory: str):
    """The factory, whether it is async, and how branch processes build it again."""
    if source.startswith("bundled:"):
        from harel_ref.stateful.backends import load

        name = source.removeprefix("bundled:")
        backend = load(name)(directory)
        return backend.factory, backend.capabilities, backend.is_async, FactoryRecipe(bundled=name, directory=directory)
    factory = getattr(broken, source)
    return factory, factory.capabilities, False, FactoryRecipe(spec=f"broken:{source}", path=str(ROOT / "tests"))


class Tally:
    def __init__(self) -> None:
        self.runs = self.overlaps = self.shown = 0
        self.skews: list[float] = []
        self.lengths: list[float] = []

    def add(self, run, caps: Capabilities, judged: bool) -> None:
        self.runs += 1
        self.overlaps += overlapped(list(run.records))
        if judged:
            self.shown += judge(run, contention=True, histories=True, capabilities=caps) is not None
        firsts = {}
        for record in run.records:
            if record.worker.startswith("b"):
                firsts.setdefault(record.worker, record.invoke)
                if record.complete is not None:
                    self.lengths.append(record.complete - record.invoke)
        if len(firsts) == 2:
            first, second = firsts.values()
            self.skews.append(abs(first - second))

    def cell(self, judged: bool) -> str:
        shown = f"{100 * self.shown / self.runs:5.1f} %" if judged else "—"
        return (f"{100 * self.overlaps / self.runs:5.1f} % | {shown} | {1e6 * statistics.median(self.skews):,.0f} µs"
                f" | {1e6 * statistics.median(self.lengths):,.0f} µs")


class BarrierOnly(StartLine):
    """How branch processes started before the start line: each as soon as a barrier woke it."""

    def next(self, parties: int) -> list[float]:
        return [0.0] * parties  # long past: no wait

    def learn(self, *args) -> None:
        pass


MODES = ("threads", "processes", "processes, barrier only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs per row, mode and round (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as directory:
        os.environ["HAREL_BROKEN_DIR"] = directory
        built = [(row, *subject(source, directory), program, judged) for row, source, program, judged in SUBJECTS]
        tallies = {(row, mode): Tally() for row, *_ in built for mode in MODES}
        pools = {(row, mode): BranchProcesses(recipe, branches=2, is_async=is_async,
                                              start_line=BarrierOnly() if "barrier" in mode else None)
                 for row, _, _, is_async, recipe, _, _ in built for mode in MODES[1:]}
        try:
            for _ in range(args.rounds):
                for row, factory, caps, is_async, _, program, judged in built:
                    for mode in MODES:
                        pool = pools.get((row, mode))
                        for _ in range(args.runs):
                            run = run_program(factory, program, caps, is_async=is_async, processes=pool)
                            tallies[row, mode].add(run, caps, judged)
        finally:
            for pool in pools.values():
                pool.close()
    print(f"# {args.rounds} rounds × {args.runs} runs per row and mode; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    print("| transport, program | branches in | overlap | race shown | start skew | call |")
    print("|---|---|---|---|---|---|")
    for row, factory, caps, is_async, _, program, judged in built:
        for mode in MODES:
            shown = "tasks" if is_async and mode == "threads" else mode
            print(f"| {row} | {shown} | {tallies[row, mode].cell(judged)} |")


if __name__ == "__main__":
    main()
