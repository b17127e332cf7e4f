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

import atexit
import hashlib
from pathlib import Path

from harel_ref.transport import AsyncPostgresTransport, PostgresTransport
from harel_ref.testing.servers import PostgresServer
from harel_ref.transport.postgres import PgNames

from .._backend import Backend, Capabilities
from ._server import ServerFromEnv

__all__ = ["CAPABILITIES", "drop_opened", "postgres", "postgres_async", "prefix_for", "server_url"]

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="ack", clock="injectable")

_SERVER = ServerFromEnv("HAREL_POSTGRES_URL", lambda: PostgresServer())
_opened: set[str] = set()  # the prefixes opened on a server of the user's, for drop_opened()


def server_url() -> str:
    """``$HAREL_POSTGRES_URL``, else the URL of the throwaway server of this process (or of
    the process that spawned it), started now if it is not running yet."""
    return _SERVER.url()


def prefix_for(namespace: str) -> str:
    """The table prefix of a namespace: itself (lower case) when it makes valid Postgres
    names, else ``ns_`` and a digest of it."""
    try:
        PgNames.named(namespace)
        if namespace == namespace.lower():
            return namespace
    except (TypeError, ValueError):
        pass
    return "ns_" + hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _opened_prefix(namespace: str) -> tuple[str, str]:
    url, prefix = server_url(), prefix_for(namespace)
    if _SERVER.records_cleanup():
        _opened.add(prefix)
    return url, prefix


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


def drop_opened() -> int:
    """Drop the tables and functions of every prefix this process opened on the server of
    ``HAREL_POSTGRES_URL``; return how many prefixes.  (A throwaway server goes as a whole.)"""
    if not _opened:
        return 0
    import psycopg

    prefixes = sorted(_opened)
    with psycopg.connect(_SERVER.users(), autocommit=True) as conn:
        for prefix in prefixes:
            names = PgNames.named(prefix)
            with conn.transaction():
                conn.execute(f"DROP TABLE IF EXISTS {names.messages}, {names.groups}, {names.meta}")
                for function in (names.publish, names.claim, names.ack):
                    conn.execute(f"DROP FUNCTION IF EXISTS {function}")
            _opened.discard(prefix)
    return len(prefixes)


@atexit.register
def _drop_at_exit() -> None:
    try:
        drop_opened()
    except Exception:  # a server gone by now: nothing more can be done from here
        pass
