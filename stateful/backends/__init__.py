"""The bundled transports described for the checkers, by name.

Each entry is a function ``backend(tmp_dir) -> Backend``: the directory holds whatever files a
backend keeps (each namespace gets its own).  ``available()`` lists the names whose optional
packages or services are present.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from .._backend import Backend

__all__ = ["BUNDLED", "IN_PROCESS", "clean_up", "load"]

# name -> "module:function", a module of this package (imported on demand: drivers are optional)
BUNDLED: dict[str, str] = {
    "memory": "memory:memory",
    "memory-async": "memory:memory_async",
    "sqlite": "sql:sqlite",
    "sqlite-async": "sql:sqlite_async",
    "libsql": "sql:libsql",
    "libsql-async": "sql:libsql_async",
    "rqlite": "rqlite:rqlite",
    "rqlite-async": "rqlite:rqlite_async",
    "postgres": "postgres:postgres",
    "postgres-async": "postgres:postgres_async",
    "redis": "redis:redis",
    "redis-async": "redis:redis_async",
    "mongo": "mongo:mongo",
    "mongo-async": "mongo:mongo_async",
    "sqs": "sqs:sqs",
    "sqs-async": "sqs:sqs_async",
    # the transports of the installed harel package (harel-ref[harel]), speaking its Protocol
    "harel-memory": "harel:harel_memory",
    "harel-memory-async": "harel:harel_memory_async",
    "harel-sqlite": "harel:harel_sqlite",
    "harel-sqlite-async": "harel:harel_sqlite_async",
    "harel-libsql": "harel:harel_libsql",
    "harel-libsql-async": "harel:harel_libsql_async",
    "harel-rqlite": "harel:harel_rqlite",
    "harel-rqlite-async": "harel:harel_rqlite_async",
    "harel-postgres": "harel:harel_postgres",
    "harel-postgres-async": "harel:harel_postgres_async",
    "harel-redis": "harel:harel_redis",
    "harel-redis-async": "harel:harel_redis_async",
    "harel-mongo": "harel:harel_mongo",
    "harel-mongo-async": "harel:harel_mongo_async",
    "harel-sqs": "harel:harel_sqs",
    "harel-sqs-async": "harel:harel_sqs_async",
}

IN_PROCESS = frozenset({"memory", "memory-async", "harel-memory", "harel-memory-async"})
"""The bundled transports whose storage lives in the process that opened it: their instances
share it, other processes cannot see it (so the concurrent search runs their branches in
threads without asking, SPEC.md C9)."""


def load(name: str) -> Callable[[Path], Backend]:
    """The ``backend(tmp_dir)`` function of a bundled transport."""
    try:
        target = BUNDLED[name]
    except KeyError:
        raise ValueError(f"unknown bundled transport {name!r}; choose from {sorted(BUNDLED)}") from None
    module_name, _, function = target.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module_name}"), function)


def clean_up(timeout: float = 10.0) -> None:
    """Remove what this process made on the user's servers (rqlite tables, Postgres tables and
    functions, Redis keys, Mongo collections, SQS queues), for each server backend loaded here; ``timeout``
    bounds each rqlite request.  A certifier's search process calls it as it ends; the main
    process does at exit."""
    if (rqlite := sys.modules.get(f"{__name__}.rqlite")) is not None:
        rqlite.drop_opened_tables(timeout=timeout)
    if (postgres := sys.modules.get(f"{__name__}.postgres")) is not None:
        postgres.drop_opened()
    if (redis := sys.modules.get(f"{__name__}.redis")) is not None:
        redis.delete_opened()
    if (mongo := sys.modules.get(f"{__name__}.mongo")) is not None:
        mongo.drop_opened()
    if (sqs := sys.modules.get(f"{__name__}.sqs")) is not None:
        sqs.delete_opened()
