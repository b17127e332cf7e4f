"""The MongoDB server the Mongo transports run on, for the checkers.

The server comes from the environment or is started here, as for Postgres
(:mod:`harel_ref.stateful.backends.postgres`):

- ``HAREL_MONGO_URL`` (``mongodb://host:port``): a server of yours.  Each namespace becomes a
  collection prefix there, and the collections this process made are dropped when it ends
  (:func:`drop_opened`).  Nothing else is touched.
- unset: a throwaway mongo-java-server of this process
  (:class:`~harel_ref.testing.servers.MongoServer`, from Maven Central), started on first use and
  stopped at exit.  Each pytest-xdist worker gets its own.

harel-ref's Mongo transports (:func:`mongo`, :func:`mongo_async`) and harel's (:mod:`.harel`)
open their namespaces here.  The clock is injectable (``now`` is an argument of every update)
and fairness is stamped on ack (SPEC R5), as upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harel_ref.testing.servers import MongoServer
from harel_ref.transport.mongo import DATABASE, MongoNames

from .._backend import Backend, Capabilities
from ._server import ServerFromEnv, removed_at_exit
from ._server import prefix_for as _prefix_for

__all__ = ["CAPABILITIES", "drop_collections", "drop_opened", "mongo", "mongo_async", "open_namespace", "prefix_for",
           "server_url"]

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="ack", clock="injectable")

_SERVER = ServerFromEnv("HAREL_MONGO_URL", MongoServer)


def server_url() -> str:
    """``$HAREL_MONGO_URL``, else the URL of the throwaway server of this process (or of the
    process that spawned it), started now if it is not running yet."""
    return _SERVER.url()


def open_namespace(namespace: str, check: Callable[[str], Any], drop: Callable[[Any, str], Any]) -> tuple[str, str]:
    """The server's URL and a prefix for ``namespace`` that ``check`` accepts;
    ``drop(client, prefix)`` removes its collections when this process ends, if the server is
    the user's."""
    return _SERVER.open(namespace, check, drop)


def drop_collections(client: Any, database: str, names: list[str]) -> None:
    """Drop the collections ``names`` of ``database`` (those that do not exist are skipped)."""
    for name in names:
        client[database].drop_collection(name)


def prefix_for(namespace: str) -> str:
    """The collection prefix of a namespace: itself when valid, else ``ns_`` and a digest of it."""
    return _prefix_for(namespace, MongoNames.named)


def _drop(client: Any, prefix: str) -> None:
    drop_collections(client, DATABASE, list(MongoNames.named(prefix)))


def _opened_prefix(namespace: str) -> tuple[str, str]:
    return _SERVER.open(namespace, MongoNames.named, _drop)


def discard_namespace(namespace: str, check: Callable[[str], Any] = MongoNames.named) -> None:
    """A factory's ``discard``: drop the collections of ``namespace`` now, if this process
    made them on the user's server (``check`` names them, as for :func:`open_namespace`)."""
    import pymongo

    _SERVER.discard(namespace, check, pymongo.MongoClient)


def mongo(tmp_dir: Path | str | None = None) -> Backend:
    """MongoTransport (``tmp_dir`` is not used)."""
    from harel_ref.transport import MongoTransport

    def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return MongoTransport(url, clock=clock, prefix=prefix)

    factory.discard = discard_namespace
    return Backend("mongo", factory, CAPABILITIES)


def mongo_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncMongoTransport (``tmp_dir`` is not used)."""
    from harel_ref.transport import AsyncMongoTransport

    async def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return await AsyncMongoTransport.create(url, clock=clock, prefix=prefix)

    factory.discard = discard_namespace
    return Backend("mongo-async", factory, CAPABILITIES, is_async=True)


@removed_at_exit
def drop_opened() -> int:
    """Drop the collections of every prefix this process opened on the server of
    ``HAREL_MONGO_URL``; return how many prefixes.  (A throwaway server goes as a whole.)"""
    import pymongo

    return _SERVER.remove_opened(pymongo.MongoClient)
