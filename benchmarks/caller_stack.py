"""What a certification costs called from stacks of different depths, its searches on the
caller's thread or on a search thread of their own.

On CPython 3.11 a thread's frames live in 16 KiB chunks; a frame pushed at the edge of a chunk
maps a new chunk, and popping it unmaps it.  A search whose hot loop sits at that edge pays an
``mmap`` and a ``munmap`` per call, so what it costs depends on how deep its caller's stack is:
a pytest-xdist worker's is deeper than a command's.  Searches run on a search thread of their
own (a fresh stack, whatever the caller); with ``call_deadline=None`` they run on the caller's.

For each transport, each depth (frames put under the call to ``certify``) and each way, one
fresh interpreter certifies at a small profile and prints its CPU seconds and minor page faults
(each chunk mapped anew faults at least once).  The runs are interleaved: for each depth, each
way in turn.  Printed per transport and way: the minimum, median and maximum over the depths,
and the load average before and after.

    python benchmarks/caller_stack.py                      # memory-async, sqlite-async; depths 0-60
    python benchmarks/caller_stack.py --transports memory-async --depths 0,20,40 --examples 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ONE_RUN = r'''
import json, resource, sys, tempfile, time
from pathlib import Path
from harel_ref.certify import Profile, certify
from harel_ref.stateful.backends import load

name, depth, own_thread, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])

def at_depth(left):
    if left:
        return at_depth(left - 1)
    with tempfile.TemporaryDirectory() as files:
        backend = load(name)(Path(files))
        options = {} if own_thread else {"call_deadline": None}
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
        report = certify(backend.factory, backend.capabilities, is_async=backend.is_async,
                         profile=Profile("small", max_examples=examples, step_count=15), jobs=1, **options)
        after = resource.getrusage(resource.RUSAGE_SELF)
        return report.exit_code, time.process_time() - began, after.ru_minflt - before.ru_minflt

code, cpu, faults = at_depth(depth)
print(json.dumps({"exit": code, "cpu": cpu, "faults": faults}))
'''

WAYS = {"search thread": True, "caller's thread": False}


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def one_run(transport: str, depth: int, own_thread: bool, examples: int) -> dict:
    done = subprocess.run([sys.executable, "-c", ONE_RUN, transport, str(depth), "1" if own_thread else "0",
                           str(examples)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{transport} at depth {depth}: {done.stderr.strip()[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["exit"] != 0:
        raise SystemExit(f"{transport} at depth {depth} did not pass: exit code {found['exit']}")
    return found


def spread(values: list[float], form: str) -> str:
    return " / ".join(format(value, form) for value in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default="memory-async,sqlite-async", help="bundled transports, comma-separated")
    parser.add_argument("--depths", default=",".join(str(depth) for depth in range(0, 61, 4)),
                        help="frames under the call to certify, comma-separated (default 0, 4, ... 60)")
    parser.add_argument("--examples", type=int, default=25, help="examples per search (default 25)")
    args = parser.parse_args()
    depths = [int(depth) for depth in args.depths.split(",")]
    print(f"caller_stack: Python {sys.version.split()[0]}; {os.cpu_count()} cores; {len(depths)} depths "
          f"({args.depths}); {args.examples} examples a search; load average at start {load()}")
    print("\n| transport | searches on | CPU s, min / median / max | minor faults, min / median / max | load after |")
    print("|---|---|---|---|---|")
    for transport in args.transports.split(","):
        runs: dict[str, list[dict]] = {way: [] for way in WAYS}
        for depth in depths:
            for way, own_thread in WAYS.items():
                runs[way].append(one_run(transport, depth, own_thread, args.examples))
        for way in WAYS:
            cpu = [run["cpu"] for run in runs[way]]
            faults = [run["faults"] for run in runs[way]]
            print(f"| {transport} | {way} | {spread(cpu, '.2f')} | {spread(faults, ',.0f')} | {load()} |", flush=True)
    print(f"\nload average at the end {load()}")


if __name__ == "__main__":
    main()
