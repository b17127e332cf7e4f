"""harel-ref beside the queues a user would pick instead: claim+ack throughput and claim latency.

    pip install -e '.[bench]'                  # harel 0.9.0, persist-queue, litequeue
    bash .ci/cluster up                        # for the rqlite rows (or --no-rqlite)
    python benchmarks/peers.py                 # 8 fresh opens of each peer, full sizes
    python benchmarks/peers.py --only throughput --event-bytes 50,108,200,1000   # issue 43's run
    python benchmarks/peers.py --scale 0.1 --rounds 1 --opens 2   # smaller, to try it out

**Throughput**: one worker claims and acks until the queue is empty (``--messages`` in
``--groups`` groups, bulk-loaded before the clock starts).  The peers:

- harel-ref ``SqliteTransport`` and its async and libSQL siblings (each also as a ratio to the
  sync SQLite figure);
- harel 0.9.0's ``SqliteTransport``: the same tables, but an ack and a nack by seq alone
  (unfenced, SPEC R10) and events parsed by pydantic;
- persist-queue's ``SQLiteAckQueue`` and litequeue: no groups at all, so no single-in-flight;
- the **raw limit**: the same work in two plain transactions per message, that is harel-ref's
  own claim and ack statements run by plain ``sqlite3`` (no checks, no plan, no lock, SQL built
  once): the ratio to it is what harel-ref's Python costs;
- the **floor**: the least any SQLite queue with acks does on this disk, two one-statement
  write transactions per message on a job table without groups.

Every table is measured at each ``--synchronous`` level in turn (FULL, EXTRA and NORMAL by
default), set on every SQLite peer's connection (WAL everywhere but harel 0.9.0's libSQL
transport) except litequeue, which sets ``synchronous=NORMAL`` itself, and for each size of
event (``--event-bytes``, 108 by default).  What a level syncs differs between peers: at FULL
harel-ref syncs every call but a claim, and harel 0.9.0 and the plain queues every commit; at
EXTRA every peer syncs every commit.  So the **like-with-like** tables drain, interleaved,
harel-ref's four transports at EXTRA (every commit synced) and at FULL (claims unsynced)
beside harel 0.9.0's same transport at FULL (every commit synced).  ``--only profile`` splits
one claim+ack of harel-ref into its statements and its Python.

Each peer is opened afresh ``--opens`` times (8), each time on a new file, all peers drained
in lockstep in each round.  Every open's msg/s, minor page faults and system CPU time (the
process's ``getrusage`` over that peer's turns) are kept, and each row gives the minimum,
median and maximum: a transport can be fast in one open and slow in the next (issue 43: half
of harel-ref's opens ran at half speed, with 50 page faults a claim+ack), which a median
hides.  A peer whose slowest open is under 0.8 of its fastest gets a loud WARNING line (not an
exit code: a busy machine does it too, and the page faults tell the two apart).

**Claim latency** (the median of ``--samples`` claims, each followed by an untimed ack), for
harel-ref on SQLite, libSQL and rqlite, and harel 0.9.0 on SQLite and libSQL:

- (a) 1,000 messages in 100 groups;
- (b) 200,000 messages in 20,000 groups;
- (c) 1,000 free groups behind 20,000 blocked ones (half leased, half parked, all ahead in
  round-robin order);
- (d) 1,000,000 messages in 100,000 groups.

Throughput peers are drained together, ``--chunk`` messages each in a shuffled turn.  Each
latency is measured three times (``--rounds``), one scenario's peers in a rotating order, and
the median is printed with the range.  The load average is printed
before and after: compare ratios, not absolute numbers across machines.  A peer that is not
installed (or an rqlite cluster that is not up) is skipped with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import random
import re
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harel_ref.transport import (
    AsyncLibsqlTransport,
    AsyncSqliteTransport,
    LibsqlTransport,
    RqliteTransport,
    SqliteTransport,
)
from harel_ref.transport._sql import PAGE_SIZE, TEMP_IN_MEMORY, WAL_BYTES

RQLITE = os.environ.get("HAREL_RQLITE_URLS", "http://127.0.0.1:4001,http://127.0.0.1:4011,http://127.0.0.1:4021")
FAR = 1e12  # a lease or park end that no benchmark outlives


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000, help="throughput: messages to drain")
    parser.add_argument("--groups", type=int, default=500, help="throughput: groups they are in")
    parser.add_argument("--chunk", type=int, default=100, help="throughput: claim+acks per peer per turn")
    parser.add_argument("--samples", type=int, default=300, help="latency: claims timed per scenario and round")
    parser.add_argument("--rounds", type=int, default=3, help="latency: rounds per scenario")
    parser.add_argument("--opens", type=int, default=8, help="throughput: fresh opens of every peer, drained in lockstep")
    parser.add_argument("--event-bytes", default=[108], type=sizes,
                        help="throughput: the events' sizes, comma-separated (at least 46), a table for each (default 108)")
    parser.add_argument("--scale", type=float, default=1.0, help="latency: scenario sizes times this (0.1 to try it out)")
    parser.add_argument("--no-rqlite", action="store_true", help="leave out the rqlite columns")
    parser.add_argument("--only", choices=["throughput", "like", "latency", "profile"],
                        help="run one kind of table (throughput: those at each level and the like-with-like ones)")
    parser.add_argument("--peers", type=re.compile, default=None,
                        help="throughput: only the peers whose name matches this regular expression (with the raw limit)")
    parser.add_argument("--synchronous", default="FULL,EXTRA,NORMAL", type=levels,
                        help="the PRAGMA synchronous levels to measure at, each in turn (default FULL,EXTRA,NORMAL)")
    args = parser.parse_args()

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, python {sys.version.split()[0]}, "
          f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cores, {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="harel-ref-peers-") as tmp:
        for level in args.synchronous:
            for event_bytes in args.event_bytes if args.only in (None, "throughput") else ():
                throughput_table(Path(tmp), args, level, event_bytes)
            if args.only in (None, "profile"):
                where_time_goes(Path(tmp), args.messages, level)
        for event_bytes in args.event_bytes if args.only in (None, "throughput", "like") else ():
            like_with_like_table(Path(tmp), args, event_bytes)
        if args.only in (None, "profile"):
            python_parts()
            wal_frames(Path(tmp))
        for level in args.synchronous:
            if args.only in (None, "latency"):
                latency_table(Path(tmp), args, level)
    print(f"\n# done, {load()}")


def levels(text: str) -> list[str]:
    """``--synchronous``: FULL, NORMAL or EXTRA, comma-separated."""
    chosen = [level.strip().upper() for level in text.split(",")]
    if not chosen or any(level not in ("FULL", "NORMAL", "EXTRA") for level in chosen):
        raise argparse.ArgumentTypeError(f"expected FULL, NORMAL or EXTRA, comma-separated; got {text!r}")
    return chosen


def sizes(text: str) -> list[int]:
    """``--event-bytes``: whole numbers of bytes, comma-separated."""
    try:
        chosen = [int(size) for size in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers, comma-separated; got {text!r}") from None
    for size in chosen:
        event_of(size)  # refuses one too small
    return chosen


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def spread(values: list[float], fmt: str) -> str:
    """The median, and the range of the rounds."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def rounds(peers: dict[str, Any], count: int, measure: Callable[[str, Any], float | None]) -> dict[str, list[float]]:
    """``measure(name, peer)`` for every peer, ``count`` times, in a rotating order."""
    names, results = list(peers), {name: [] for name in peers}
    for round_number in range(count):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            value = measure(name, peers[name])
            if value is not None:
                results[name].append(value)
        print(f"#   round {round_number + 1} of {count} done, {load()}", flush=True)
    return {name: values for name, values in results.items() if values}


# --- Loading a backlog in bulk -------------------------------------------------------------------
# harel-ref and harel 0.9.0 share the seeds' table and column names (harel_transport_messages,
# harel_transport_groups), so one loader fills both.  A blocked group's lease is on its head's row
# in harel 0.9.0 and on the group's row in harel-ref (schema version 6), with its claimable_at.


@dataclass(frozen=True)
class Backlog:
    """``groups`` groups of ``per_group`` messages, and ``blocked`` more groups of one message
    each, whose head is leased (even) or parked (odd) until ``FAR`` and which come first in
    round-robin order (``last_claimed_at`` 1, against 2 for the others)."""

    groups: int
    per_group: int
    blocked: int = 0
    event: str = '{"kind": "bench", "data": {"n": 0}}'

    @property
    def messages(self) -> int:
        return self.groups * self.per_group + self.blocked

    def statements(self, prefix: str = "harel", lease_on_group: bool = True) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        """(sql, rows) pairs that load this backlog into empty tables named with ``prefix``, the
        blocked heads' leases on their groups' rows (harel-ref) or on their own (harel 0.9.0)."""
        messages, groups = f"{prefix}_transport_messages", f"{prefix}_transport_groups"
        blocked = [f"b{i}" for i in range(self.blocked)]
        free = [f"g{i}" for i in range(self.groups)]
        yield (f"INSERT INTO {groups} (group_id, last_claimed_at, priority) VALUES (?, ?, ?)",
               [(g, 1.0, 0) for g in blocked] + [(g, 2.0, 0) for g in free])
        yield (f"INSERT INTO {messages} (group_id, event) VALUES (?, ?)",
               [(g, self.event) for g in blocked] + [(free[i % self.groups], self.event) for i in range(self.groups * self.per_group)])
        holders = [("bench:held" if i % 2 == 0 else "__parked__", FAR, g) for i, g in enumerate(blocked)]
        if lease_on_group:
            yield (f"UPDATE {groups} SET locked_by = ?, lock_expiry = ?, claimable_at = {FAR} WHERE group_id = ?", holders)
        else:
            yield (f"UPDATE {messages} SET locked_by = ?, lock_expiry = ? WHERE group_id = ?", holders)


def event_of(size: int) -> str:
    """An event of ``size`` bytes (at least 46): JSON that harel 0.9.0 parses as an Event."""
    empty = '{"kind": "bench", "data": {"n": 0, "pad": ""}}'
    if size < len(empty):
        raise argparse.ArgumentTypeError(f"an event has at least {len(empty)} bytes, got {size}")
    return empty.replace('""', '"' + "x" * (size - len(empty)) + '"')


def load_sqlite(path: Path, backlog: Backlog, connect: Callable[[str], Any]) -> None:
    """Load ``backlog`` through a plain connection of the transport's own driver."""
    conn = connect(str(path))
    columns = [row[1] for row in conn.execute("PRAGMA table_info(harel_transport_groups)").fetchall()]
    conn.execute("BEGIN IMMEDIATE")
    for sql, rows in backlog.statements(lease_on_group="locked_by" in columns):
        conn.executemany(sql, rows)
    conn.execute("COMMIT")
    conn.close()


def load_rqlite(url: str, prefix: str, backlog: Backlog, batch: int = 5_000) -> None:
    """Load ``backlog`` into an rqlite cluster, ``batch`` rows per statement."""
    import httpx

    def literal(value: Any) -> str:
        return repr(value) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "''") + "'"

    with httpx.Client(timeout=600) as client:
        for sql, rows in backlog.statements(prefix):
            if sql.startswith("INSERT"):
                head, _ = sql.split(" VALUES ")
                for start in range(0, len(rows), batch):
                    values = ", ".join("(" + ", ".join(map(literal, row)) + ")" for row in rows[start:start + batch])
                    client.post(f"{url}/db/execute", json=[f"{head} VALUES {values}"]).raise_for_status()
            else:
                for start in range(0, len(rows), batch):
                    statements = [[sql, *row] for row in rows[start:start + batch]]
                    client.post(f"{url}/db/execute?transaction", json=statements).raise_for_status()


# --- The peers ------------------------------------------------------------------------------------


def harel_event() -> Any:
    from harel.spec.states import Event

    return Event(kind="bench", data={"n": 0})


@dataclass
class Queue:
    """A queue under test, seen through three callables."""

    claim: Callable[[], Any]  # -> a lease or None
    ack: Callable[[Any], Any]
    close: Callable[[], None]

    def run(self, count: int) -> int:
        """Claim and ack up to ``count`` messages; how many there were."""
        for done in range(count):
            lease = self.claim()
            if lease is None:
                return done
            self.ack(lease)
        return count


def harel_ref_queue(transport: Any) -> Queue:
    return Queue(lambda: transport.claim("bench", 60.0), transport.ack, transport.close)


def harel_queue(transport: Any) -> Queue:
    close = getattr(transport, "close", lambda: None)
    return Queue(lambda: transport.claim("bench", 60.0), transport.ack, close)


def sqlite_connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def libsql_connect(path: str) -> Any:
    import libsql

    return libsql.connect(path, isolation_level=None)


def at_level(conn: Any, level: str) -> None:
    """Set ``PRAGMA synchronous`` on a peer's connection (harel 0.9.0 and the plain queues have no
    option for it; harel-ref's transports take ``synchronous=``)."""
    conn.execute(f"PRAGMA synchronous = {level}")


def open_harel_ref(kind: str, directory: Path, backlog: Backlog, level: str = "FULL") -> Queue:
    """harel-ref's transport ``kind`` ("sqlite", "libsql", "rqlite") holding ``backlog``, its
    commits at ``synchronous=level`` (rqlite keeps its own settings)."""
    if kind == "rqlite":
        prefix = f"bench_{uuid.uuid4().hex[:12]}"
        transport = RqliteTransport.from_url(RQLITE, prefix=prefix)
        load_rqlite(transport._core.nodes.urls[0], f"{prefix}_harel", backlog)
        return Queue(lambda: transport.claim("bench", 60.0), transport.ack,
                     lambda: (transport.close(), drop_rqlite(RQLITE, [f"{prefix}_harel_transport_{t}" for t in ("messages", "groups", "meta")])))
    path = directory / f"harel-ref-{kind}-{uuid.uuid4().hex[:8]}.db"
    transport_class, connect = {"sqlite": (SqliteTransport, sqlite_connect), "libsql": (LibsqlTransport, libsql_connect)}[kind]
    transport_class(path).close()  # creates the schema
    load_sqlite(path, backlog, connect)
    return harel_ref_queue(transport_class(path, synchronous=level))


def open_harel(kind: str, directory: Path, backlog: Backlog, level: str = "FULL", page_size: int | None = None) -> Queue:
    """harel 0.9.0's transport ``kind`` ("sqlite", "libsql") holding ``backlog``, in a file of
    SQLite's default page size (as harel makes it), or of ``page_size`` bytes."""
    from harel.engine.transport.libsql import LibsqlTransport as HarelLibsql
    from harel.engine.transport.sqlite import SqliteTransport as HarelSqlite

    path = directory / f"harel-{kind}-{uuid.uuid4().hex[:8]}.db"
    transport_class, connect = {"sqlite": (HarelSqlite, sqlite_connect), "libsql": (HarelLibsql, libsql_connect)}[kind]
    if page_size is not None:  # fixed before harel's first write: its page size is then kept
        conn = connect(str(path))
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.close()
    transport_class(str(path))  # creates the schema
    load_sqlite(path, backlog, connect)
    transport = transport_class(str(path))
    at_level(transport._conn, level)
    return harel_queue(transport)


def drop_rqlite(urls: str, tables: list[str]) -> None:
    import httpx

    statements = [[f"DROP TABLE IF EXISTS {table}"] for table in tables]
    httpx.post(f"{urls.split(',')[0]}/db/execute?transaction", json=statements, timeout=60).raise_for_status()


# --- Throughput -----------------------------------------------------------------------------------
# Every peer is opened on its own file with the same backlog, then all are drained together:
# ``--chunk`` claim+acks of one, then of the next, until all are empty.
# The disk's fsync time drifts by tens of percent within a minute on a shared machine; drained
# in lockstep, every peer meets the same drift.  The order is shuffled afresh for each turn
# (seeded: the same every run), so that no peer always follows the same one: in a fixed cycle
# harel-ref's SqliteTransport always came after litequeue, and measured 0.84 of the raw limit
# at FULL, against 0.91 shuffled.  Why is not known: a sync of one file right after another
# file's unsynced writes measured no slower here.


def harel_ref_drainer(kind: str, level: str) -> Callable[[Path, Backlog], Queue]:
    return lambda directory, backlog: open_harel_ref(kind, directory, backlog, level)


def harel_drainer(kind: str, level: str, page_size: int | None = None) -> Callable[[Path, Backlog], Queue]:
    return lambda directory, backlog: open_harel(kind, directory, backlog, level, page_size)


def harel_ref_async_drainer(kind: str, level: str) -> Callable[[Path, Backlog], Any]:
    def open_async(directory: Path, backlog: Backlog) -> AsyncQueue:
        path = directory / f"harel-ref-async-{kind}-{uuid.uuid4().hex[:8]}.db"
        transport_class, connect = {"sqlite": (AsyncSqliteTransport, sqlite_connect),
                                    "libsql": (AsyncLibsqlTransport, libsql_connect)}[kind]
        loop = asyncio.new_event_loop()
        loop.run_until_complete(loop.run_until_complete(transport_class.create(path)).close())
        load_sqlite(path, backlog, connect)
        return AsyncQueue(loop, loop.run_until_complete(transport_class.create(path, synchronous=level)))
    return open_async


def harel_async_drainer(kind: str, level: str) -> Callable[[Path, Backlog], Any]:
    """harel 0.9.0's async twin: over aiosqlite (SQLite), or its sync transport in
    ``asyncio.to_thread`` (libSQL)."""
    def open_async(directory: Path, backlog: Backlog) -> AsyncQueue:
        from harel.engine.aio_transport.libsql import AsyncLibsqlTransport as HarelAsyncLibsql
        from harel.engine.aio_transport.sqlite import AsyncSqliteTransport as HarelAsyncSqlite

        path = str(directory / f"harel-async-{kind}-{uuid.uuid4().hex[:8]}.db")
        transport_class, connect = {"sqlite": (HarelAsyncSqlite, sqlite_connect),
                                    "libsql": (HarelAsyncLibsql, libsql_connect)}[kind]
        loop = asyncio.new_event_loop()
        loop.run_until_complete(loop.run_until_complete(transport_class.create(path)).close())
        load_sqlite(Path(path), backlog, connect)
        transport = loop.run_until_complete(transport_class.create(path))
        if kind == "sqlite":
            loop.run_until_complete(transport._conn.execute(f"PRAGMA synchronous = {level}"))
        else:
            at_level(transport._t._conn, level)
        return AsyncQueue(loop, transport)
    return open_async


class AsyncQueue:
    """An asyncio transport drained on its own event loop, a chunk per ``run_until_complete``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any) -> None:
        self.loop, self.transport = loop, transport

    def run(self, count: int) -> int:
        return self.loop.run_until_complete(self._run(count))

    async def _run(self, count: int) -> int:
        try:
            for done in range(count):
                lease = await self.transport.claim("bench", 60.0)
                if lease is None:
                    return done
                await self.transport.ack(lease)
            return count
        finally:
            # harel-ref's SQLite twin checkpoints in its thread after every 400th call, and its
            # next call waits for it: a checkpoint started at the end of a chunk is that chunk's
            # work, not something to finish while the other peers run theirs.
            idle = getattr(self.transport, "_idle", None)
            if idle is not None:
                await idle()

    def close(self) -> None:
        self.loop.run_until_complete(self.transport.close())
        self.loop.close()


def persist_queue_drainer(directory: Path, backlog: Backlog, level: str) -> Queue:
    import persistqueue

    queue = persistqueue.SQLiteAckQueue(str(directory / f"persist-queue-{uuid.uuid4().hex[:8]}"), auto_commit=True)
    at_level(queue._conn, level)
    for _ in range(backlog.messages):
        queue.put(backlog.event)

    def claim() -> Any:
        try:
            return queue.get(block=False)
        except persistqueue.Empty:
            return None

    return Queue(claim, queue.ack, queue.close)


def litequeue_drainer(directory: Path, backlog: Backlog, level: str) -> Queue:
    """litequeue at its own ``synchronous=NORMAL``, whatever ``level``."""
    import litequeue

    queue = litequeue.LiteQueue(str(directory / f"litequeue-{uuid.uuid4().hex[:8]}.db"))
    for _ in range(backlog.messages):
        queue.put(backlog.event)
    return Queue(queue.pop, lambda message: queue.done(message.message_id), queue.close)


def raw_drainer(directory: Path, backlog: Backlog, level: str) -> Queue:
    """harel-ref's own statements, run by plain sqlite3 with nothing around them: no argument
    checks, no lock, no Lease, one constant token.  Per message: the claim's one statement (and
    the promotion of lapsed groups when it finds nothing), then the ack's one statement, each
    at the level harel-ref commits it at (at FULL a claim is not synced: switching costs a
    PRAGMA before the claim and one before the ack).  A transport at 100% of this would cost
    nothing of its own."""
    from harel_ref.transport._sql import Tables, claim_params, commit_levels, promote_lapsed_sql

    path = directory / f"raw-{uuid.uuid4().hex[:8]}.db"
    SqliteTransport(path).close()
    load_sqlite(path, backlog, sqlite_connect)
    t = Tables.named()
    promote = promote_lapsed_sql(t)
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_BYTES // PAGE_SIZE}")  # as harel-ref's connections
    conn.execute(TEMP_IN_MEMORY.sql)
    at_level(conn, level)

    levels = commit_levels(level, wal=True)
    claim_level, ack_level = (f"PRAGMA synchronous = {levels.get(op, levels[None])}" for op in ("claim", "ack"))
    switch = claim_level != ack_level

    def claim() -> Any:
        now = time.time()
        if switch:
            conn.execute(claim_level)
        rows = conn.execute(t.claim_sql, claim_params("raw:token", now, 60.0, 0, None, guarded=True)).fetchall()
        if not rows:
            conn.execute(promote, (now,))
            return None
        return rows[0]

    def ack(row: Any) -> Any:
        if switch:
            conn.execute(ack_level)
        return conn.execute(t.ack_sql, (row[0], row[1].decode(), "raw:token")).fetchall()

    return Queue(claim, ack, conn.close)


def floor_drainer(directory: Path, backlog: Backlog, level: str) -> Queue:
    """The least any SQLite queue with acks does: two write transactions of one statement per
    message, on a job table without groups (lease the oldest free row, then delete it)."""
    conn = sqlite3.connect(str(directory / f"floor-{uuid.uuid4().hex[:8]}.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA busy_timeout = 5000")
    at_level(conn, level)
    conn.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO jobs (event) VALUES (?)", [(backlog.event,)] * backlog.messages)
    conn.execute("COMMIT")
    lease = ("UPDATE jobs SET locked_by = ?, lock_expiry = ?"
             " WHERE seq = (SELECT MIN(seq) FROM jobs WHERE locked_by IS NULL) RETURNING seq, event")

    def claim() -> Any:
        rows = conn.execute(lease, ("bench", time.time() + 60.0)).fetchall()
        return rows[0] if rows else None

    return Queue(claim, lambda row: conn.execute("DELETE FROM jobs WHERE seq = ?", (row[0],)), conn.close)


def available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        print(f"# skipped: {module} is not installed (pip install -e '.[bench]')")
        return False


REFERENCE = "harel-ref SqliteTransport"
RAW = "raw limit: harel-ref's statements in plain sqlite3"


TURN_ORDER = random.Random(0)  # the peers' order in each turn of drain_together (see above)


@dataclass(frozen=True)
class Drained:
    """One fresh open of a peer, drained: its msg/s, and what the process spent in its turns
    (the peers take turns in one process, so the ``getrusage`` of a turn is that peer's)."""

    rate: float
    messages: int
    faults: int  # minor page faults
    system: float  # system CPU seconds
    cpu: float  # user and system CPU seconds

    @property
    def faults_per_10k(self) -> float:
        return self.faults / self.messages * 10_000 if self.messages else 0.0

    @property
    def cpu_rate(self) -> float:
        """Messages per second of the process's CPU time: what a claim+ack costs in CPU, which
        other programs on the machine change less than the wall clock's msg/s (at NORMAL,
        where no call waits for the disk, it is most of the cost)."""
        return self.messages / self.cpu if self.cpu else math.nan


def drain_together(directory: Path, backlog: Backlog, openers: dict[str, Callable[[Path, Backlog], Any]],
                   chunk: int) -> dict[str, Drained]:
    """Open every peer on ``backlog``, drain them in lockstep; what each one's drain took."""
    queues: dict[str, Any] = {}
    seconds, system, cpu = dict.fromkeys(openers, 0.0), dict.fromkeys(openers, 0.0), dict.fromkeys(openers, 0.0)
    done, faults = dict.fromkeys(openers, 0), dict.fromkeys(openers, 0)
    try:
        for name, opener in openers.items():
            queues[name] = opener(directory, backlog)
        while left := [name for name in queues if done[name] < backlog.messages]:
            TURN_ORDER.shuffle(left)
            for name in left:
                before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                drained = queues[name].run(chunk)
                seconds[name] += time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_SELF)
                faults[name] += after.ru_minflt - before.ru_minflt
                system[name] += after.ru_stime - before.ru_stime
                cpu[name] += after.ru_stime - before.ru_stime + after.ru_utime - before.ru_utime
                done[name] += drained
                if drained < chunk and done[name] < backlog.messages:
                    raise AssertionError(f"{name} ran dry after {done[name]} of {backlog.messages} messages")
    finally:
        for queue in queues.values():
            queue.close()
    return {name: Drained(done[name] / seconds[name], done[name], faults[name], system[name], cpu[name]) for name in queues}


def fresh_opens(directory: Path, backlog: Backlog, openers: dict[str, Callable[[Path, Backlog], Any]],
                args: argparse.Namespace) -> dict[str, list[Drained]]:
    """``args.opens`` rounds, each opening every peer afresh and draining all in lockstep."""
    results: dict[str, list[Drained]] = {name: [] for name in openers}
    for number in range(args.opens):
        for name, drained in drain_together(directory, backlog, openers, args.chunk).items():
            results[name].append(drained)
        print(f"#   open {number + 1} of {args.opens} done, {load()}", flush=True)
    return results


def rates(runs: list[Drained], cpu: bool = False) -> list[float]:
    """msg/s of each open, by the wall clock or (``cpu``) per second of CPU time."""
    return [run.cpu_rate if cpu else run.rate for run in runs]


def median_rate(runs: list[Drained], cpu: bool = False) -> float:
    return statistics.median(rates(runs, cpu)) if runs else math.nan


def worst_paired(runs: list[Drained], others: list[Drained], cpu: bool = False) -> float:
    """The least ratio of a peer's open to the other's open of the same round."""
    return min(run / other for run, other in zip(rates(runs, cpu), rates(others, cpu)))


OPENS_HEADER = ("msg/s min | median | max | slowest / fastest | page faults per 10,000 claim+acks, "
                "median (max) | system CPU s, median (max) | CPU µs per claim+ack, median (max)")


def opens_cells(runs: list[Drained]) -> str:
    """The cells of OPENS_HEADER for one peer's opens."""
    values, faults = rates(runs), [run.faults_per_10k for run in runs]
    system, cpu = [run.system for run in runs], [1e6 / run.cpu_rate for run in runs]
    uneven = min(values) / max(values)
    return (f"{min(values):,.0f} | {statistics.median(values):,.0f} | {max(values):,.0f} | "
            f"{'**' if uneven < UNEVEN else ''}{uneven:.2f}{'**' if uneven < UNEVEN else ''} | "
            f"{statistics.median(faults):,.0f} ({max(faults):,.0f}) | "
            f"{statistics.median(system):.2f} ({max(system):.2f}) | {statistics.median(cpu):,.1f} ({max(cpu):,.1f})")


UNEVEN = 0.8
"""A peer whose slowest open ran under this share of its fastest is warned about: one figure
per open, or a median, hides a transport that is fast in some opens and slow in others (issue
43: half of harel-ref's opens at half speed, each with 50 page faults a claim+ack)."""


def warn_uneven(results: dict[str, list[Drained]], where: str) -> None:
    """A loud line for each peer whose opens were uneven (not an exit code: a noisy machine
    does it too; the page faults tell which)."""
    for name, runs in results.items():
        values = rates(runs)
        if len(values) > 1 and min(values) < UNEVEN * max(values):
            faults = ", ".join(f"{run.faults_per_10k:,.0f}" for run in runs)
            print(f"\n!!! WARNING ({where}): {name}: its slowest open ran at {min(values) / max(values):.2f} of its "
                  f"fastest ({min(values):,.0f} against {max(values):,.0f} msg/s); page faults per 10,000 "
                  f"claim+acks, open by open: {faults} !!!", flush=True)


HAREL = "harel 0.9.0 SqliteTransport (unfenced)"
TWINS = {  # an async transport -> the sync transport of its backend, from the same project
    "harel-ref AsyncSqliteTransport": REFERENCE,
    "harel-ref AsyncLibsqlTransport": "harel-ref LibsqlTransport",
    "harel 0.9.0 AsyncSqliteTransport (aiosqlite)": HAREL,
    "harel 0.9.0 AsyncLibsqlTransport (to_thread)": "harel 0.9.0 LibsqlTransport (rollback journal: it never sets WAL)",
}


def level_openers(level: str) -> dict[str, Callable[[Path, Backlog], Any]]:
    """Every peer at ``synchronous=level`` (each at its own meaning of the level)."""
    openers: dict[str, Callable[[Path, Backlog], Any]] = {
        REFERENCE: harel_ref_drainer("sqlite", level),
        "harel-ref AsyncSqliteTransport": harel_ref_async_drainer("sqlite", level),
        "harel-ref LibsqlTransport": harel_ref_drainer("libsql", level),
        "harel-ref AsyncLibsqlTransport": harel_ref_async_drainer("libsql", level),
    }
    if available("harel"):
        openers[HAREL] = harel_drainer("sqlite", level)
        openers[f"harel 0.9.0 SqliteTransport, in a file of {PAGE_SIZE}-byte pages"] = harel_drainer("sqlite", level, PAGE_SIZE)
        openers["harel 0.9.0 AsyncSqliteTransport (aiosqlite)"] = harel_async_drainer("sqlite", level)
        openers["harel 0.9.0 LibsqlTransport (rollback journal: it never sets WAL)"] = harel_drainer("libsql", level)
        openers["harel 0.9.0 AsyncLibsqlTransport (to_thread)"] = harel_async_drainer("libsql", level)
    plain = {RAW: raw_drainer, "floor: a job table without groups, two one-statement transactions": floor_drainer}
    if available("persistqueue"):
        plain["persist-queue SQLiteAckQueue (no groups)"] = persist_queue_drainer
    if available("litequeue"):
        plain["litequeue (no groups, synchronous=NORMAL always)"] = litequeue_drainer
    for name, drainer in plain.items():
        openers[name] = functools.partial(drainer, level=level)
    return openers


def throughput_table(directory: Path, args: argparse.Namespace, level: str, event_bytes: int) -> dict[str, list[Drained]]:
    """The throughput table at ``synchronous=level``, events of ``event_bytes``; every open of every peer."""
    backlog = Backlog(args.groups, args.messages // args.groups, event=event_of(event_bytes))
    openers = level_openers(level)
    if args.peers is not None:
        openers = {name: opener for name, opener in openers.items() if name == RAW or args.peers.search(name)}
    where = f"synchronous={level}, {event_bytes}-byte events"
    print(f"\n# throughput at {where}: claim+ack until empty, {backlog.messages:,} messages, "
          f"{backlog.groups} groups, one worker, all peers drained in lockstep ({args.chunk} at a time); "
          f"{args.opens} fresh opens of each, {load()}", flush=True)
    results = fresh_opens(directory, backlog, openers, args)
    medians = {name: median_rate(runs) for name, runs in results.items()}
    reference, raw = medians.get(REFERENCE, math.nan), medians[RAW]
    print(f"\n| {where}: claim+ack until empty, {backlog.messages:,} messages, {backlog.groups} groups, "
          f"one worker | {OPENS_HEADER} | vs harel-ref SQLite (medians) | vs raw limit (medians) | "
          f"async vs its sync, median (least open) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        twin = ""
        if TWINS.get(name) in results:
            twin = f"{medians[name] / medians[TWINS[name]]:.2f} ({worst_paired(runs, results[TWINS[name]]):.2f})"
        print(f"| {name} | {opens_cells(runs)} | {medians[name] / reference:.2f} | {medians[name] / raw:.2f} | {twin} |")
    print(f"\n# {load()}")
    warn_uneven(results, where)
    print_goals(results, level, event_bytes)
    return results


def print_goals(results: dict[str, list[Drained]], level: str, event_bytes: int) -> None:
    """The goals of issues 22 and 43 for this table, each with its figure (at FULL and NORMAL;
    EXTRA, where every peer syncs every commit, is compared in the like-with-like table)."""
    if level not in ("FULL", "NORMAL"):
        return
    medians = {name: median_rate(runs) for name, runs in results.items()}
    goals = [(f"{REFERENCE} vs {HAREL} (medians)", REFERENCE, HAREL, 1.0), (f"{REFERENCE} vs the raw limit (medians)", REFERENCE, RAW, 0.85)]
    for twin, sync in TWINS.items():
        if twin.startswith("harel-ref"):
            goals.append((f"{twin} vs its sync transport (medians)", twin, sync, 0.8))
            harel_twin = twin.replace("harel-ref", "harel 0.9.0")
            harel_twin = next((name for name in TWINS if name.startswith(harel_twin)), harel_twin)
            goals.append((f"{twin} vs {harel_twin} (medians)", twin, harel_twin, 1.0))
    rows = [(label, medians[name] / medians[other], f"≥ {least:.2f}", medians[name] / medians[other] >= least)
            for label, name, other, least in goals if name in medians and other in medians]
    for cpu, clock in ((False, "msg/s"), (True, "msg per CPU second")):
        if REFERENCE in results and HAREL in results and level == "NORMAL":
            least = min(rates(results[REFERENCE], cpu)) / median_rate(results[HAREL], cpu)
            rows.append((f"every open of {REFERENCE} vs the median of {HAREL}, {clock}", least, "≥ 0.95", least >= 0.95))
        for twin, sync in TWINS.items():
            if twin.startswith("harel-ref") and twin in results and sync in results:
                least = worst_paired(results[twin], results[sync], cpu)
                rows.append((f"{twin} vs its sync transport, every open (paired by round), {clock}", least, "≥ 0.80", least >= 0.8))
    rows.extend(fault_goals(results))
    print_goal_rows(f"synchronous={level}, {event_bytes}-byte events", rows)


def fault_goals(results: dict[str, list[Drained]]) -> list[tuple[str, float, str, bool]]:
    """Issue 43: no harel-ref peer faults more than 1,000 pages per 10,000 claim+acks, in any open."""
    faults = {name: max(run.faults_per_10k for run in runs) for name, runs in results.items() if name.startswith("harel-ref")}
    if not faults:
        return []
    worst = max(faults, key=faults.__getitem__)
    return [(f"page faults per 10,000 claim+acks, the most of any open of a harel-ref peer ({worst})",
             faults[worst], "≤ 1,000", faults[worst] <= 1_000)]


def print_goal_rows(where: str, rows: list[tuple[str, float, str, bool]]) -> None:
    print(f"\n| {where}: goal | figure | wanted | met |")
    print("|---|---|---|---|")
    for label, figure, wanted, met in rows:
        shown = f"{figure:,.0f}" if figure >= 100 or wanted.startswith("≤") else f"{figure:.2f}"
        print(f"| {label} | {shown} | {wanted} | {'yes' if met else '**no**'} |")


# --- Like with like --------------------------------------------------------------------------------
# At FULL harel-ref commits a claim unsynced (SYNCHRONOUS), harel 0.9.0 syncs every commit: its
# FULL is harel-ref's EXTRA.  This table drains, interleaved, each backend's harel-ref transport
# at EXTRA and at FULL beside harel 0.9.0's at FULL.

LIKE_WITH_LIKE = {  # a transport -> (harel-ref's opener at a level, harel 0.9.0's opener at a level)
    "SqliteTransport": (functools.partial(harel_ref_drainer, "sqlite"), functools.partial(harel_drainer, "sqlite")),
    "AsyncSqliteTransport": (functools.partial(harel_ref_async_drainer, "sqlite"), functools.partial(harel_async_drainer, "sqlite")),
    "LibsqlTransport": (functools.partial(harel_ref_drainer, "libsql"), functools.partial(harel_drainer, "libsql")),
    "AsyncLibsqlTransport": (functools.partial(harel_ref_async_drainer, "libsql"), functools.partial(harel_async_drainer, "libsql")),
}


def like_names(transport: str) -> tuple[str, str, str]:
    """harel-ref at EXTRA, harel-ref at FULL, harel 0.9.0 at FULL."""
    return (f"harel-ref {transport} EXTRA (every commit synced)", f"harel-ref {transport} FULL (claims unsynced)",
            f"harel 0.9.0 {transport} FULL (every commit synced)")


def like_with_like_table(directory: Path, args: argparse.Namespace, event_bytes: int) -> None:
    """harel-ref at EXTRA and FULL beside harel 0.9.0 at FULL, for each transport and its twin."""
    if not available("harel"):
        return
    backlog = Backlog(args.groups, args.messages // args.groups, event=event_of(event_bytes))
    openers: dict[str, Callable[[Path, Backlog], Any]] = {}
    for transport, (harel_ref_opener, harel_opener) in LIKE_WITH_LIKE.items():
        extra, full, harel_full = like_names(transport)
        openers.update({extra: harel_ref_opener("EXTRA"), full: harel_ref_opener("FULL"), harel_full: harel_opener("FULL")})
    if args.peers is not None:
        openers = {name: opener for name, opener in openers.items() if args.peers.search(name)}
    where = f"like with like, {event_bytes}-byte events"
    print(f"\n# throughput {where}: {backlog.messages:,} messages, {backlog.groups} groups, one worker, "
          f"in lockstep; {args.opens} fresh opens of each, {load()}", flush=True)
    results = fresh_opens(directory, backlog, openers, args)
    medians = {name: median_rate(runs) for name, runs in results.items()}
    print(f"\n| {where}: claim+ack until empty | {OPENS_HEADER} | vs harel 0.9.0's at FULL (medians) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for transport in LIKE_WITH_LIKE:
        extra, full, harel_full = like_names(transport)
        for name in (extra, full, harel_full):
            if name in results:
                ratio = f"{medians[name] / medians[harel_full]:.2f}" if harel_full in medians else ""
                print(f"| {name} | {opens_cells(results[name])} | {ratio} |")
        for name, other in ((extra, harel_full), (full, harel_full), (full, extra)):
            if name in medians and other in medians:
                ratio = medians[name] / medians[other]
                rows.append((f"{name} vs {other} (medians)", ratio, "≥ 1.00", ratio >= 1.0))
    print(f"\n# {load()}")
    warn_uneven(results, where)
    print_goal_rows(where, rows + fault_goals(results))


# --- Where the time goes ---------------------------------------------------------------------------


class TimedConnection:
    """A DB-API connection whose statements are timed (``execute`` and ``fetchall``: a
    statement with RETURNING runs to its end, commit included, only when its rows are
    fetched), by the statement's first words."""

    def __init__(self, conn: Any, seconds: dict[str, float]) -> None:
        self._conn, self.seconds = conn, seconds

    def execute(self, sql: str, params: Any = ()) -> Any:
        label = STATEMENT_LABELS.get(" ".join(sql.split()[:4]), sql[:30])
        start = time.perf_counter()
        try:
            return TimedCursor(self._conn.execute(sql, params), label, self.seconds)
        finally:
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class TimedCursor:
    def __init__(self, cursor: Any, label: str, seconds: dict[str, float]) -> None:
        self._cursor, self._label, self._seconds = cursor, label, seconds

    def fetchall(self) -> list[Any]:
        start = time.perf_counter()
        try:
            return self._cursor.fetchall()
        finally:
            self._seconds[self._label] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


STATEMENT_LABELS = {  # by the statement's first four words
    "UPDATE harel_transport_groups SET locked_by": "claim: its one statement, trigger and commit (synced at EXTRA only)",
    "DELETE FROM harel_transport_messages WHERE": "ack: its one statement, trigger and commit (synced at FULL and EXTRA)",
    "UPDATE harel_transport_groups SET claimable_at": "the last claim, which found nothing: promote lapsed groups",
    "PRAGMA synchronous = NORMAL": "at FULL, the switch to NORMAL before a claim and back before an ack",
    "PRAGMA synchronous = FULL": "at FULL, the switch to NORMAL before a claim and back before an ack",
}


def where_time_goes(directory: Path, messages: int, level: str) -> None:
    """One worker's claim+ack on harel-ref SqliteTransport, split into the time spent inside
    sqlite3, statement by statement, and the rest (Python: argument checks, the token, the
    plan, the lock)."""
    backlog = Backlog(max(1, messages // 20), 20)
    queue_path = directory / f"profile-{uuid.uuid4().hex[:8]}.db"
    SqliteTransport(queue_path).close()
    load_sqlite(queue_path, backlog, sqlite_connect)
    transport = SqliteTransport(queue_path, synchronous=level)
    seconds: dict[str, float] = {}
    transport._conn = TimedConnection(transport._conn, seconds)
    start = time.perf_counter()
    done = 0
    while (lease := transport.claim("bench", 60.0)) is not None:
        transport.ack(lease)
        done += 1
    total = time.perf_counter() - start
    transport._conn = transport._conn._conn
    transport.close()
    per = {label: value / done * 1e6 for label, value in seconds.items()}
    inside = sum(per.values())
    print(f"\n| synchronous={level}: where a claim+ack goes, harel-ref SqliteTransport, {done:,} messages | µs per message | share |")
    print("|---|---|---|")
    for label, value in sorted(per.items(), key=lambda item: -item[1]):
        print(f"| {label} | {value:,.1f} | {value / (total / done * 1e6):.0%} |")
    python = total / done * 1e6 - inside
    print(f"| Python: checks, token, statements, lock, driver calls | {python:,.1f} | {python / (total / done * 1e6):.0%} |")
    print(f"| total | {total / done * 1e6:,.1f} | 100% |")


def wal_frames(directory: Path, count: int = 1_000) -> None:
    """WAL frames (pages) written per claim and per ack, each counted from the growth of the
    WAL file with checkpoints off: what a commit writes, and at FULL syncs."""
    backlog = Backlog(500, 20)

    def harel_ref(path: Path) -> Any:
        SqliteTransport(path).close()
        load_sqlite(path, backlog, sqlite_connect)
        return SqliteTransport(path)

    def harel(path: Path, page_size: int | None = None) -> Any:
        from harel.engine.transport.sqlite import SqliteTransport as HarelSqlite

        if page_size is not None:
            conn = sqlite_connect(str(path))
            conn.execute(f"PRAGMA page_size = {page_size}")
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.close()
        HarelSqlite(str(path))
        load_sqlite(path, backlog, sqlite_connect)
        return HarelSqlite(str(path))

    contenders = {"harel-ref SqliteTransport": harel_ref}
    if available("harel"):
        contenders["harel 0.9.0 SqliteTransport (4096-byte pages, as it makes a file)"] = harel
        contenders[f"harel 0.9.0 SqliteTransport, {PAGE_SIZE}-byte pages"] = lambda path: harel(path, PAGE_SIZE)
    print(f"\n| WAL frames written, mean of {count:,} claim+acks (checkpoints off) | per claim | per ack | bytes per claim+ack |")
    print("|---|---|---|---|")
    for name, opener in contenders.items():
        path = directory / f"frames-{uuid.uuid4().hex[:8]}.db"
        transport = opener(path)
        transport._conn.execute("PRAGMA wal_autocheckpoint = 0")
        transport._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = transport._conn.execute("PRAGMA page_size").fetchone()[0]
        wal = Path(f"{path}-wal")
        claimed = acked = 0
        for _ in range(count):
            before = wal.stat().st_size
            lease = transport.claim("bench", 60.0)
            middle = wal.stat().st_size
            transport.ack(lease)
            claimed, acked = claimed + middle - before, acked + wal.stat().st_size - middle
        transport.close()
        frame = page + 24  # each frame is a page and its 24-byte header
        print(f"| {name} | {claimed / count / frame:.2f} | {acked / count / frame:.2f} | "
              f"{(claimed + acked) / count:,.0f} |")


def python_parts(calls: int = 20_000) -> None:
    """The Python side of one claim+ack, piece by piece, each timed alone over ``calls`` calls."""
    import threading

    from harel_ref.transport import Lease
    from harel_ref.transport._base import check_claim_args, check_lease, new_token, read_clock
    from harel_ref.transport._sql import Tables, ack_statement, claim_statement, claimed

    tables, lease, lock = Tables.named(), Lease("g1", "e", 1, "bench:0123"), threading.Lock()
    rows = [(1, b"g1", b"e")]

    def statements() -> None:
        claim_statement(tables, "bench:0123", read_clock(time.time), 60.0, 0, None)
        claimed(rows, "bench:0123")
        ack_statement(tables, lease)

    def locked() -> None:
        with lock:
            pass
        with lock:
            pass

    parts = {
        "check the arguments (claim_args + lease)": lambda: (check_claim_args("bench", 60.0, 0, None), check_lease(lease)),
        "new lease token (16 random bytes)": lambda: new_token("bench"),
        "read the clock, build the two statements, read the lease": statements,
        "take and release the transport's lock (twice)": locked,
    }
    print(f"\n| the Python side of one claim+ack, each part timed alone ({calls:,} calls) | µs |")
    print("|---|---|")
    for label, part in parts.items():
        start = time.perf_counter()
        for _ in range(calls):
            part()
        print(f"| {label} | {(time.perf_counter() - start) / calls * 1e6:.1f} |")


# --- Claim latency --------------------------------------------------------------------------------

SCENARIOS = {
    "(a) 1,000 messages in 100 groups": Backlog(100, 10),
    "(b) 200,000 messages in 20,000 groups": Backlog(20_000, 10),
    "(c) 1,000 free groups behind 20,000 blocked": Backlog(1_000, 10, blocked=20_000),
    "(d) 1,000,000 messages in 100,000 groups": Backlog(100_000, 10),
}


def scaled(backlog: Backlog, scale: float) -> Backlog:
    return Backlog(max(1, round(backlog.groups * scale)), backlog.per_group, round(backlog.blocked * scale))


def claim_latencies(queue: Queue, samples: int) -> float:
    """The median time of ``samples`` claims, in microseconds; each lease is acked untimed."""
    timings = []
    for _ in range(samples):
        start = time.perf_counter()
        lease = queue.claim()
        timings.append(time.perf_counter() - start)
        assert lease is not None, "the backlog ran out"
        queue.ack(lease)
    return statistics.median(timings) * 1e6


KINDS = {"harel-ref": ("sqlite", "libsql", "rqlite"), "harel 0.9.0": ("sqlite", "libsql")}
"""The backends measured for each.  harel's rqlite transport is left out: its claim is the
seeds' three requests, which benchmarks/rqlite_claim.py measures against harel-ref's one."""


def latency_table(directory: Path, args: argparse.Namespace, level: str) -> None:
    kinds = ["sqlite", "libsql"] + ([] if args.no_rqlite or not rqlite_is_up() else ["rqlite"])
    openers: dict[str, Callable[[str, Path, Backlog], Queue]] = {"harel-ref": open_harel_ref}
    if available("harel"):
        openers["harel 0.9.0"] = open_harel
    scenarios = {name: scaled(backlog, args.scale) for name, backlog in SCENARIOS.items()}
    columns = [f"{who} {kind}" for kind in kinds for who in openers if kind in KINDS[who]]
    medians: dict[str, dict[str, list[float]]] = {}
    for scenario, backlog in scenarios.items():
        print(f"\n# latency {scenario} at synchronous={level}: {backlog.messages:,} messages, loading ...", flush=True)
        started = time.perf_counter()
        queues = {f"{who} {kind}": opener(kind, directory, backlog, level)
                  for kind in kinds for who, opener in openers.items() if kind in KINDS[who]}
        print(f"#   loaded in {time.perf_counter() - started:.0f} s", flush=True)
        try:
            medians[scenario] = rounds(queues, args.rounds, lambda name, queue: claim_latencies(queue, args.samples))
        finally:
            for queue in queues.values():
                queue.close()

    print(f"\n| synchronous={level}: claim latency, median of {args.samples} × {args.rounds} rounds (µs) | "
          + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    first = next(iter(medians))
    for scenario, results in medians.items():
        cells = []
        for column in columns:
            values = results[column]
            ratio = statistics.median(values) / statistics.median(medians[first][column])
            cells.append(f"{spread(values, '{:,.0f}')}" + ("" if scenario == first else f", **{ratio:.2f}×** (a)"))
        print(f"| {scenario} | " + " | ".join(cells) + " |")


def rqlite_is_up() -> bool:
    import httpx

    try:
        httpx.get(RQLITE.split(",")[0] + "/readyz", timeout=2).raise_for_status()
        return True
    except httpx.HTTPError as exc:
        print(f"# skipped: rqlite columns, no cluster at {RQLITE.split(',')[0]} ({exc}); `bash .ci/cluster up` starts one")
        return False


if __name__ == "__main__":
    main()
