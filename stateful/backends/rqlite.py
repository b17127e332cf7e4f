"""The rqlite transports, sync and async, described for the checkers.

Every namespace becomes a table prefix in one shared cluster, so parallel test workers and
tests never see each other's queues.  The cluster is found in the environment:

- ``HAREL_RQLITE_URLS``: the nodes, comma-separated.  Unset, the three nodes of
  ``compose.yaml`` (``http://127.0.0.1:4001,http://127.0.0.1:4011,http://127.0.0.1:4021``), the
  cluster ``bash .ci/cluster up`` starts.  Each time the factory opens a transport it starts
  from the next node, so the machine's "reopen" and "second instance" go through a different
  node than the one that wrote.
- ``HAREL_RQLITE_URL``: one node, used when ``HAREL_RQLITE_URLS`` is not set.

The clock is injectable: the transport sends ``clock()`` to rqlite as a parameter, so the
machine's fake clock drives leases exactly.  Tables are left behind in the cluster; call
:func:`drop_opened_tables` when a test is done with them.  The factories' ``discard(namespace)``
drops one namespace's tables at once: the certifier calls it after each example of a lockstep
search, so that the cluster's schema stays small (every table, index and trigger a run leaves
makes each later schema change slower, and a search makes one per example).
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path

from harel_ref.transport import AsyncRqliteTransport, RqliteTransport
from harel_ref.transport._sql import Tables

from .._backend import Backend, Capabilities

__all__ = [
    "DEFAULT_URLS", "LANES", "cluster_urls", "discard_namespace", "drop_opened_tables", "prefix_for", "rotating_opener",
    "rqlite", "rqlite_async",
]

DEFAULT_URLS = ("http://127.0.0.1:4001", "http://127.0.0.1:4011", "http://127.0.0.1:4021")
"""The three nodes of compose.yaml, on the loopback interface."""

CAPABILITIES = Capabilities(durable=True, shared=True, fairness="claim", clock="injectable")

LANES = 4
"""Examples of a lockstep search run at once on the cluster (SPEC.md C2a): every call is an
HTTP round trip and every write a Raft commit, so one example keeps the search thread waiting
on its socket and the nodes idle between requests.  On the 2-core reference machine, where the
three nodes' work is what fills the cores, a run at standard took 349 s in four lanes, 461 s
in eight and 1,091 s in one (docs/certify-speed.md)."""

_opened: dict[str, Callable[[str], list[str]]] = {}  # prefix -> its tables, for drop_opened_tables()


def cluster_urls() -> list[str]:
    """The node URLs from ``$HAREL_RQLITE_URLS``, else ``[$HAREL_RQLITE_URL]``, else
    :data:`DEFAULT_URLS`."""
    several = os.environ.get("HAREL_RQLITE_URLS", "")
    urls = [url.strip() for url in several.split(",") if url.strip()]
    if urls:
        return urls
    one = os.environ.get("HAREL_RQLITE_URL", "").strip()
    return [one] if one else list(DEFAULT_URLS)


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

    factory.discard = discard_namespace
    return Backend("rqlite", factory, CAPABILITIES, lanes=LANES)


def rqlite_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncRqliteTransport on the cluster of the environment (``tmp_dir`` is not used)."""
    opener = rotating_opener()

    async def factory(clock, namespace):
        prefix, urls = opener(namespace)
        return await AsyncRqliteTransport.from_url(urls, clock=clock, prefix=prefix)

    factory.discard = discard_namespace
    return Backend("rqlite-async", factory, CAPABILITIES, is_async=True, lanes=LANES)


DROP_BATCH = 100
"""Namespaces dropped per request: a certification opens hundreds, and one request dropping
them all can outlast any timeout (the cluster applies it as one Raft entry)."""


def drop_opened_tables(timeout: float = 10.0) -> int:
    """Drop the tables of every namespace the factories of this process opened; return how
    many namespaces.  The machine makes a namespace per example: without this they pile up
    in the cluster run after run.  They go :data:`DROP_BATCH` namespaces per request; once a
    batch is taken by no node (each given ``timeout`` seconds), the rest are kept, with it,
    for the next call."""
    import httpx

    prefixes, dropped = sorted(_opened), 0
    with httpx.Client(timeout=timeout) as client:
        for start in range(0, len(prefixes), DROP_BATCH):
            batch = _drop(client, prefixes[start:start + DROP_BATCH])
            if not batch:
                break
            dropped += batch
    return dropped


def discard_namespace(namespace: str) -> None:
    """Drop the tables of ``namespace`` if this process opened it (a factory's ``discard``);
    if no node takes the request, they stay remembered for :func:`drop_opened_tables`."""
    global _discarding
    import httpx

    prefix = prefix_for(namespace)
    if prefix in _opened:
        if _discarding is None:  # one client for the process: making one costs about 20 ms
            _discarding = httpx.Client(timeout=10.0)
        _drop(_discarding, [prefix])


_discarding = None


@atexit.register
def _close_discarding() -> None:
    """Close the client of :func:`discard_namespace` (Python warns of an open socket at exit)."""
    if _discarding is not None:
        _discarding.close()


def _drop(client, prefixes: list[str]) -> int:
    """Drop the tables of ``prefixes`` in one request (one Raft entry); forget them once a
    node took it.  How many were dropped: all of them, or none."""
    import httpx

    statements = [[f"DROP TABLE IF EXISTS {name}"] for prefix in prefixes for name in _opened[prefix](prefix)]
    for url in cluster_urls():
        try:
            response = client.post(f"{url}/db/execute?transaction", json=statements)
        except httpx.TransportError:
            continue  # a node down or cut off (a fault test?): try the next
        if response.is_success and "error" not in response.text:
            for prefix in prefixes:
                _opened.pop(prefix, None)
            return len(prefixes)
    return 0
