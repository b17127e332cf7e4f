"""A transport written from harel's documentation alone, as a harel user would write one.

It implements the Protocol of ``harel.engine.transport`` (harel 0.9): events are
``harel.spec.states.Event`` objects, ``ack`` and ``nack`` return None and act on the lease's
``seq``, ``claim`` takes no routing keys, and the factory is harel.testing's ``make(clock)``.
Nothing in it knows about harel-ref.  Certify it from the repository root::

    harel-ref certify examples.harel_protocol:make

The certifier sees harel's Protocol from ``claim`` and reports both conformance levels.  As
harel's docs ask, ``ack`` and ``nack`` act by ``seq`` alone; the certifier shows what a stale
one does (SPEC.md R20).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from harel.engine.transport import Lease
from harel.spec.states import Event

__all__ = ["ListTransport", "make"]

PARKED = "__parked__"


class ListTransport:
    """One FIFO list per group, guarded by a lock; round-robin by when a group was last
    claimed (never claimed first, ties by the order groups appeared)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self._groups: dict[str, dict] = {}  # group_id -> {messages, priority, last_claimed_at}

    def publish(self, group_id: str, event: Event, priority: int = 0) -> None:
        with self._lock:
            self._seq += 1
            group = self._groups.setdefault(group_id, {"messages": [], "priority": priority, "last_claimed_at": 0.0})
            group["messages"].append({"seq": self._seq, "event": event, "locked_by": None, "lock_expiry": 0.0})

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease | None:
        now = self._clock()
        with self._lock:
            ready = [
                (group["last_claimed_at"], group_id) for group_id, group in self._groups.items()
                if group["priority"] >= min_priority and not self._in_flight(group, now)
            ]
            if not ready:
                return None
            _, group_id = min(ready, key=lambda pair: pair[0])  # min() keeps the first of equals
            group = self._groups[group_id]
            head = group["messages"][0]
            head["locked_by"], head["lock_expiry"] = worker_id, now + visibility
            group["last_claimed_at"] = now
            return Lease(head["seq"], group_id, head["event"])

    @staticmethod
    def _in_flight(group: dict, now: float) -> bool:
        head = group["messages"][0]
        return head["locked_by"] is not None and head["lock_expiry"] >= now

    def ack(self, lease: Lease) -> None:
        with self._lock:
            group = self._groups.get(lease.group_id)
            if group is None:
                return
            group["messages"] = [m for m in group["messages"] if m["seq"] != lease.seq]
            if not group["messages"]:
                del self._groups[lease.group_id]

    def nack(self, lease: Lease, delay: float = 0.0) -> None:
        with self._lock:
            for message in self._groups.get(lease.group_id, {"messages": []})["messages"]:
                if message["seq"] == lease.seq:
                    if delay > 0:
                        message["locked_by"], message["lock_expiry"] = PARKED, self._clock() + delay
                    else:
                        message["locked_by"], message["lock_expiry"] = None, 0.0

    def close(self) -> None:
        pass


def make(clock: Callable[[], float]) -> ListTransport:
    """harel.testing's factory: a fresh, empty transport reading ``clock``."""
    return ListTransport(clock)
