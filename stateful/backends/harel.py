"""The transports that the installed ``harel`` package ships, described for the checkers.

These are harel's own classes, unchanged: the checkers speak harel's Protocol natively
(SPEC.md R20), so nothing here adapts a call.  Each factory takes ``(clock, namespace)`` so that
durability and sharing can be checked: a namespace is a database file (SQLite, libSQL) or a
table prefix in the cluster of the environment (rqlite, as in :mod:`harel_ref.stateful.backends.rqlite`).

harel 0.9.0's async libSQL and rqlite transports take no clock when they are created
(``AsyncLibsqlTransport.create``, ``AsyncRqliteTransport.from_url``); the factories below set
the attribute the transport reads its clock from (``_clock``) right after, so the fake clock
drives them as it drives the others.  docs/harel-0.9.md lists this among the findings.
"""

from __future__ import annotations

from pathlib import Path

from .._backend import Backend, Capabilities
from .rqlite import rotating_opener
from .sql import database_path, directory_for

__all__ = [
    "CAPABILITIES", "FILE_CAPABILITIES", "harel_libsql", "harel_libsql_async", "harel_memory",
    "harel_memory_async", "harel_rqlite", "harel_rqlite_async", "harel_sqlite", "harel_sqlite_async",
    "harel_tables",
]

CAPABILITIES = Capabilities.harel()
"""harel's in-memory transport: acks by seq, claim-stamped fairness, nothing shared."""

FILE_CAPABILITIES = Capabilities.harel(durable=True, shared=True)
"""harel's SQL transports: a file or a cluster outlives the transport, and is shared."""


def harel_tables(prefix: str) -> list[str]:
    """The tables harel's SQL transports create under ``prefix``."""
    from harel.engine.schema import Names

    names = Names(prefix)
    return [names.messages, names.groups]


def harel_memory(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.transport import InMemoryTransport

    return Backend("harel-memory", lambda clock, namespace: InMemoryTransport(clock), CAPABILITIES)


def harel_memory_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncInMemoryTransport

    async def factory(clock, namespace):
        return AsyncInMemoryTransport(clock)

    return Backend("harel-memory-async", factory, CAPABILITIES, is_async=True)


def harel_sqlite(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.transport import SqliteTransport

    directory = directory_for(tmp_dir)

    def factory(clock, namespace):
        return SqliteTransport(database_path(directory, namespace, "harel-sqlite"), clock)

    return Backend("harel-sqlite", factory, FILE_CAPABILITIES)


def harel_sqlite_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncSqliteTransport

    directory = directory_for(tmp_dir)

    async def factory(clock, namespace):
        return await AsyncSqliteTransport.create(str(database_path(directory, namespace, "harel-sqlite")), clock)

    return Backend("harel-sqlite-async", factory, FILE_CAPABILITIES, is_async=True)


def harel_libsql(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.transport import LibsqlTransport

    directory = directory_for(tmp_dir)

    def factory(clock, namespace):
        return LibsqlTransport(str(database_path(directory, namespace, "harel-libsql")), clock)

    return Backend("harel-libsql", factory, FILE_CAPABILITIES)


def harel_libsql_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncLibsqlTransport

    directory = directory_for(tmp_dir)

    async def factory(clock, namespace):
        transport = await AsyncLibsqlTransport.create(str(database_path(directory, namespace, "harel-libsql")))
        transport._t._clock = clock  # create() takes no clock (see the module docstring)
        return transport

    return Backend("harel-libsql-async", factory, FILE_CAPABILITIES, is_async=True)


def harel_rqlite(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.transport import RqliteTransport

    opener = rotating_opener(harel_tables)

    def factory(clock, namespace):
        prefix, urls = opener(namespace)
        return RqliteTransport(urls[0], clock=clock, prefix=prefix)

    return Backend("harel-rqlite", factory, FILE_CAPABILITIES)


def harel_rqlite_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncRqliteTransport

    opener = rotating_opener(harel_tables)

    async def factory(clock, namespace):
        prefix, urls = opener(namespace)
        transport = await AsyncRqliteTransport.from_url(urls[0], connect_retries=3, prefix=prefix)
        transport._clock = clock  # from_url() takes no clock (see the module docstring)
        return transport

    return Backend("harel-rqlite-async", factory, FILE_CAPABILITIES, is_async=True)

