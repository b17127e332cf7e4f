"""What a run of the concurrent search costs by how many branches its program has (SPEC.md C9).

Draws programs as the certifier does (``stateful.parallel.programs``, derandomized), groups them
by branch count (2 to 6), runs each a few times on each transport and times, per run, the run
itself and the checker's judgement of it (``judge``, refusals and histories, as the default
certification's concurrent search does).  Transports, interleaved program by program:

- ``memory`` and ``sqlite``: the bundled transports (a fresh namespace each run, no call raises);
- ``refuses a fourth``: the broken variant "a server that takes 3 connections" of
  ``tests/broken.py``, whose calls raise when more than three are under way: the checker's
  worst case, each raised call may have taken effect or not (R17).  Its rows say how many runs
  the checker left unjudged within ``parallel.UNCERTAIN_STEPS``.

Prints the minimum, median and maximum in milliseconds, and the load average before and after:
the machines are shared, so compare the rows of one run.

    python benchmarks/branches.py                 # 300 programs, 3 runs each
    python benchmarks/branches.py --programs 40 --runs 1
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings

import harel_ref.stateful._facts as facts
from harel_ref.stateful._properties import UNJUDGED
from harel_ref.stateful.backends import load
from harel_ref.stateful.parallel import judge, programs, run_program

ROOT = Path(__file__).resolve().parent.parent
RAISES = "refuses a fourth"


def drawn(count: int) -> dict[int, list]:
    """``count`` programs as the certifier draws them, by branch count."""
    found: list = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(programs())
    def collect(program):
        found.append(program)

    collect()
    by_width = collections.defaultdict(list)
    for program in found:
        by_width[len(program.branches)].append(program)
    return dict(sorted(by_width.items()))


def timed(backend, program, runs: int, reached: collections.Counter, raises: bool) -> list[tuple[float, float]]:
    """(run, judge) seconds of ``runs`` runs of ``program``.  A transport that ``raises`` is judged
    as the search's second pass judges one already shown to raise under contention: its errors
    no longer refusals, each raised call a call that may or may not have taken effect."""
    ignore = frozenset({facts.RAISED_UNDER_CONTENTION}) if raises else frozenset()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        run = run_program(backend.factory, program, backend.capabilities)
        ran = time.perf_counter()
        judge(run, contention=not raises, histories=True, ignore=ignore, capabilities=backend.capabilities,
              reached=reached)
        times.append((ran - began, time.perf_counter() - ran))
    return times


def spread(values: list[float]) -> str:
    return f"{min(values) * 1e3:.1f} / {statistics.median(values) * 1e3:.1f} / {max(values) * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300, help="programs drawn (all widths together)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each program on each transport")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # Hypothesis warns of .example()-like use of @given here
    sys.path.insert(0, str(ROOT / "tests"))
    from broken import broken_backend

    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores\n")
    with tempfile.TemporaryDirectory() as scratch:
        backends = {"memory": load("memory")(Path(scratch)), "sqlite": load("sqlite")(Path(scratch)),
                    RAISES: broken_backend("a server that takes 3 connections")}
        print("| branches | programs | transport | run ms: min / median / max | judge ms: min / median / max "
              "| runs unjudged |")
        print("|---|---|---|---|---|---|")
        for width, group in drawn(args.programs).items():
            times = {name: [] for name in backends}
            unjudged = {name: collections.Counter() for name in backends}
            for program in group:  # interleaved: each program on every transport in turn
                for name, backend in backends.items():
                    times[name] += timed(backend, program, args.runs, unjudged[name], name == RAISES)
            for name in backends:
                runs, judged = [t for t, _ in times[name]], [j for _, j in times[name]]
                print(f"| {width} | {len(group)} | {name} | {spread(runs)} | {spread(judged)} "
                      f"| {unjudged[name][UNJUDGED]} of {len(runs)} |", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
