"""Deliberately broken variants of InMemoryTransport: each breaks one rule of SPEC.md.

The suite asserts that the lockstep machine (and the certifier) catches every one of them and
names the right property.  ``BROKEN[name] = (transport class, property it breaks)``.
"""

from __future__ import annotations

from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.transport._base import check_claim_args, check_lease
from harel_ref.transport._base import PARKED
from stateful import Backend, Capabilities
from stateful._machine import TICK


class UnfencedAck(InMemoryTransport):
    """The seeds' ``DELETE ... WHERE seq = ?``: any lease of the head deletes it (R10)."""

    def ack(self, lease):
        lease = check_lease(lease)
        with self.store.lock:
            group = self.store.groups.get(lease.group_id)
            if group is None or group.messages[0].seq != lease.seq:
                return False
            group.messages.popleft()
            if not group.messages:
                del self.store.groups[lease.group_id]
            return True


class LeaseOneTickTooLong(InMemoryTransport):
    """A lease stays live one tick past ``claim time + visibility`` (R3)."""

    @staticmethod
    def _in_flight(message, now):
        if message.holder == PARKED:
            return now <= message.until
        return message.holder is not None and now <= message.until + TICK


class LeaseOneTickTooShort(InMemoryTransport):
    """A lease lapses at ``claim time + visibility`` instead of just after it (R3)."""

    @staticmethod
    def _in_flight(message, now):
        if message.holder == PARKED:
            return now <= message.until
        return message.holder is not None and now < message.until


class NackToBack(InMemoryTransport):
    """``nack(0)`` sends the message to the back of its group instead of keeping it at the
    head (R8)."""

    def nack(self, lease, delay=0):
        done = super().nack(lease, delay)
        if done and delay == 0:
            with self.store.lock:
                group = self.store.groups[lease.group_id]
                group.messages.rotate(-1)
        return done


class ParkedClaimableEarly(InMemoryTransport):
    """A parked group can be claimed before its delay has passed (R9)."""

    @staticmethod
    def _in_flight(message, now):
        return message.holder not in (None, PARKED) and now <= message.until


class FairnessIgnored(InMemoryTransport):
    """Groups are tried in arrival order, ignoring ``last_claimed_at`` (R4, R5)."""

    def _groups_in_claim_order(self):
        return list(self.store.groups.items())


class PriorityFloorIgnored(InMemoryTransport):
    """``min_priority`` is accepted but not applied (R4)."""

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        check_claim_args(worker_id, visibility, min_priority, routing_keys)
        return super().claim(worker_id, visibility, 0, routing_keys)


class RoutingIgnored(InMemoryTransport):
    """``routing_keys`` is accepted but not applied (R4)."""

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        check_claim_args(worker_id, visibility, min_priority, routing_keys)
        return super().claim(worker_id, visibility, min_priority, None)


BROKEN = {
    "unfenced ack": (UnfencedAck, "fencing"),
    "lease live one tick too long": (LeaseOneTickTooLong, "lease-expiry"),
    "lease live one tick too short": (LeaseOneTickTooShort, "lease-expiry"),
    "nack(0) to the back of its group": (NackToBack, "fifo"),
    "parked group claimable early": (ParkedClaimableEarly, "parking"),
    "fairness ignored": (FairnessIgnored, "fairness"),
    "priority floor ignored": (PriorityFloorIgnored, "priority-floor"),
    "routing keys ignored": (RoutingIgnored, "routing"),
}


def broken_backend(name: str) -> Backend:
    """A :class:`Backend` for the broken variant ``name``, declared like the real one."""
    cls, _ = BROKEN[name]
    stores: dict[str, InMemoryStore] = {}

    def factory(clock, namespace):
        return cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    return Backend(f"broken-{cls.__name__}", factory, Capabilities(durable=True, shared=True))
