"""The rqlite transports, sync and async, described for the checkers.

Every namespace becomes a table prefix in one shared cluster, so parallel test workers and
tests never see each other's queues.  The cluster is found in the environment:

- ``HAREL_RQLITE_URLS``: several nodes, comma-separated (e.g. the three of ``compose.yaml``:
  ``http://127.0.0.1:4001,http://127.0.0.1:4011,http://127.0.0.1:4021``).  Each time the
  factory opens a transport it starts from the next node, so the machine's "reopen" and "second
  instance" go through a different node than the one that wrote.
- ``HAREL_RQLITE_URL``: one node, used when ``HAREL_RQLITE_URLS`` is not set
  (default ``http://127.0.0.1:4001``).

The clock is injectable: the transport sends ``clock()`` to rqlite as a parameter, so the
machine's fake clock drives leases exactly.  Tables are left behind in the cluster; call
:func:`drop_opened_tables` when a test is done with them.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path

from harel_ref.transport import AsyncRqliteTransport, RqliteTransport
from harel_ref.transport._sql import Tables

from .._backend import Backend, Capabilities

__all__ = [
    "DEFAULT_URL", "cluster_urls", "drop_opened_tables", "prefix_for", "rotating_opener", "rqlite",
    "rqlite_async",
]

DEFAULT_URL = "http://127.0.0.1:4001"

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="claim", clock="injectable")

_opened: dict[str, Callable[[str], list[str]]] = {}  # prefix -> its tables, for drop_opened_tables()


def cluster_urls() -> list[str]:
    """The node URLs from ``$HAREL_RQLITE_URLS``, else ``[$HAREL_RQLITE_URL or DEFAULT_URL]``."""
    several = os.environ.get("HAREL_RQLITE_URLS", "")
    urls = [url.strip() for url in several.split(",") if url.strip()]
    return urls or [os.environ.get("HAREL_RQLITE_URL") or DEFAULT_URL]


def prefix_for(namespace: str) -> str:
    """The table prefix of a namespace: itself when it is a valid prefix (the machine's
    ``ns_<hex>`` are), else ``ns_`` and a digest of it."""
    try:
        Tables.named(namespace)
        return namespace
    except (TypeError, ValueError):
        return "ns_" + hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def our_tables(prefix: str) -> list[str]:
    """The tables harel-ref's rqlite transport creates under ``prefix``."""
    tables = Tables.named(prefix)
    return [tables.messages, tables.groups, tables.meta]


def rotating_opener(tables: Callable[[str], list[str]] = our_tables):
    """Each call: (prefix, the node URLs starting one node further than last time).  The
    prefix's ``tables`` are remembered, for :func:`drop_opened_tables`."""
    urls = cluster_urls()
    turns = itertools.count()

    def opener(namespace: str) -> tuple[str, list[str]]:
        start = next(turns) % len(urls)
        prefix = prefix_for(namespace)
        _opened[prefix] = tables
        return prefix, urls[start:] + urls[:start]

    return opener


def rqlite(tmp_dir: Path | str | None = None) -> Backend:
    """RqliteTransport on the cluster of the environment (``tmp_dir`` is not used)."""
    opener = rotating_opener()

    def factory(clock, namespace):
        prefix, urls = opener(namespace)
        return RqliteTransport.from_url(urls, clock=clock, prefix=prefix)

    return Backend("rqlite", factory, CAPABILITIES)


def rqlite_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncRqliteTransport on the cluster of the environment (``tmp_dir`` is not used)."""
    opener = rotating_opener()

    async def factory(clock, namespace):
        prefix, urls = opener(namespace)
        return await AsyncRqliteTransport.from_url(urls, clock=clock, prefix=prefix)

    return Backend("rqlite-async", factory, CAPABILITIES, is_async=True)


def drop_opened_tables(timeout: float = 10.0) -> int:
    """Drop the tables of every namespace the factories of this process opened; return how
    many namespaces.  The machine makes a namespace per example: without this they pile up
    in the cluster run after run."""
    import requests

    prefixes = sorted(_opened)
    if not prefixes:
        return 0
    statements = []
    for prefix in prefixes:
        statements += [[f"DROP TABLE IF EXISTS {name}"] for name in _opened[prefix](prefix)]
    with requests.Session() as session:
        for url in cluster_urls():
            try:
                response = session.post(f"{url}/db/execute?transaction", json=statements, timeout=timeout)
            except requests.ConnectionError:
                continue  # a node down (a fault test?): try the next
            if response.ok and "error" not in response.text:
                for prefix in prefixes:
                    _opened.pop(prefix, None)
                return len(prefixes)
    return 0
