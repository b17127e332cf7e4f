"""SqliteTransport: a durable queue in one SQLite file (stdlib ``sqlite3``), and its asyncio twin.

A claim is one ``UPDATE ... RETURNING`` statement: SQLite takes its single write lock before the
statement reads anything, so picking a group and leasing its head is race-free across threads
and processes with plain SQL (publish, the one operation of two statements, runs inside
``BEGIN IMMEDIATE``).  The connection is opened in autocommit (``isolation_level=None``) so that
transactions are driven by hand; the database is in WAL mode, and ``busy_timeout`` makes a
writer wait for the lock rather than fail at once.  The SQL itself is in :mod:`harel_ref.transport._sql`, shared
with the libSQL transport.

Errors of the storage (a file that is not a database, a read-only file or directory, the lock
held by someone else for longer than ``busy_timeout``) are raised as :class:`StorageError`
naming the path; the failed call has changed nothing.

Do not open the same file with another SQLite library (such as ``libsql``) *in the same
process*: POSIX file locks belong to the process, so two libraries there do not see each
other's locks.  Separate processes are safe.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from typing import Any

from ._base import Clock, check_clock, default_clock
from ._shell import AsyncShell, Steps, T
from ._sql import (
    SqlCore,
    SyncSqlTransport,
    Tables,
    check_busy_timeout,
    connection_pragmas,
    one_statement,
    open_plan,
    run_async,
    storage_errors,
)

__all__ = ["AsyncSqliteTransport", "SqliteTransport"]


class SqliteTransport(SyncSqlTransport):
    """The queue in the SQLite file at ``path`` (created if missing).  Thread-safe.

    - ``clock``: the time source, read once per claim, ack and nack (tests pass a fake one).
    - ``prefix``: tables are named ``<prefix>_harel_transport_...`` instead of the defaults,
      so several queues can live in one file.
    - ``busy_timeout``: seconds a write waits for SQLite's lock before StorageError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        super().__init__(os.fspath(path), clock=clock, prefix=prefix, busy_timeout=busy_timeout)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )


class AsyncSqliteTransport(AsyncShell):
    """The asyncio twin of :class:`SqliteTransport`, over one ``aiosqlite`` connection.

    Build it with ``await AsyncSqliteTransport.create(path, ...)``.  A SQLite transaction
    belongs to the connection, not to the coroutine, so every call holds an asyncio.Lock for
    its whole duration: one task's ``BEGIN IMMEDIATE`` (publish) never lands inside another's.
    """

    def __init__(self, conn: Any, path: str, tables: Tables, clock: Clock, busy_timeout: float) -> None:
        # Use create(); __init__ only stores what create() prepared.
        self._conn = conn
        self.path = path
        self._core = SqlCore(tables)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._serial = asyncio.Lock()

    @classmethod
    async def create(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
    ) -> AsyncSqliteTransport:
        import aiosqlite

        tables = Tables.named(prefix)
        clock = check_clock(clock)
        busy_timeout = check_busy_timeout(busy_timeout)
        path = os.fspath(path)
        with storage_errors(path, "open", (sqlite3.Error,), busy_timeout):
            conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
            try:
                for pragma in connection_pragmas(busy_timeout):
                    await run_async(conn, one_statement(pragma), transaction=False)
                await run_async(conn, open_plan(tables), transaction=True)
            except BaseException:
                await conn.close()
                raise
        return cls(conn, path, tables, clock, busy_timeout)

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        with storage_errors(self.path, operation, (sqlite3.Error,), self._busy_timeout):
            return await run_async(self._conn, steps, transaction=operation in SqlCore.TRANSACTIONS)

    async def _release(self) -> None:
        await self._conn.close()
