"""The transports: one module per backend, every one behind the same Protocol.

``InMemoryTransport`` needs nothing beyond Python.  The others are imported on first use, so
the core installs light; a missing optional package is reported with the extra to install.
"""

from __future__ import annotations

import importlib

from ._base import (
    AsyncTransport,
    ClockError,
    Lease,
    OutcomeUnknownError,
    StorageError,
    Transport,
    TransportClosedError,
    TransportError,
)
from .memory import InMemoryStore, InMemoryTransport

__all__ = [
    "AsyncLibsqlTransport",
    "AsyncMongoTransport",
    "AsyncPostgresTransport",
    "AsyncRedisTransport",
    "AsyncRqliteTransport",
    "AsyncSqliteTransport",
    "AsyncSqsTransport",
    "AsyncTransport",
    "ClockError",
    "InMemoryStore",
    "InMemoryTransport",
    "Lease",
    "LibsqlTransport",
    "MongoTransport",
    "OutcomeUnknownError",
    "PostgresTransport",
    "RedisTransport",
    "RqliteTransport",
    "SqliteTransport",
    "SqsTransport",
    "StorageError",
    "Transport",
    "TransportClosedError",
    "TransportError",
]

# name -> (module, extra that provides its driver)
_LAZY = {
    "SqliteTransport": ("sqlite", "sqlite"),
    "AsyncSqliteTransport": ("sqlite", "sqlite"),
    "LibsqlTransport": ("libsql", "libsql"),
    "AsyncLibsqlTransport": ("libsql", "libsql"),
    "RqliteTransport": ("rqlite", "rqlite"),
    "AsyncRqliteTransport": ("rqlite", "rqlite"),
    "PostgresTransport": ("postgres", "postgres"),
    "AsyncPostgresTransport": ("postgres", "postgres"),
    "RedisTransport": ("redis", "redis"),
    "MongoTransport": ("mongo", "mongo"),
    "AsyncMongoTransport": ("mongo", "mongo"),
    "AsyncRedisTransport": ("redis", "redis"),
    "SqsTransport": ("sqs", "sqs"),
    "AsyncSqsTransport": ("sqs", "sqs"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, extra = _LAZY[name]
    try:
        module = importlib.import_module(f".{module_name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("harel_ref"):
            raise
        raise ImportError(
            f"{name} needs the optional package {exc.name!r}: pip install 'harel-ref[{extra}]'"
        ) from exc
    return getattr(module, name)
