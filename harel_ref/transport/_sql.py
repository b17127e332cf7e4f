"""The SQL shared by the SQLite and libSQL transports: schema, upgrade, and the four operations.

Both backends speak SQLite's dialect and differ only in their driver, so every statement lives
here, once.  An operation is written as a *plan*: a generator that yields :class:`Statement`
objects and is sent back each statement's answer (rows for a query, the row count otherwise),
then returns the operation's result.  :func:`run` executes a plan on a DB-API connection
(``sqlite3``, ``libsql``); :func:`run_async` does the same on an ``aiosqlite`` connection.  The
plans hold the logic; the runners hold the transaction and nothing else.

Schema (seeds' tables, plus ``routing_key``)::

    <p>harel_transport_messages(seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id, event,
                                locked_by, lock_expiry)
    <p>harel_transport_groups(group_id PRIMARY KEY, last_claimed_at, priority, routing_key)
    <p>harel_transport_meta(key PRIMARY KEY, value)     -- 'schema_version' -> 4

``<p>`` is empty, or ``prefix + "_"`` when a ``prefix`` is given (``^[A-Za-z_][A-Za-z0-9_]{0,40}$``)
so that several queues (tests, tenants) can share one database file.

**Where the schema version lives.**  ``SCHEMA_VERSION`` is kept in the small meta table, not in
``PRAGMA user_version``: user_version is one number per database file, while each prefix has its
own tables and may be at its own version.  A table created before ``routing_key`` existed (the
seeds' schema, no meta table) is upgraded in place when a transport opens it: ``PRAGMA
table_info`` tells whether the column is there and ``ALTER TABLE ... ADD COLUMN`` runs once, all
inside ``BEGIN IMMEDIATE`` so that two processes opening at once do not both alter.  A database
recording a *newer* version than this code knows is refused with :class:`StorageError`.

**The lease** is the pair ``(locked_by, lock_expiry)`` of a message: ``locked_by`` holds the
claim's token (``new_token(worker_id)``), or ``'__parked__'`` for a parked message, or NULL when
the message is free.  Only a group's head is ever leased, so "the group has something in flight"
is "its head has ``locked_by`` set and ``lock_expiry >= now``" (live while ``now <= t + v``).

**Fencing** (departs from the seeds, whose ``DELETE ... WHERE seq = ?`` lets a stale worker delete
a message someone else holds): ack and nack match ``locked_by = token``.  A lapsed lease that
nobody re-claimed still acks (the work was done); a superseded or consumed lease matches no row,
returns False and changes nothing.

**Claim order**: claimable groups by ``last_claimed_at`` then ``rowid`` (arrival order; a group
re-created after its last ack gets a new, larger rowid), walked on the groups index, so a claim
costs the same however long the backlog.  ``tests/test_sqlite.py`` checks the plan.

**Text is read back as BLOB** (``CAST(... AS BLOB)``, decoded as UTF-8): libsql 0.1.11 cuts a TEXT
value at its first NUL character when reading it (it writes it whole), while a BLOB comes back
intact.  Doing the same for stdlib sqlite3 keeps one SQL text for both drivers.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from ._base import (
    PARKED,
    ClockError,
    ClosedGuard,
    ClosesOnExit,
    Clock,
    Lease,
    StorageError,
    check_claim_args,
    check_clock,
    check_delay,
    check_lease,
    check_publish_args,
    new_token,
    read_clock,
)

__all__ = [
    "PARKED",
    "SCHEMA_VERSION",
    "Plan",
    "Statement",
    "SyncSqlTransport",
    "Tables",
    "ack_plan",
    "check_busy_timeout",
    "claim_plan",
    "claim_now_plan",
    "claim_query",
    "connection_pragmas",
    "drop_group_if_empty_plan",
    "nack_plan",
    "one_statement",
    "open_plan",
    "publish_plan",
    "run",
    "run_async",
    "storage_errors",
]

SCHEMA_VERSION = 4
"""Version 4: the seeds' two tables plus ``harel_transport_groups.routing_key`` and its index."""


_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")

T = TypeVar("T")


@dataclass(frozen=True)
class Statement:
    """One SQL statement of a plan.  ``fetch``: the plan is sent the rows, else the row count."""

    sql: str
    params: tuple[Any, ...] = ()
    fetch: bool = False


Plan = Generator[Statement, Any, T]
"""A plan yields statements, receives each one's answer, and returns the operation's result."""


@dataclass(frozen=True)
class Tables:
    """The names of one queue's tables and indexes (validated, so safe to put in SQL)."""

    messages: str
    groups: str
    meta: str

    @classmethod
    def named(cls, prefix: str | None = None) -> Tables:
        """The default names, or ``<prefix>_harel_transport_...`` for a valid prefix."""
        if prefix is None:
            head = ""
        elif not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}: {prefix!r:.80}")
        elif not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"prefix must be a letter or '_' followed by at most 40 letters, digits or '_' "
                f"(it becomes part of table names), got {prefix!r:.80}"
            )
        elif (prefix + "_").lower().startswith("sqlite_"):
            raise ValueError(
                f"prefix must not be {prefix!r}: SQLite reserves the table names that begin "
                "with 'sqlite_'"
            )
        else:
            head = prefix + "_"
        return cls(
            f"{head}harel_transport_messages",
            f"{head}harel_transport_groups",
            f"{head}harel_transport_meta",
        )


def check_busy_timeout(busy_timeout: object) -> float:
    """How long (seconds) a writer waits for SQLite's write lock before giving up."""
    if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
        raise TypeError(f"busy_timeout must be a number of seconds, got {busy_timeout!r}")
    if not 0 <= busy_timeout < 86400:
        raise ValueError(f"busy_timeout must be from 0 to 86400 seconds, got {busy_timeout}")
    return float(busy_timeout)


# --- Schema ---------------------------------------------------------------------------------


def connection_pragmas(busy_timeout: float, *, wal: bool = True) -> list[Statement]:
    """Per-connection settings, run outside any transaction (journal_mode cannot change inside)."""
    pragmas = [Statement(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}", fetch=True)]
    if wal:
        pragmas.append(Statement("PRAGMA journal_mode = WAL", fetch=True))
    return pragmas


def open_plan(t: Tables) -> Plan[None]:
    """Create the tables, or bring older ones up to ``SCHEMA_VERSION``.  Run in a transaction."""
    yield Statement(
        f"CREATE TABLE IF NOT EXISTS {t.messages} ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"  # FIFO order and the lease's handle
        " group_id TEXT NOT NULL,"
        " event TEXT NOT NULL,"
        " locked_by TEXT,"  # lease token, '__parked__', or NULL when free
        " lock_expiry REAL)"  # end of the lease or park
    )
    yield Statement(
        f"CREATE TABLE IF NOT EXISTS {t.groups} ("
        " group_id TEXT PRIMARY KEY,"  # a rowid table: rowid is the arrival order
        " last_claimed_at REAL NOT NULL DEFAULT 0.0,"
        " priority INT NOT NULL DEFAULT 0,"
        " routing_key TEXT)"
    )
    yield Statement(f"CREATE TABLE IF NOT EXISTS {t.meta} (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    rows = yield Statement(f"SELECT value FROM {t.meta} WHERE key = 'schema_version'", fetch=True)
    version = rows[0][0] if rows else None
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(
            f"the tables {t.messages}/{t.groups} are at schema version {version}, newer than "
            f"this harel-ref knows ({SCHEMA_VERSION}); upgrade harel-ref"
        )
    columns = yield Statement(f"PRAGMA table_info({t.groups})", fetch=True)
    if "routing_key" not in {row[1] for row in columns}:  # SQLite has no ADD COLUMN IF NOT EXISTS
        yield Statement(f"ALTER TABLE {t.groups} ADD COLUMN routing_key TEXT")
    yield Statement(
        f"CREATE INDEX IF NOT EXISTS {t.groups}_by_last_claimed ON {t.groups} (last_claimed_at)"
    )
    yield Statement(
        f"CREATE INDEX IF NOT EXISTS {t.groups}_by_routing_key "
        f"ON {t.groups} (routing_key, last_claimed_at)"
    )
    yield Statement(f"CREATE INDEX IF NOT EXISTS {t.messages}_by_group ON {t.messages} (group_id, seq)")
    if version != SCHEMA_VERSION:
        yield Statement(
            f"INSERT OR REPLACE INTO {t.meta} (key, value) VALUES ('schema_version', ?)",
            (SCHEMA_VERSION,),
        )


# --- Operations -----------------------------------------------------------------------------


def publish_plan(t: Tables, group_id: str, event: str, priority: int, routing_key: str | None) -> Plan[None]:
    """Append the message; the publish that creates the group fixes its priority and routing key."""
    yield Statement(f"INSERT INTO {t.messages} (group_id, event) VALUES (?, ?)", (group_id, event))
    yield Statement(
        f"INSERT OR IGNORE INTO {t.groups} (group_id, priority, routing_key) VALUES (?, ?, ?)",
        (group_id, priority, routing_key),
    )


def claim_query(t: Tables, routing_keys: tuple[str, ...] | None) -> str:
    """The claim's SELECT.  Parameters: min_priority, now, then the routing keys if any.

    It walks the groups in claim order and stops at the first whose head (lowest seq) is free
    or lapsed.  A group with a NULL routing key never matches ``IN (...)``, so it is only
    reachable by an unfiltered claim.
    """
    routing = ""
    if routing_keys is not None:
        routing = f" AND g.routing_key IN ({', '.join('?' * len(routing_keys))})"
    return (
        f"SELECT g.rowid, m.seq, CAST(m.group_id AS BLOB), CAST(m.event AS BLOB)"
        f" FROM {t.groups} AS g"
        f" JOIN {t.messages} AS m"
        f" ON m.seq = (SELECT MIN(h.seq) FROM {t.messages} AS h WHERE h.group_id = g.group_id)"
        f" WHERE g.priority >= ?{routing}"
        f" AND (m.locked_by IS NULL OR m.lock_expiry < ?)"
        f" ORDER BY g.last_claimed_at, g.rowid"
        f" LIMIT 1"
    )


def claim_plan(
    t: Tables,
    token: str,
    now: float,
    visibility: float,
    min_priority: int,
    routing_keys: tuple[str, ...] | None,
) -> Plan[Lease | None]:
    """Lease the head of the next claimable group, stamp the group's last_claimed_at = now.

    Must run inside ``BEGIN IMMEDIATE``: the write lock is what makes select-then-lease atomic
    across connections and processes.
    """
    params = (min_priority, *(routing_keys or ()), now)
    rows = yield Statement(claim_query(t, routing_keys), params, fetch=True)
    if not rows:
        return None
    group_rowid, seq, group_id, event = rows[0]
    yield Statement(f"UPDATE {t.groups} SET last_claimed_at = ? WHERE rowid = ?", (now, group_rowid))
    yield Statement(
        f"UPDATE {t.messages} SET locked_by = ?, lock_expiry = ? WHERE seq = ?",
        (token, now + visibility, seq),
    )
    return Lease(_text(group_id), _text(event), seq, token)


def ack_plan(t: Tables, lease: Lease) -> Plan[bool]:
    """Delete the message if still held under the lease's token; drop its group if now empty."""
    deleted = yield Statement(
        f"DELETE FROM {t.messages} WHERE seq = ? AND locked_by = ? AND group_id = ?",
        (lease.seq, lease.token, lease.group_id),
    )
    if not deleted:
        return False
    yield from drop_group_if_empty_plan(t, lease.group_id)
    return True


def drop_group_if_empty_plan(t: Tables, group_id: str) -> Plan[None]:
    """A group lives while it has messages: after its last ack its row goes (and with it its
    priority, routing key and arrival rank; a later publish creates it anew)."""
    yield Statement(
        f"DELETE FROM {t.groups} WHERE group_id = ?"
        f" AND NOT EXISTS (SELECT 1 FROM {t.messages} WHERE group_id = ?)",
        (group_id, group_id),
    )


def nack_plan(t: Tables, lease: Lease, now: float, delay: float) -> Plan[bool]:
    """Free the message (delay 0) or park it until now + delay, if still held by the lease."""
    holder, until = (None, None) if delay == 0 else (PARKED, now + delay)
    changed = yield Statement(
        f"UPDATE {t.messages} SET locked_by = ?, lock_expiry = ?"
        f" WHERE seq = ? AND locked_by = ? AND group_id = ?",
        (holder, until, lease.seq, lease.token, lease.group_id),
    )
    return bool(changed)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


# --- Runners --------------------------------------------------------------------------------


def run(conn: Any, plan: Plan[T], *, transaction: bool, lock_wait: float = 0.0) -> T:
    """Execute ``plan`` on a DB-API connection opened with ``isolation_level=None``.

    With ``transaction``, inside ``BEGIN IMMEDIATE ... COMMIT``, rolled back on any error.
    Every cursor is emptied and closed at once: libsql refuses to COMMIT while a statement is
    still open ("SQL statements in progress").

    ``lock_wait``: for a driver whose own busy handler must be off (libsql, see there), how
    many seconds to keep retrying the *first* statement (``BEGIN IMMEDIATE``, or a plan's only
    statement) while the database is locked, sleeping in Python between tries.  Nothing has
    happened before that statement succeeds, so a retry cannot act twice.
    """

    def execute(statement: Statement) -> Any:
        cursor = conn.execute(statement.sql, statement.params)
        try:
            return cursor.fetchall() if statement.fetch else cursor.rowcount
        finally:
            cursor.close()

    def first(statement: Statement) -> Any:
        deadline, pause = time.monotonic() + lock_wait, 0.001
        while True:
            try:
                return execute(statement)
            except Exception as exc:
                if not _says_locked(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)  # releases the GIL: the holder of the lock can finish
            pause = min(pause * 2, 0.05)

    try:
        if transaction:
            first(Statement("BEGIN IMMEDIATE"))
        try:
            statement = plan.send(None)
            answer = execute(statement) if transaction else first(statement)
            while True:
                answer = execute(plan.send(answer))
        except StopIteration as done:
            result = done.value
        if transaction:
            execute(Statement("COMMIT"))
        return result
    except BaseException:
        if transaction and conn.in_transaction:
            _rollback_quietly(lambda: execute(Statement("ROLLBACK")))
        raise


async def run_async(conn: Any, plan: Plan[T], *, transaction: bool) -> T:
    """:func:`run` for an ``aiosqlite`` connection (the same steps, awaited).

    The plan runs to its end (COMMIT or ROLLBACK) even if the caller is cancelled meanwhile:
    aiosqlite executes each statement in its own thread whatever happens to the awaiting
    coroutine, so a transaction abandoned half-way would keep the write lock and leave the
    connection inside a transaction.  The cancellation is passed on once the plan is done.
    """
    task = asyncio.ensure_future(_run_plan_async(conn, plan, transaction))
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError as exc:
            if task.done():
                raise
            cancelled = exc  # let the transaction finish, then report the cancellation
    if cancelled is not None:
        raise cancelled
    return result


async def _run_plan_async(conn: Any, plan: Plan[T], transaction: bool) -> T:
    async def execute(statement: Statement) -> Any:
        async with conn.execute(statement.sql, statement.params) as cursor:
            return await cursor.fetchall() if statement.fetch else cursor.rowcount

    began = False
    try:
        if transaction:
            await execute(Statement("BEGIN IMMEDIATE"))
            began = True
        answer = None
        try:
            while True:
                answer = await execute(plan.send(answer))
        except StopIteration as done:
            result = done.value
        if transaction:
            await execute(Statement("COMMIT"))
        return result
    except BaseException:
        if began:
            try:
                await execute(Statement("ROLLBACK"))
            except Exception:  # the first error is the one to report
                pass
        raise


def _says_locked(error: BaseException) -> bool:
    """SQLite's "database is locked" (SQLITE_BUSY), as any driver words it."""
    text = str(error).lower()
    return "database is locked" in text or "database is busy" in text


def _rollback_quietly(rollback) -> None:
    try:
        rollback()
    except Exception:  # the first error is the one to report
        pass


# --- Errors ---------------------------------------------------------------------------------


def _hint(detail: str, busy_timeout: float) -> str:
    text = detail.lower()
    if "not a database" in text:
        return "the file exists but is not an SQLite database (wrong path, or a damaged file?)"
    if "readonly" in text or "read-only" in text:
        return "the database is read-only: check the permissions of the file and its directory"
    if "locked" in text or "busy" in text:
        return (
            f"another connection held the write lock for longer than busy_timeout="
            f"{busy_timeout:g}s; raise busy_timeout or find the long transaction"
        )
    if "unable to open" in text:
        return (
            "the file cannot be opened: check that its directory exists and is writable "
            "(WAL keeps -wal and -shm files beside the database)"
        )
    return "the storage refused the operation"


@contextmanager
def storage_errors(path: str, operation: str, driver_errors: tuple[type[BaseException], ...], busy_timeout: float) -> Iterator[None]:
    """Turn the driver's errors into :class:`StorageError` naming the path and the cause."""
    try:
        yield
    except (StorageError, ClockError):  # ClockError: libsql's driver errors include ValueError
        raise
    except driver_errors as exc:
        raise StorageError(
            f"{operation} on {path!r} failed: {exc} ({_hint(str(exc), busy_timeout)})"
        ) from exc


# --- The synchronous transport, for any sqlite3-like driver ---------------------------------


class SyncSqlTransport(ClosedGuard, ClosesOnExit):
    """The synchronous transport over one DB-API connection; subclasses pick the driver.

    A subclass sets ``_driver_errors`` and implements ``_connect()``.  One connection is shared
    by every thread of the process, behind one lock held for each whole method, so a claim's
    ``BEGIN IMMEDIATE ... COMMIT`` is never interleaved with another call.
    """

    _driver_errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    _wal = True
    _lock_wait_in_python = False  # the driver's busy handler off; run() waits instead

    def __init__(self, path: str, *, clock: Clock, prefix: str | None, busy_timeout: float) -> None:
        self._tables = Tables.named(prefix)
        self._busy_timeout = check_busy_timeout(busy_timeout)
        self._clock = check_clock(clock)
        self.path = path
        self._lock = threading.Lock()
        self._lock_wait = self._busy_timeout if self._lock_wait_in_python else 0.0
        with self._errors("open"):
            self._conn = self._connect()
            try:
                driver_wait = 0.0 if self._lock_wait_in_python else self._busy_timeout
                for pragma in connection_pragmas(driver_wait, wal=self._wal):
                    run(self._conn, one_statement(pragma), transaction=False, lock_wait=self._lock_wait)
                run(self._conn, open_plan(self._tables), transaction=True, lock_wait=self._lock_wait)
            except BaseException:
                self._conn.close()
                raise

    def _connect(self) -> Any:
        raise NotImplementedError

    def _errors(self, operation: str):
        return storage_errors(self.path, operation, self._driver_errors, self._busy_timeout)

    def _run(self, operation: str, plan: Plan[T], *, transaction: bool) -> T:
        # The caller holds self._lock and has checked that the transport is open.
        with self._errors(operation):
            return run(self._conn, plan, transaction=transaction, lock_wait=self._lock_wait)

    def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        group_id, event, priority, routing_key = check_publish_args(group_id, event, priority, routing_key)
        with self._lock:
            self._check_open()
            plan = publish_plan(self._tables, group_id, event, priority, routing_key)
            self._run("publish", plan, transaction=True)

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys=None) -> Lease | None:
        worker_id, visibility, min_priority, routing_keys = check_claim_args(
            worker_id, visibility, min_priority, routing_keys
        )
        with self._lock:
            self._check_open()
            plan = claim_now_plan(self._tables, self._clock, new_token(worker_id), visibility, min_priority, routing_keys)
            return self._run("claim", plan, transaction=True)

    def ack(self, lease: Lease) -> bool:
        lease = check_lease(lease)
        with self._lock:
            self._check_open()
            return self._run("ack", ack_plan(self._tables, lease), transaction=True)

    def nack(self, lease: Lease, delay: float = 0) -> bool:
        lease = check_lease(lease)
        delay = check_delay(delay)
        with self._lock:
            self._check_open()
            now = read_clock(self._clock)
            return self._run("nack", nack_plan(self._tables, lease, now, delay), transaction=False)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


def claim_now_plan(t: Tables, clock: Clock, token: str, visibility: float, min_priority: int, routing_keys) -> Plan[Lease | None]:
    """claim_plan, reading the clock only once the write lock is held (after BEGIN IMMEDIATE),
    so that claims serialized by the lock also see time move forward in that order.  A bad
    reading raises there and the transaction rolls back: nothing is written."""
    now = read_clock(clock)
    return (yield from claim_plan(t, token, now, visibility, min_priority, routing_keys))


def one_statement(statement: Statement) -> Plan[Any]:
    """A plan of one statement (for settings such as PRAGMAs)."""
    return (yield statement)
