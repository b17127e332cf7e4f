"""What one call of a transport costs in Python, now and at an earlier commit, side by side.

For each transport (in-memory, and SQLite and its asyncio twin on a file in ``/dev/shm``, so
that no fsync hides the Python), a fresh interpreter publishes ``--messages`` messages into 100
groups, then claims and acks them all, and prints the microseconds per publish and per
claim+ack.  Each round runs every (side, transport) pair once, in a rotating order, and the
median over ``--rounds`` rounds is printed with the range and the ratio before / now (above 1:
now is faster).

The earlier commit is checked out with ``git worktree`` into a temporary directory, which is
removed afterwards; each side imports its own ``harel_ref`` from its own tree.

    python benchmarks/transport_calls.py --before HEAD~1
    python benchmarks/transport_calls.py --before 8a39f0a --messages 20000 --rounds 7

The load average is printed before and after: the machines are shared, so compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("memory", "sqlite", "sqlite-async")

ONE_RUN = r'''
import asyncio, json, os, sys, tempfile, time
kind, messages = sys.argv[1], int(sys.argv[2])

def events():
    return [(f"group-{n % 100}", f"event-{n}") for n in range(messages)]

def timed_sync(transport):
    began = time.perf_counter()
    for group, event in events():
        transport.publish(group, event)
    published = time.perf_counter()
    while (lease := transport.claim("bench", 60.0)) is not None:
        transport.ack(lease)
    done = time.perf_counter()
    transport.close()
    return published - began, done - published

async def timed_async(transport):
    began = time.perf_counter()
    for group, event in events():
        await transport.publish(group, event)
    published = time.perf_counter()
    while (lease := await transport.claim("bench", 60.0)) is not None:
        await transport.ack(lease)
    done = time.perf_counter()
    await transport.close()
    return published - began, done - published

with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as files:
    path = os.path.join(files, "queue.db")
    if kind == "memory":
        from harel_ref.transport import InMemoryTransport
        publish, drain = timed_sync(InMemoryTransport())
    elif kind == "sqlite":
        from harel_ref.transport import SqliteTransport
        publish, drain = timed_sync(SqliteTransport(path))
    else:
        from harel_ref.transport import AsyncSqliteTransport
        async def main():
            return await timed_async(await AsyncSqliteTransport.create(path))
        publish, drain = asyncio.run(main())
import harel_ref
print(json.dumps({"publish": publish / messages * 1e6, "claim+ack": drain / messages * 1e6, "from": harel_ref.__file__}))
'''


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def one_run(tree: Path, kind: str, messages: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", ONE_RUN, kind, str(messages)], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(found["from"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the run for {tree} imported harel_ref from {found['from']}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="the commit to compare with (default: HEAD)")
    parser.add_argument("--messages", type=int, default=10_000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is printed")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="transport-calls-") as scratch:
        before = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), args.before], cwd=ROOT, check=True)
        try:
            sides = {"before": before, "now": ROOT}
            print(f"transport_calls: before = {args.before}, now = this checkout; {args.messages} messages in 100 "
                  f"groups; {args.rounds} rounds; {os.cpu_count()} cores; load average at start {load()}")
            pairs = [(side, kind) for kind in TRANSPORTS for side in sides]
            found: dict[tuple[str, str], list[dict[str, float]]] = {pair: [] for pair in pairs}
            for round_number in range(args.rounds):
                turn = pairs[round_number % len(pairs):] + pairs[:round_number % len(pairs)]
                for side, kind in turn:
                    found[side, kind].append(one_run(sides[side], kind, args.messages))
            print(f"\n{'transport':<14} {'call':<10} {'before µs (range)':<24} {'now µs (range)':<24} {'before/now':>10}")
            for kind in TRANSPORTS:
                for call in ("publish", "claim+ack"):
                    cells, medians = [], []
                    for side in sides:
                        values = [run[call] for run in found[side, kind]]
                        medians.append(statistics.median(values))
                        cells.append(f"{medians[-1]:7.1f} ({min(values):.1f}-{max(values):.1f})")
                    print(f"{kind:<14} {call:<10} {cells[0]:<24} {cells[1]:<24} {medians[0] / medians[1]:>9.2f}x")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    print(f"\nload average at the end {load()}")


if __name__ == "__main__":
    main()
