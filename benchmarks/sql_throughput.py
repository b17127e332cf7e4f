"""SQLite and libSQL side by side: claim+ack throughput, and claim time against the backlog.

    python benchmarks/sql_throughput.py            # 1,000 and 1,000,000 queued messages
    python benchmarks/sql_throughput.py --large 100000

- Throughput: one worker claims and acks as fast as it can from a queue of 100 groups.
- Claim time: the median time of one claim with 1,000 and with 1,000,000 messages queued
  (10 per group), each claim followed by an untimed ack.  The claim walks the groups index
  and stops at the first free group, so the two should be close.

The backlog is bulk-inserted with ``executemany`` in one transaction through a plain
connection of the same driver, into tables the transport created.  Figures depend on the disk
and the machine; compare the columns, not the absolute numbers across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sqlite3
import tempfile
import time
from pathlib import Path

import libsql

from harel_ref.transport import LibsqlTransport, SqliteTransport

DRIVERS = {
    "SQLite": (SqliteTransport, lambda path: sqlite3.connect(path, isolation_level=None)),
    "libSQL": (LibsqlTransport, lambda path: libsql.connect(path, isolation_level=None)),
}
PER_GROUP = 10


def open_with_backlog(driver: str, directory: Path, messages: int, groups: int):
    """A transport on a new file holding ``messages`` messages spread over ``groups`` groups."""
    transport_class, connect = DRIVERS[driver]
    path = str(directory / f"{driver}-{messages}-{groups}.db")
    transport_class(path).close()  # creates the schema
    conn = connect(path)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO harel_transport_groups (group_id, priority) VALUES (?, 0)",
        [(f"g{g}",) for g in range(groups)],
    )
    conn.executemany(
        "INSERT INTO harel_transport_messages (group_id, event) VALUES (?, ?)",
        [(f"g{i % groups}", f'{{"n": {i}}}') for i in range(messages)],
    )
    conn.execute("COMMIT")
    conn.close()
    return transport_class(path)


def throughput(driver: str, directory: Path, seconds: float) -> float:
    queue = open_with_backlog(driver, directory, 100_000, 100)
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        lease = queue.claim("bench", 60)
        queue.ack(lease)
        done += 1
    queue.close()
    return done / elapsed


def claim_median_us(driver: str, directory: Path, messages: int, samples: int) -> float:
    queue = open_with_backlog(driver, directory, messages, max(1, messages // PER_GROUP))
    timings = []
    for _ in range(samples):
        start = time.perf_counter()
        lease = queue.claim("bench", 60)
        timings.append(time.perf_counter() - start)
        queue.ack(lease)
    queue.close()
    return statistics.median(timings) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000, help="smaller backlog (messages)")
    parser.add_argument("--large", type=int, default=1_000_000, help="larger backlog (messages)")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each throughput run")
    parser.add_argument("--samples", type=int, default=500, help="claims timed per backlog")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="harel-ref-bench-") as tmp:
        directory = Path(tmp)
        for driver in DRIVERS:
            started = time.perf_counter()
            results[driver] = {
                "ops": throughput(driver, directory, args.seconds),
                "small": claim_median_us(driver, directory, args.small, args.samples),
                "large": claim_median_us(driver, directory, args.large, args.samples),
            }
            print(f"# {driver} measured in {time.perf_counter() - started:.1f}s", flush=True)

    small, large = f"{args.small:,} queued", f"{args.large:,} queued"
    print()
    print(f"{'':38}{'SQLite':>14}{'libSQL':>14}{'libSQL/SQLite':>16}")
    rows = [
        ("claim+ack, one worker (ops/s)", "ops", "{:,.0f}"),
        (f"claim median, {small} (µs)", "small", "{:,.0f}"),
        (f"claim median, {large} (µs)", "large", "{:,.0f}"),
    ]
    for label, key, fmt in rows:
        sqlite_value, libsql_value = results["SQLite"][key], results["libSQL"][key]
        print(f"{label:38}{fmt.format(sqlite_value):>14}{fmt.format(libsql_value):>14}{libsql_value / sqlite_value:>15.2f}x")
    for driver in DRIVERS:
        ratio = results[driver]["large"] / results[driver]["small"]
        print(f"{driver}: claim at {large} / at {small} = {ratio:.2f}x")


if __name__ == "__main__":
    main()
