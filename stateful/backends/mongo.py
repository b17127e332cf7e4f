"""The MongoDB server the Mongo transports run on, for the checkers.

The server comes from the environment or is started here, as for Postgres
(:mod:`harel_ref.stateful.backends.postgres`):

- ``HAREL_MONGO_URL`` (``mongodb://host:port``): a server of yours.  Each namespace becomes a
  collection prefix there, and the collections this process made are dropped when it ends
  (:func:`drop_opened`).  Nothing else is touched.
- unset: a throwaway mongo-java-server of this process
  (:class:`~harel_ref.testing.servers.MongoServer`, from Maven Central), started on first use and
  stopped at exit.  Each pytest-xdist worker gets its own.

harel's Mongo transports (:mod:`.harel`) open their namespaces here; harel-ref's own Mongo
reference is still to come (issue 20).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harel_ref.testing.servers import MongoServer

from ._server import ServerFromEnv, removed_at_exit

__all__ = ["drop_collections", "drop_opened", "open_namespace", "server_url"]

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


@removed_at_exit
def drop_opened() -> int:
    """Drop the collections of every prefix this process opened on the server of
    ``HAREL_MONGO_URL``; return how many prefixes.  (A throwaway server goes as a whole.)"""
    import pymongo

    return _SERVER.remove_opened(pymongo.MongoClient)
