"""InMemoryTransport, sync and async, described for the checkers."""

from __future__ import annotations

from pathlib import Path

from harel_ref.transport import InMemoryStore, InMemoryTransport

from .._backend import Backend, Capabilities

__all__ = ["AsyncInMemoryTransport", "memory", "memory_async"]

CAPABILITIES = Capabilities(durable=True, shared=True)
"""Durable only in the sense that a store outlives the transports opened on it."""


def _store_for(stores: dict[str, InMemoryStore], namespace: str) -> InMemoryStore:
    return stores.setdefault(namespace, InMemoryStore())


def memory(tmp_dir: Path | None = None) -> Backend:
    stores: dict[str, InMemoryStore] = {}

    def factory(clock, namespace):
        return InMemoryTransport(clock=clock, store=_store_for(stores, namespace))

    return Backend("memory", factory, CAPABILITIES)


class AsyncInMemoryTransport:
    """The in-memory transport behind async methods, to exercise the async adaptor."""

    def __init__(self, clock, store: InMemoryStore) -> None:
        self._sync = InMemoryTransport(clock=clock, store=store)

    async def publish(self, group_id, event, priority=0, routing_key=None):
        return self._sync.publish(group_id, event, priority, routing_key)

    async def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        return self._sync.claim(worker_id, visibility, min_priority, routing_keys)

    async def ack(self, lease):
        return self._sync.ack(lease)

    async def nack(self, lease, delay=0):
        return self._sync.nack(lease, delay)

    async def close(self):
        self._sync.close()


def memory_async(tmp_dir: Path | None = None) -> Backend:
    stores: dict[str, InMemoryStore] = {}

    async def factory(clock, namespace):
        return AsyncInMemoryTransport(clock, _store_for(stores, namespace))

    return Backend("memory-async", factory, CAPABILITIES, is_async=True)
