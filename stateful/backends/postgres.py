"""The Postgres transports, sync and async, described for the checkers.

The server comes from the environment or is started here:

- ``HAREL_POSTGRES_URL`` (a libpq URL, e.g. ``postgresql://user:pw@host:5432/db``): a server
  of yours.  Each namespace becomes a table prefix there, and the tables and functions this
  process made are dropped when it exits (:func:`drop_opened`).  Nothing else is touched.
- unset: a throwaway server of this process (:class:`~harel_ref.testing.servers.PostgresServer`,
  Debian's ``postgresql`` binaries), started on first use and deleted at exit.  Each
  pytest-xdist worker gets its own.

The clock is injectable (``now`` is a parameter of every call) and fairness is stamped on ack
(SPEC R5), as upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harel_ref.transport import AsyncPostgresTransport, PostgresTransport
from harel_ref.testing.servers import PostgresServer
from harel_ref.transport.postgres import PgNames

from .._backend import Backend, Capabilities
from ._server import ServerFromEnv, removed_at_exit
from ._server import prefix_for as _prefix_for

__all__ = ["CAPABILITIES", "drop_opened", "open_namespace", "postgres", "postgres_async", "prefix_for", "server_url"]

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="ack", clock="injectable")

_SERVER = ServerFromEnv("HAREL_POSTGRES_URL", PostgresServer)


def server_url() -> str:
    """``$HAREL_POSTGRES_URL``, else the URL of the throwaway server of this process (or of
    the process that spawned it), started now if it is not running yet."""
    return _SERVER.url()


def _lower_case(check: Callable[[str], Any]) -> Callable[[str], None]:
    """``check``, and lower case: Postgres folds names, so a prefix with capitals would name
    another's tables."""

    def checked(prefix: str) -> None:
        check(prefix)
        if prefix != prefix.lower():
            raise ValueError("upper case")

    return checked


_check = _lower_case(PgNames.named)


def prefix_for(namespace: str) -> str:
    """The table prefix of a namespace: itself when it makes valid lower-case Postgres names,
    else ``ns_`` and a digest of it."""
    return _prefix_for(namespace, _check)


def _drop(conn, prefix: str) -> None:
    names = PgNames.named(prefix)
    with conn.transaction():
        conn.execute(f"DROP TABLE IF EXISTS {names.messages}, {names.groups}, {names.meta}")
        for function in (names.publish, names.claim, names.ack):
            conn.execute(f"DROP FUNCTION IF EXISTS {function}")


def _opened_prefix(namespace: str) -> tuple[str, str]:
    return _SERVER.open(namespace, _check, _drop)


def open_namespace(namespace: str, check, drop) -> tuple[str, str]:
    """The server's URL and a prefix for ``namespace`` that ``check`` accepts in lower case;
    ``drop(connection, prefix)`` removes its tables at exit if the server is the user's.  For
    transports of other schemas on the same server (harel's: :mod:`.harel`)."""

    return _SERVER.open(namespace, _lower_case(check), drop)


def postgres(tmp_dir: Path | str | None = None) -> Backend:
    """PostgresTransport (``tmp_dir`` is not used)."""

    def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return PostgresTransport(url, clock=clock, prefix=prefix)

    return Backend("postgres", factory, CAPABILITIES)


def postgres_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncPostgresTransport (``tmp_dir`` is not used)."""

    async def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return await AsyncPostgresTransport.create(url, clock=clock, prefix=prefix, max_connections=4)

    return Backend("postgres-async", factory, CAPABILITIES, is_async=True)


@removed_at_exit
def drop_opened() -> int:
    """Drop the tables and functions of every prefix this process opened on the server of
    ``HAREL_POSTGRES_URL``; return how many prefixes.  (A throwaway server goes as a whole.)"""
    import psycopg

    return _SERVER.remove_opened(lambda url: psycopg.connect(url, autocommit=True))
