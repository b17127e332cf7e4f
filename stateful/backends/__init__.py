"""The bundled transports described for the checkers, by name.

Each entry is a function ``backend(tmp_dir) -> Backend``: the directory holds whatever files a
backend keeps (each namespace gets its own).  ``available()`` lists the names whose optional
packages or services are present.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from .._backend import Backend

__all__ = ["BUNDLED", "load"]

# name -> "module:function" (modules are imported on demand: their drivers are optional)
BUNDLED: dict[str, str] = {
    "memory": "stateful.backends.memory:memory",
    "memory-async": "stateful.backends.memory:memory_async",
    "sqlite": "stateful.backends.sql:sqlite",
    "sqlite-async": "stateful.backends.sql:sqlite_async",
    "libsql": "stateful.backends.sql:libsql",
    "libsql-async": "stateful.backends.sql:libsql_async",
    "rqlite": "stateful.backends.rqlite:rqlite",
    "rqlite-async": "stateful.backends.rqlite:rqlite_async",
    "postgres": "stateful.backends.postgres:postgres",
    "postgres-async": "stateful.backends.postgres:postgres_async",
    "redis": "stateful.backends.redis:redis",
    "redis-async": "stateful.backends.redis:redis_async",
    # the transports of the installed harel package (harel-ref[harel]), speaking its Protocol
    "harel-memory": "stateful.backends.harel:harel_memory",
    "harel-memory-async": "stateful.backends.harel:harel_memory_async",
    "harel-sqlite": "stateful.backends.harel:harel_sqlite",
    "harel-sqlite-async": "stateful.backends.harel:harel_sqlite_async",
    "harel-libsql": "stateful.backends.harel:harel_libsql",
    "harel-libsql-async": "stateful.backends.harel:harel_libsql_async",
    "harel-rqlite": "stateful.backends.harel:harel_rqlite",
    "harel-rqlite-async": "stateful.backends.harel:harel_rqlite_async",
}


def load(name: str) -> Callable[[Path], Backend]:
    """The ``backend(tmp_dir)`` function of a bundled transport."""
    try:
        target = BUNDLED[name]
    except KeyError:
        raise ValueError(f"unknown bundled transport {name!r}; choose from {sorted(BUNDLED)}") from None
    module_name, _, function = target.partition(":")
    return getattr(importlib.import_module(module_name), function)
