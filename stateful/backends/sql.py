"""The SQLite and libSQL transports, sync and async, described for the checkers.

Each namespace gets its own database file in ``tmp_dir``; calling the factory again with the same
namespace opens the same file, which is how the checkers close-and-reopen a queue (durability)
and open a second instance on it (sharing).  ``factory.discard(namespace)`` removes the file
once the checkers are done with the namespace (the certifier calls it after each example).
"""

from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harel_ref.transport import (
    AsyncLibsqlTransport,
    AsyncSqliteTransport,
    LibsqlTransport,
    SqliteTransport,
)

from .._backend import Backend, Capabilities

__all__ = ["database_path", "directory_for", "libsql", "libsql_async", "sqlite", "sqlite_async"]

CAPABILITIES = Capabilities(durable=True, shared=True)


def database_path(directory: Path, namespace: str, kind: str) -> Path:
    """The file for ``namespace`` in ``directory``: readable, and distinct per namespace."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", namespace)[:40]
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return Path(directory) / f"{kind}-{slug}-{digest}.db"


def directory_for(tmp_dir: Path | str | None) -> Path:
    """``tmp_dir``, or a new temporary directory removed when the process exits.  Fixed once
    per Backend, so every factory call for a namespace finds the same file."""
    if tmp_dir is not None:
        return Path(tmp_dir)
    directory = tempfile.mkdtemp(prefix="harel-ref-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return Path(directory)


def _discarder(directory: Path, kind: str):
    """``discard(namespace)``: remove the namespace's database file and its WAL companions once
    the checkers are done with it, so a long search does not pile up files."""

    def discard(namespace: str) -> None:
        path = database_path(directory, namespace, kind)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    return discard


def _sync(name: str, transport_class, kind: str, tmp_dir: Path | str | None) -> Backend:
    directory = directory_for(tmp_dir)

    def factory(clock, namespace):
        return transport_class(database_path(directory, namespace, kind), clock=clock)

    factory.discard = _discarder(directory, kind)
    return Backend(name, factory, CAPABILITIES)


def _async(name: str, transport_class, kind: str, tmp_dir: Path | str | None, **options: Any) -> Backend:
    directory = directory_for(tmp_dir)

    async def factory(clock, namespace):
        return await transport_class.create(database_path(directory, namespace, kind), clock=clock, **options)

    factory.discard = _discarder(directory, kind)
    return Backend(name, factory, CAPABILITIES, is_async=True)


def sqlite(tmp_dir: Path | str | None = None) -> Backend:
    return _sync("sqlite", SqliteTransport, "sqlite", tmp_dir)


def sqlite_async(tmp_dir: Path | str | None = None, *, synchronous: str = "FULL",
                 loop_budget: float | None = None) -> Backend:
    """At NORMAL calls run on the loop; at FULL (the default) claims run on the loop, and the
    other calls too while their syncs are quick, else in the connection's thread; at EXTRA
    every call is synced, and runs where FULL's synced calls do.  ``loop_budget=0`` sends every
    synced call to the thread (None: the twin's default, AsyncSqliteTransport.LOOP_BUDGET)."""
    name = "sqlite-async" if synchronous == "FULL" else f"sqlite-async-{synchronous.lower()}"
    options: dict[str, Any] = {"synchronous": synchronous}
    if loop_budget is not None:
        name, options["loop_budget"] = f"{name}-loop-budget-{loop_budget:g}", loop_budget
    return _async(name, AsyncSqliteTransport, "sqlite", tmp_dir, **options)


def libsql(tmp_dir: Path | str | None = None) -> Backend:
    return _sync("libsql", LibsqlTransport, "libsql", tmp_dir)


def libsql_async(tmp_dir: Path | str | None = None) -> Backend:
    return _async("libsql-async", AsyncLibsqlTransport, "libsql", tmp_dir)
