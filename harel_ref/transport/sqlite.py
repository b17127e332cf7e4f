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
import concurrent.futures
import os
import sqlite3

from ._base import Clock, default_clock
from ._shell import Steps, T
from ._sql import AsyncSqlTransport, SyncSqlTransport, check_synchronous

__all__ = ["AsyncSqliteTransport", "SqliteTransport"]


class SqliteTransport(SyncSqlTransport):
    """The queue in the SQLite file at ``path`` (created if missing).  Thread-safe.

    - ``clock``: the time source, read once per claim, ack and nack (tests pass a fake one).
    - ``prefix``: tables are named ``<prefix>_harel_transport_...`` instead of the defaults,
      so several queues can live in one file.
    - ``busy_timeout``: seconds a write waits for SQLite's lock before StorageError.
    - ``synchronous``: ``"FULL"`` (every commit synced to disk), ``"EXTRA"``, or ``"NORMAL"``
      (synced at checkpoints only: faster, and a power cut may undo the last commits;
      :data:`~harel_ref.transport._sql.SYNCHRONOUS` says what each risks).
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
    (:class:`~harel_ref.transport._sql.AsyncSqlTransport`):

    - at ``synchronous`` FULL (the default) or EXTRA, every commit waits for the disk, so each
      operation is one trip to the connection's own thread (its checkpoints run there too);
    - at ``synchronous="NORMAL"`` it runs on the loop, awaiting only while another connection
      holds the write lock.

    At NORMAL the commits that wait for the disk are the checkpoints (which sync the WAL and the
    database) and the first write after one (which syncs the WAL's new header).  The
    connection's automatic checkpoint is therefore off: every ``CHECKPOINT_EVERY`` calls, the
    call that reaches the count runs a checkpoint, followed by that first write, in a thread of
    the transport's own, and awaits it before it answers (the loop runs on meanwhile).
    """

    CHECKPOINT_EVERY = 200
    """Calls between two checkpoints at NORMAL: about 1,000 WAL pages, SQLite's own interval."""

    def __init__(self, sync: SqliteTransport, *, on_loop: bool) -> None:
        super().__init__(sync, on_loop=on_loop)
        self._since_checkpoint = 0
        self._checkpoints: concurrent.futures.ThreadPoolExecutor | None = None  # made at the first
        self._checkpointing: concurrent.futures.Future[None] | None = None

    @classmethod
    async def create(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
    ) -> AsyncSqliteTransport:
        on_loop = check_synchronous(synchronous) == "NORMAL"
        opened = _SqliteForTheLoop if on_loop else SqliteTransport

        def open_it() -> SqliteTransport:
            sync = opened(path, clock=clock, prefix=prefix, busy_timeout=busy_timeout, synchronous=synchronous)
            if on_loop:
                sync._conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints run in a thread
            return sync

        sync = await asyncio.to_thread(open_it)
        try:
            return cls(sync, on_loop=on_loop)
        except BaseException:
            sync.close()
            raise

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        if self._thread is not None:
            return await super()._drive(operation, steps)
        await self._checkpoint_finished()  # one whose call was cancelled may still run
        try:
            return await super()._drive(operation, steps)
        finally:
            self._since_checkpoint += 1
            if self._since_checkpoint >= self.CHECKPOINT_EVERY:
                self._since_checkpoint = 0
                if self._checkpoints is None:
                    self._checkpoints = concurrent.futures.ThreadPoolExecutor(1, "harel-ref checkpoint")
                self._checkpointing = self._checkpoints.submit(self._checkpoint)
                await self._checkpoint_finished()

    async def _checkpoint_finished(self) -> None:
        """Wait for the checkpoint in the thread, if one runs: it uses the connection.  A caller
        cancelled meanwhile leaves it running, and the next call or close() waits for it."""
        if self._checkpointing is not None:
            if not self._checkpointing.done():
                await asyncio.shield(asyncio.wrap_future(self._checkpointing))
            self._checkpointing = None

    def _checkpoint(self) -> None:
        """In the thread: copy the WAL into the database, then start the WAL over if it all was."""
        conn = self._sync._conn
        try:
            _, pages, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if pages > 0 and copied == pages:
                # The write that starts the WAL over syncs its header: let it be this one, here,
                # rather than a call's on the loop.  It rewrites a row unchanged.
                conn.execute(f"UPDATE {self._sync._tables.meta} SET value = value WHERE key = 'schema_version'")
        except sqlite3.Error:
            pass  # another connection held the lock: the next checkpoint, CHECKPOINT_EVERY calls on, retries

    async def _release(self) -> None:
        if self._checkpoints is None:
            await super()._release()
            return
        # In the checkpoints' thread, after the checkpoint that may still run there; done even
        # if this close() is cancelled.
        closing = self._checkpoints.submit(self._sync.close)
        self._checkpoints.shutdown(wait=False)
        await asyncio.shield(asyncio.wrap_future(closing))
