"""What a trip from the event loop to a thread and back costs, and which drivers free the loop.

    python benchmarks/thread_hop.py            # 5 interleaved rounds
    python benchmarks/thread_hop.py --rounds 1 --calls 2000

The asyncio twins of the SQLite transports choose where each call runs from these figures
(docs/performance.md):

- **a trip**: ``await`` a job that does nothing, or that writes 2 KiB and syncs it (a commit at
  FULL), through ``asyncio.to_thread``, ``loop.run_in_executor`` on a one-thread pool,
  aiosqlite (``execute_fetchall("SELECT 1")``), a thread woken and answering through
  ``call_soon_threadsafe``, and harel-ref's :class:`ConnectionThread` (an eventfd); each beside
  the same job run inline;
- **the GIL**: while a thread runs a 0.3-second query, how often the main thread gets to run
  (every millisecond if the driver lets go of the GIL; every 5 ms switch interval if not).

The ways are interleaved within each round; the median and range of the rounds are printed,
with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from harel_ref.transport._thread import ConnectionThread


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


class CallSoonThread:
    """A thread of one's own answering through ``call_soon_threadsafe`` (the loop's self-pipe)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, function = job
            loop.call_soon_threadsafe(future.set_result, function())

    def run(self, function: Callable[[], Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, function))
        return future

    def stop(self) -> None:
        self._jobs.put(None)


async def trips(calls: int, rounds: int, directory: str) -> None:
    try:
        import aiosqlite
    except ImportError:
        aiosqlite = None
        print("# skipped: the aiosqlite row, aiosqlite is not installed (it comes with harel: pip install -e '.[bench]')")
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    own, call_soon = ConnectionThread("harel-ref hop"), CallSoonThread()
    conn = None if aiosqlite is None else await aiosqlite.connect(":memory:")
    fd = os.open(os.path.join(directory, "synced"), os.O_RDWR | os.O_CREAT)
    page = b"x" * 2048

    def nothing() -> None:
        return None

    def commit() -> None:  # what a commit at FULL does to the disk, roughly: write, then sync
        os.pwrite(fd, page, 0)
        os.fsync(fd)

    ways: dict[str, Callable[[Callable[[], Any]], Any]] = {
        "inline (no trip)": lambda job: asyncio.sleep(0, job()),
        "asyncio.to_thread": asyncio.to_thread,
        "run_in_executor, a one-thread pool": lambda job: loop.run_in_executor(pool, job),
        "own thread, call_soon_threadsafe": call_soon.run,
        "ConnectionThread (eventfd)": own.run,
    }
    jobs = {"nothing": nothing, "write 2 KiB and fsync": commit}
    results: dict[tuple[str, str], list[float]] = {}
    for round_number in range(rounds):
        for job_name, job in jobs.items():
            count = calls if job_name == "nothing" else max(1, calls // 10)
            for way, hop in ways.items():
                start = time.perf_counter()
                for _ in range(count):
                    await hop(job)
                results.setdefault((job_name, way), []).append((time.perf_counter() - start) / count * 1e6)
            if job_name == "nothing" and conn is not None:
                start = time.perf_counter()
                for _ in range(count):
                    await conn.execute_fetchall("SELECT 1")
                results.setdefault((job_name, "aiosqlite, execute_fetchall('SELECT 1')"), []).append(
                    (time.perf_counter() - start) / count * 1e6)
        print(f"#   round {round_number + 1} of {rounds} done, {load()}", flush=True)
    if conn is not None:
        await conn.close()
    await own.stop()
    call_soon.stop()
    pool.shutdown()
    os.close(fd)

    print(f"\n| one call's trip, µs, median of {rounds} rounds (range) | job | µs per call | more than inline |")
    print("|---|---|---|---|")
    for (job_name, way), values in results.items():
        inline = statistics.median(results[(job_name, "inline (no trip)")])
        median = statistics.median(values)
        print(f"| {way} | {job_name} | {median:,.1f} ({min(values):,.1f}–{max(values):,.1f}) | {median - inline:+,.1f} |")


def gil(directory: str) -> None:
    """How often the main thread runs while another thread runs one long query."""
    query = ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 3000000)"
             " SELECT sum(i) FROM r")
    drivers: dict[str, Callable[[str], Any]] = {
        "stdlib sqlite3": lambda path: sqlite3.connect(path, check_same_thread=False)}
    try:
        import libsql

        drivers["libsql"] = lambda path: libsql.connect(path, _check_same_thread=False)
    except ImportError:
        print("# skipped: libsql is not installed (pip install -e '.[libsql]')")
    print("\n| while a thread runs one query | query took, s | the main thread ran, times | longest gap, ms |")
    print("|---|---|---|---|")
    for name, connect in drivers.items():
        conn = connect(os.path.join(directory, f"{name.split()[-1]}.db"))
        done = threading.Event()
        worker = threading.Thread(target=lambda: (conn.execute(query).fetchall(), done.set()))
        ticks, longest, start = 0, 0.0, time.perf_counter()
        worker.start()
        last = start
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            ticks, longest, last = ticks + 1, max(longest, now - last), now
        worker.join()
        print(f"| {name} | {time.perf_counter() - start:.2f} | {ticks} | {longest * 1e3:.1f} |")
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per way and round (a tenth for fsync jobs)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, python {sys.version.split()[0]}, {os.cpu_count()} cores, {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="harel-ref-hop-") as directory:
        asyncio.run(trips(args.calls, args.rounds, directory))
        gil(directory)
    print(f"\n# done, {load()}")


if __name__ == "__main__":
    main()
