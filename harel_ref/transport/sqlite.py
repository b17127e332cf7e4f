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

from ._base import Clock, default_clock
from ._shell import Steps, T
from ._sql import AsyncSqlTransport, SyncSqlTransport, check_loop_budget, check_synchronous

__all__ = ["AsyncSqliteTransport", "SqliteTransport"]


class SqliteTransport(SyncSqlTransport):
    """The queue in the SQLite file at ``path`` (created if missing).  Thread-safe.

    - ``clock``: the time source, read once per claim, ack and nack (tests pass a fake one).
    - ``prefix``: tables are named ``<prefix>_harel_transport_...`` instead of the defaults,
      so several queues can live in one file.
    - ``busy_timeout``: seconds a write waits for SQLite's lock before StorageError.
    - ``synchronous``: ``"FULL"`` (every call but a claim synced to disk before it returns; a
      claim is synced with the next call that is), ``"EXTRA"`` (every call synced), or
      ``"NORMAL"`` (synced at checkpoints only: faster, and a power cut may undo the last
      calls); :data:`~harel_ref.transport._sql.SYNCHRONOUS` says what each risks.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
    ) -> None:
        super().__init__(os.fspath(path), clock=clock, prefix=prefix, busy_timeout=busy_timeout,
                         synchronous=synchronous)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )


class _SqliteForTheLoop(SqliteTransport):
    """A SqliteTransport whose connection never waits for the write lock itself: the waiting is
    done between tries, which :class:`AsyncSqliteTransport` awaits on the loop."""

    _lock_wait_in_python = True


class AsyncSqliteTransport(AsyncSqlTransport):
    """The asyncio twin of :class:`SqliteTransport` (the same options), on its own connection.

    Build it with ``await AsyncSqliteTransport.create(path, ...)``.  Where each operation runs
    (:class:`~harel_ref.transport._sql.AsyncSqlTransport`) follows from whether its commit
    waits for the disk (:data:`~harel_ref.transport._sql.SYNCHRONOUS`):

    - a call whose commit is not synced runs on the loop: every call at
      ``synchronous="NORMAL"``, a claim at FULL (the default);
    - a call whose commit is synced (a publish, an ack or a nack at FULL; every call at EXTRA)
      runs on the loop too while syncs take less than ``loop_budget`` seconds (1 ms by
      default), and as one trip to the connection's own thread once one took longer, until
      syncs are quick again (:class:`~harel_ref.transport._sql.QuickSyncs`).
      ``loop_budget=0`` never holds the loop for a sync.

    What else would wait for the disk is the checkpoints (which sync the WAL and the database),
    the first write after one (which syncs the WAL's new header) and the checkpoint of
    ``close()``; none of them runs on the loop.  The connection's automatic checkpoint is off.
    The call that makes ``CHECKPOINT_EVERY`` gives the connection's thread a checkpoint,
    followed by a write that starts the WAL over, and answers at once; the next call waits for
    it before its turn begins (and before it reads the clock).  ``close()`` closes the
    connection in that thread too.
    """

    CHECKPOINT_EVERY = 400
    """Calls between two checkpoints: 1,400–1,800 WAL pages, about the sync transport's
    interval (:data:`~harel_ref.transport._sql.WAL_BYTES`)."""

    LOOP_BUDGET = 0.001
    """The default ``loop_budget``: about ten trips to the thread.  On a disk that syncs slower
    than that (a spinning disk: 5 to 15 ms) the first synced write holds the loop, and every
    synced call after it runs in the thread."""

    def __init__(self, sync: SqliteTransport, *, loop_budget: float = LOOP_BUDGET) -> None:
        super().__init__(sync, on_loop=sync.unsynced, loop_budget=loop_budget)
        self._since_checkpoint = 0

    @classmethod
    async def create(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
        loop_budget: float = LOOP_BUDGET,
    ) -> AsyncSqliteTransport:
        check_synchronous(synchronous)
        check_loop_budget(loop_budget)

        def open_it() -> SqliteTransport:
            # Calls may run on the loop, where the driver must not wait for a lock itself (it
            # would hold the loop while it waits), nor checkpoint (checkpoints run in the thread).
            sync = _SqliteForTheLoop(path, clock=clock, prefix=prefix, busy_timeout=busy_timeout,
                                     synchronous=synchronous)
            try:
                sync._conn.execute("PRAGMA wal_autocheckpoint = 0")
            except BaseException:
                sync.close()
                raise
            return sync

        sync = await asyncio.to_thread(open_it)
        try:
            return cls(sync, loop_budget=loop_budget)
        except BaseException:
            sync.close()
            raise

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        try:
            return await super()._drive(operation, steps)
        finally:
            self._since_checkpoint += 1
            if self._since_checkpoint >= self.CHECKPOINT_EVERY:
                self._since_checkpoint = 0
                self._thread.submit(self._checkpoint)  # the next call's turn waits for it

    def _checkpoint(self) -> None:
        """In the thread: copy the WAL into the database, then start the WAL over if it all was."""
        conn, meta = self._sync._conn, self._sync._tables.meta
        try:
            _, pages, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if pages > 0 and copied == pages:
                # The next write starts the WAL over and syncs its new header: let it be this
                # one, here, rather than a call's on the loop.  It must change a row (a write
                # that changes nothing writes no page, and restarts nothing): it counts.
                conn.execute(
                    f"INSERT INTO {meta} (key, value) VALUES ('wal_restarts', 1)"
                    f" ON CONFLICT (key) DO UPDATE SET value = value + 1"
                )
        except sqlite3.Error:
            pass  # another connection held the lock: the next checkpoint, CHECKPOINT_EVERY calls on, retries
