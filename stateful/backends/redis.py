"""The Redis transports, sync and async, described for the checkers.

The server comes from the environment or is started here, as for Postgres
(:mod:`harel_ref.stateful.backends.postgres`):

- ``HAREL_REDIS_URL`` (``redis://host:port/db``): a server of yours.  Each namespace becomes a
  key prefix there, and the keys this process made are deleted when it exits
  (:func:`delete_opened`).  Nothing else is touched.
- unset: a throwaway ``redis-server`` of this process (no persistence), started on first use
  and deleted at exit.  Each pytest-xdist worker gets its own.

The clock is injectable (``now`` is an argument of every script) and fairness is stamped on
ack (SPEC R5), as upstream.
"""

from __future__ import annotations

from pathlib import Path

from harel_ref.testing.servers import RedisServer
from harel_ref.transport import AsyncRedisTransport, RedisTransport
from harel_ref.transport.redis import key_prefix

from .._backend import Backend, Capabilities
from ._server import ServerFromEnv, removed_at_exit
from ._server import prefix_for as _prefix_for

__all__ = ["CAPABILITIES", "delete_keys", "delete_opened", "open_namespace", "prefix_for", "redis", "redis_async", "server_url"]

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="ack", clock="injectable")

_SERVER = ServerFromEnv("HAREL_REDIS_URL", RedisServer)


def server_url() -> str:
    """``$HAREL_REDIS_URL``, else the URL of the throwaway server of this process (or of the
    process that spawned it), started now if it is not running yet."""
    return _SERVER.url()


def prefix_for(namespace: str) -> str:
    """The key prefix of a namespace: itself when valid, else ``ns_`` and a digest of it."""
    return _prefix_for(namespace, key_prefix)


def delete_keys(client, pattern: str) -> None:
    """Delete the keys matching ``pattern``, 500 at a time."""
    keys = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])


def _delete(client, prefix: str) -> None:
    delete_keys(client, f"{key_prefix(prefix)}:*")


def _opened_prefix(namespace: str) -> tuple[str, str]:
    return _SERVER.open(namespace, key_prefix, _delete)


def open_namespace(namespace: str, check, delete) -> tuple[str, str]:
    """The server's URL and a prefix for ``namespace`` that ``check`` accepts;
    ``delete(client, prefix)`` removes its keys at exit if the server is the user's.  For
    transports of other key layouts on the same server (harel's: :mod:`.harel`)."""
    return _SERVER.open(namespace, check, delete)


def redis(tmp_dir: Path | str | None = None) -> Backend:
    """RedisTransport (``tmp_dir`` is not used)."""

    def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return RedisTransport(url, clock=clock, prefix=prefix)

    return Backend("redis", factory, CAPABILITIES)


def redis_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncRedisTransport (``tmp_dir`` is not used)."""

    async def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return await AsyncRedisTransport.create(url, clock=clock, prefix=prefix)

    return Backend("redis-async", factory, CAPABILITIES, is_async=True)


@removed_at_exit
def delete_opened() -> int:
    """Delete the keys of every prefix this process opened on the server of
    ``HAREL_REDIS_URL``; return how many prefixes.  (A throwaway server goes as a whole.)"""
    import redis as redis_py

    return _SERVER.remove_opened(redis_py.Redis.from_url)
