"""LibsqlTransport: the SQLite transport over the ``libsql`` driver (Turso's SQLite fork).

Same tables, same SQL (:mod:`harel_ref.transport._sql`), same one-statement claim as
:class:`~harel_ref.transport.SqliteTransport`; only the driver differs.  On a local file it
behaves like SQLite.  What was checked against libsql 0.1.11 (bundling SQLite 3.42):

- ``isolation_level=None`` is honoured (autocommit; each statement commits on its own), and
  ``BEGIN IMMEDIATE`` takes the write lock: a second libsql connection, in this process or
  another, waits ``busy_timeout`` and then fails with "database is locked".
- **libsql holds the GIL while it waits for a lock.**  Its busy handler sleeps inside the call
  without letting other Python threads run, so when the connection holding the lock belongs to
  another thread of the same process, that thread cannot reach its COMMIT: both stall for the
  whole ``busy_timeout`` and the waiter fails with "database is locked".  (Found by the
  certifier's concurrent search: two instances, each claiming in its own thread.)  This
  transport therefore turns libsql's busy handler off (``timeout=0``, ``PRAGMA busy_timeout =
  0``) and waits in Python instead: a statement that starts a transaction (``BEGIN
  IMMEDIATE``, or a claim, ack or nack, each one statement) is retried, with sleeps that
  release the GIL, until ``busy_timeout`` has passed (:func:`~harel_ref.transport._sql.run`).
  Such a statement did nothing when it failed, so a retry never acts twice.  stdlib
  ``sqlite3`` releases the GIL while it waits.
- ``PRAGMA journal_mode = WAL`` is honoured.
- Floats round-trip exactly (``-0.0`` comes back as ``0.0``, as in SQLite); empty and large
  Unicode strings round-trip.
- **A TEXT value is cut at its first NUL character when read** (it is written whole).  The
  shared SQL therefore reads text back as BLOB and decodes it, so events containing ``"\\x00"``
  survive.
- Errors arrive as plain ``ValueError`` ("database is locked", "file is not a database"), not as
  DB-API exception classes; they are turned into :class:`StorageError` here.
- A cursor left open blocks ``COMMIT`` ("SQL statements in progress"): the runner closes each one.
- Using a connection after ``close()`` panics in Rust (``PanicException``); the transport's
  closed check keeps calls away from it.
- libsql carries its own copy of SQLite, so in **one process** it does not see the write lock of
  a stdlib ``sqlite3`` connection on the same file (POSIX locks belong to the process).  Do not
  mix the two drivers on one file in one process; across processes they exclude each other.

Connections are not thread-safe: one connection per transport, behind one lock.

**Embedded replicas (EXPERIMENTAL, not validated)**: ``sync_url`` (with ``auth_token`` and
``sync_interval``) opens the file as an embedded replica of a Turso/sqld primary.  The arguments
are passed to ``libsql.connect`` and ``sync()`` is called after opening, but nothing here has
been run against a real primary; in particular whether ``BEGIN IMMEDIATE`` serializes claims
across replicas is unknown.  WAL mode is left to the replica in that case.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ._base import Clock, default_clock
from ._sql import OPERATIONS, AsyncSqlTransport, SyncSqlTransport

__all__ = ["AsyncLibsqlTransport", "LibsqlTransport"]


def _libsql_errors() -> tuple[type[BaseException], ...]:
    import libsql

    # libsql reports storage errors as ValueError; arguments were checked before any call.
    return (libsql.Error, ValueError)


class LibsqlTransport(SyncSqlTransport):
    """The queue in the libSQL database at ``path``.  Thread-safe (one connection, one lock).

    ``clock``, ``prefix``, ``busy_timeout`` and ``synchronous`` are as for SqliteTransport; ``sync_url``,
    ``auth_token`` and ``sync_interval`` make it an embedded replica (EXPERIMENTAL).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
        sync_url: str | None = None,
        auth_token: str | None = None,
        sync_interval: float | None = None,
    ) -> None:
        self._driver_errors = _libsql_errors()
        self._sync_url = sync_url
        self._auth_token = auth_token
        self._sync_interval = sync_interval
        self._wal = sync_url is None
        self._lock_wait_in_python = True  # libsql would hold the GIL while it waits (above)
        super().__init__(os.fspath(path), clock=clock, prefix=prefix, busy_timeout=busy_timeout,
                         synchronous=synchronous)

    def _connect(self) -> Any:
        import libsql

        options: dict[str, Any] = {}
        if self._sync_url is not None:
            options = {"sync_url": self._sync_url, "auth_token": self._auth_token or ""}
            if self._sync_interval is not None:
                options["sync_interval"] = self._sync_interval
        conn = libsql.connect(
            self.path,
            isolation_level=None,
            _check_same_thread=False,  # used from several threads, always under self._lock
            timeout=0,  # no busy handler: run() waits for locks, without holding the GIL
            **options,
        )
        if self._sync_url is not None:
            conn.sync()
        return conn


class AsyncLibsqlTransport(AsyncSqlTransport):
    """The asyncio twin of :class:`LibsqlTransport`, run on the event loop.

    libsql holds the GIL through every call (a statement, a commit's sync), so a thread of its
    own would not free the loop while a statement runs, and each trip there and back would
    only add its cost.  The statements therefore run on the loop; while another connection
    holds the write lock the call awaits between tries, and the loop runs on.  Build it with
    ``await AsyncLibsqlTransport.create(path, ...)``, which takes the same arguments as
    LibsqlTransport.
    """

    @classmethod
    async def create(cls, path: str | os.PathLike[str], **options: Any) -> AsyncLibsqlTransport:
        return cls(await asyncio.to_thread(LibsqlTransport, path, **options), on_loop=OPERATIONS, thread=False)
