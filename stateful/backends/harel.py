"""The transports that the installed ``harel`` package ships, described for the checkers.

These are harel's own classes, unchanged: the checkers speak harel's Protocol natively
(SPEC.md R20), so nothing here adapts a call.  Each factory takes ``(clock, namespace)`` so that
durability and sharing can be checked: a namespace is a database file (SQLite, libSQL) or a
table prefix in the cluster of the environment (rqlite, as in :mod:`harel_ref.stateful.backends.rqlite`).

harel's Postgres, Redis, Mongo and SQS transports run on the server of :mod:`.postgres`,
:mod:`.redis`, :mod:`.mongo` and :mod:`.sqs`: the user's (``HAREL_POSTGRES_URL``,
``HAREL_REDIS_URL``, ``HAREL_MONGO_URL``, ``HAREL_SQS_URL``), where the tables, functions,
keys, collections and queues harel made are removed when the process ends, or a throwaway one
started here.  Their acks are
fenced by the lease's token; fairness is stamped by the group's lease, which neither policy
of SPEC R5 is, so they are declared ``"ack"``, the family they belong to, and the checkers show
where they differ.  Redis keeps each lease as a ``SET ... PX`` on the server's clock: it is
certified in wall-clock mode (R18).

harel 0.9.0's async libSQL and rqlite transports take no clock when they are created
(``AsyncLibsqlTransport.create``, ``AsyncRqliteTransport.from_url``); the factories below set
the attribute the transport reads its clock from (``_clock``) right after, so the fake clock
drives them as it drives the others.  docs/harel-0.9.md lists this among the findings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .._backend import Backend, Capabilities
from .rqlite import LANES as RQLITE_LANES, rotating_opener
from .sql import database_path, directory_for

__all__ = [
    "CAPABILITIES", "FILE_CAPABILITIES", "POSTGRES_CAPABILITIES", "REDIS_CAPABILITIES", "harel_libsql",
    "harel_libsql_async", "harel_memory", "harel_memory_async", "harel_mongo", "harel_mongo_async",
    "harel_postgres", "harel_postgres_async",
    "harel_redis", "harel_redis_async", "harel_sqs", "harel_sqs_async", "SQS_CAPABILITIES", "harel_rqlite", "harel_rqlite_async", "harel_sqlite",
    "harel_sqlite_async", "harel_tables",
]

CAPABILITIES = Capabilities.harel()
"""harel's in-memory transport: acks by seq, claim-stamped fairness, nothing shared."""

FILE_CAPABILITIES = Capabilities.harel(durable=True, shared=True)
"""harel's SQL transports: a file or a cluster outlives the transport, and is shared."""

POSTGRES_CAPABILITIES = Capabilities.harel(durable=True, shared=True, acks="fenced", fairness="ack")
"""harel's Postgres transports: the server outlives them, acks are fenced by token."""

REDIS_CAPABILITIES = dataclasses.replace(POSTGRES_CAPABILITIES, clock="wall")
"""harel's Redis transports: as Postgres, but a lease ends on the server's clock."""

MONGO_CAPABILITIES = POSTGRES_CAPABILITIES
"""harel's Mongo transports: a lock document per group carries the token and the lease's end
(read from the injected clock)."""

SQS_CAPABILITIES = Capabilities.harel(
    priority=False, durable=True, shared=True, acks="until-reclaimed", fairness="unspecified", clock="wall",
    resolution=1.0, group_ids=r"[!-~]{1,128}", event_bytes=32_768)
"""harel's SQS transports: what SQS FIFO is (:mod:`.sqs`): no priorities (they refuse them),
bodies of 256 KiB (an event of 32 KiB fits whatever its characters, once harel escapes it),
leases as visibility timeouts in whole seconds on the server's clock, ids of printable ASCII,
no order between groups; a receipt handle is good until its message is received again (R10a)."""


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

    return Backend("harel-rqlite", factory, FILE_CAPABILITIES, lanes=RQLITE_LANES)


def harel_rqlite_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncRqliteTransport

    opener = rotating_opener(harel_tables)

    async def factory(clock, namespace):
        prefix, urls = opener(namespace)
        transport = await AsyncRqliteTransport.from_url(urls[0], connect_retries=3, prefix=prefix)
        transport._clock = clock  # from_url() takes no clock (see the module docstring)
        return transport

    return Backend("harel-rqlite-async", factory, FILE_CAPABILITIES, is_async=True, lanes=RQLITE_LANES)



def _closed_on_error(connection, build):
    """``build(connection)``, closing the connection if that raises (harel creates its schema
    in its constructor)."""
    try:
        return build(connection)
    except BaseException:
        connection.close()
        raise


def _harel_names(prefix: str) -> None:
    """harel's rule for a prefix (an identifier of at most 30 characters)."""
    from harel.engine.schema import Names

    Names(prefix)


def _drop_harel_postgres(conn, prefix: str) -> None:
    from harel.engine.schema import Names

    names = Names(prefix)
    with conn.transaction():
        conn.execute(f"DROP TABLE IF EXISTS {names.messages}, {names.groups}")
        for function in (names.claim, names.ack):
            conn.execute(f"DROP FUNCTION IF EXISTS {function}")


def harel_postgres(tmp_dir: Path | str | None = None) -> Backend:
    import psycopg
    from harel.engine.transport import PostgresTransport

    from .postgres import open_namespace

    def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _drop_harel_postgres)
        return _closed_on_error(psycopg.connect(url), lambda conn: PostgresTransport(conn, clock, prefix=prefix))

    return Backend("harel-postgres", factory, POSTGRES_CAPABILITIES)


def harel_postgres_async(tmp_dir: Path | str | None = None) -> Backend:
    from harel.engine.aio_transport import AsyncPostgresTransport

    from .postgres import open_namespace

    async def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _drop_harel_postgres)
        return await AsyncPostgresTransport.from_dsn(url, clock, pool_size=4, prefix=prefix)

    return Backend("harel-postgres-async", factory, POSTGRES_CAPABILITIES, is_async=True)


def _delete_harel_keys(client, prefix: str) -> None:
    from .redis import delete_keys

    delete_keys(client, f"{prefix}:*")


def harel_redis(tmp_dir: Path | str | None = None) -> Backend:
    import redis
    from harel.engine.transport import RedisTransport

    from .redis import open_namespace

    def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _delete_harel_keys)
        return _closed_on_error(redis.Redis.from_url(url), lambda client: RedisTransport(client, clock, prefix=prefix))

    return Backend("harel-redis", factory, REDIS_CAPABILITIES)


def harel_redis_async(tmp_dir: Path | str | None = None) -> Backend:
    import redis.asyncio
    from harel.engine.aio_transport import AsyncRedisTransport

    from .redis import open_namespace

    async def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _delete_harel_keys)
        return AsyncRedisTransport(redis.asyncio.Redis.from_url(url), clock, prefix=prefix)

    return Backend("harel-redis-async", factory, REDIS_CAPABILITIES, is_async=True)


MONGO_DATABASE = "harel"
"""The database harel's Mongo transports use by default (their collections are prefixed)."""


def _harel_mongo_collections(prefix: str) -> list[str]:
    from harel.engine.schema import Names

    names = Names(prefix)
    return [names.messages, names.transport_locks, names.transport_counters]


def _drop_harel_mongo(client, prefix: str) -> None:
    from .mongo import drop_collections

    drop_collections(client, MONGO_DATABASE, _harel_mongo_collections(prefix))


def harel_mongo(tmp_dir: Path | str | None = None) -> Backend:
    import pymongo
    from harel.engine.transport import MongoTransport

    from .mongo import discard_namespace, open_namespace

    def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _drop_harel_mongo)
        return _closed_on_error(pymongo.MongoClient(url),
                                lambda client: MongoTransport(client, MONGO_DATABASE, clock, prefix=prefix))

    factory.discard = lambda namespace: discard_namespace(namespace, _harel_names)
    return Backend("harel-mongo", factory, MONGO_CAPABILITIES)


def harel_mongo_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncMongoTransport on a Motor client, as harel's ``from_url`` builds it (its ``close``
    calls the client's ``close()`` without awaiting it, which is right for Motor and would leak
    PyMongo's own AsyncMongoClient)."""
    import motor.motor_asyncio
    from harel.engine.aio_transport import AsyncMongoTransport

    from .mongo import discard_namespace, open_namespace

    async def factory(clock, namespace):
        url, prefix = open_namespace(namespace, _harel_names, _drop_harel_mongo)
        client = motor.motor_asyncio.AsyncIOMotorClient(url)
        try:  # the claim index, as harel's from_url makes it
            await client[MONGO_DATABASE][_harel_mongo_collections(prefix)[1]].create_index("available_at")
            return AsyncMongoTransport(client, MONGO_DATABASE, clock, prefix=prefix)
        except BaseException:
            client.close()
            raise

    factory.discard = lambda namespace: discard_namespace(namespace, _harel_names)
    return Backend("harel-mongo-async", factory, MONGO_CAPABILITIES, is_async=True)


def harel_sqs(tmp_dir: Path | str | None = None) -> Backend:
    """SqsTransport on a FIFO queue per namespace, with ``wait_seconds=0`` (harel's own knob):
    a claim that finds nothing answers at once instead of polling for a second."""
    from harel.engine.transport import SqsTransport

    from . import sqs

    def factory(clock, namespace):
        url, prefix = sqs.open_namespace(namespace, _harel_names)
        client = sqs.client(url)
        return _closed_on_error(client, lambda c: SqsTransport(c, sqs.create_queue(c, prefix), wait_seconds=0))

    return Backend("harel-sqs", factory, SQS_CAPABILITIES)


def harel_sqs_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncSqsTransport on an aiobotocore client, built as its ``create()`` builds one (which
    needs aioboto3): the client is entered on an exit stack that the transport's ``close()``
    closes (its ``_stack``).  ``wait_seconds=0`` as for :func:`harel_sqs`."""
    from contextlib import AsyncExitStack

    from harel.engine.aio_transport import AsyncSqsTransport

    from . import sqs

    async def factory(clock, namespace):
        url, prefix = sqs.open_namespace(namespace, _harel_names)
        stack = AsyncExitStack()
        try:
            client = await stack.enter_async_context(sqs.async_client(url))
            created = await client.create_queue(QueueName=sqs.queue_name(prefix), Attributes=sqs.QUEUE_ATTRIBUTES)
            transport = AsyncSqsTransport(client, created["QueueUrl"], wait_seconds=0)
        except BaseException:
            await stack.aclose()
            raise
        transport._stack = stack  # what create() sets: close() releases the client
        return transport

    return Backend("harel-sqs-async", factory, SQS_CAPABILITIES, is_async=True)
