"""InMemoryTransport: the queue in a Python dict, for tests and single-process use.

It is an implementation in its own right (it does not call ``model/``), so the lockstep machine
can check it against the model like any other backend.  Several transports may share one
:class:`InMemoryStore`; that is how tests model "a second instance on the same storage" and
"close and reopen".
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from ._base import PARKED, Clock, Lease, check_clock, default_clock
from ._shell import Shell, T

__all__ = ["InMemoryCore", "InMemoryStore", "InMemoryTransport"]


@dataclass
class _Message:
    seq: int
    event: str
    holder: str | None = None  # lease token, PARKED, or None when free
    until: float | None = None  # end of the lease or park


@dataclass
class _Group:
    priority: int
    routing_key: str | None
    last_claimed_at: float = 0.0
    messages: deque[_Message] = field(default_factory=deque)


class InMemoryStore:
    """The storage behind one or more InMemoryTransports: groups in arrival order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[str, _Group] = {}  # insertion order is arrival order
        self.last_seq = 0


class InMemoryCore:
    """The four operations on an :class:`InMemoryStore`, done at once: the storage is in the
    process, so there is nothing to send (:mod:`harel_ref.transport._shell`), and each
    operation returns its answer instead of steps.  The transport calls them holding the
    store's lock."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> None:
        group = self.store.groups.get(group_id)
        if group is None:  # the creating publish fixes priority and routing key (R12)
            group = self.store.groups[group_id] = _Group(priority, routing_key)
        self.store.last_seq += 1
        group.messages.append(_Message(self.store.last_seq, event))

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Lease | None:
        for group_id, group in self._groups_in_claim_order():
            if group.priority < min_priority:
                continue
            if routing_keys is not None and group.routing_key not in routing_keys:
                continue
            head = group.messages[0]
            if self._in_flight(head, now):
                continue
            head.holder, head.until = token, now + visibility
            group.last_claimed_at = now
            return Lease(group_id, head.event, head.seq, token)
        return None

    def ack(self, lease: Lease, now: float) -> bool:
        group, head = self._held_by(lease)
        if head is None:
            return False
        group.messages.popleft()
        if not group.messages:  # a group lives while it has messages (R11)
            del self.store.groups[lease.group_id]
        return True

    def nack(self, lease: Lease, now: float, delay: float) -> bool:
        _, head = self._held_by(lease)
        if head is None:
            return False
        head.holder, head.until = (None, None) if delay == 0 else (PARKED, now + delay)
        return True

    # --- helpers ----------------------------------------------------------------------------

    def _groups_in_claim_order(self) -> list[tuple[str, _Group]]:
        # sorted() is stable, so groups with equal last_claimed_at keep arrival order (R4).
        return sorted(self.store.groups.items(), key=lambda item: item[1].last_claimed_at)

    @staticmethod
    def _in_flight(message: _Message, now: float) -> bool:
        # A lease or park is live while now <= until, inclusive (R3).
        return message.holder is not None and now <= message.until

    def _held_by(self, lease: Lease) -> tuple[_Group | None, _Message | None]:
        """The lease's group and message, if the message is still held under its token (R10)."""
        group = self.store.groups.get(lease.group_id)
        if group is None:
            return None, None
        head = group.messages[0]
        if head.seq != lease.seq or head.holder != lease.token:
            return group, None
        return group, head


class InMemoryTransport(Shell):
    """A thread-safe transport over an :class:`InMemoryStore` (a new one unless given).

    ``Core``: the class of its core, :class:`InMemoryCore` (a test's broken variant swaps in
    its own)."""

    Core: type[InMemoryCore] = InMemoryCore

    def __init__(self, clock: Clock = default_clock, store: InMemoryStore | None = None) -> None:
        self._clock = check_clock(clock)
        self.store = store if store is not None else InMemoryStore()
        self._core = self.Core(self.store)
        self._serial = self.store.lock

    def _drive(self, operation: str, answer: T) -> T:
        return answer  # the core did the work already, under the lock
