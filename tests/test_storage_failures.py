"""A call the storage failed (SPEC.md R17) in a search: the example ends there, unjudged
(SPEC.md C15).  rqlite under load raised OutcomeUnknownError at a leader election in a lockstep
search, and the certifier counted it as an error the spec never asks for."""

from __future__ import annotations

import itertools

from broken import UnfencedAck
from harel_ref.certify import Profile, certify
from harel_ref.stateful import Capabilities
from harel_ref.stateful._linearize import DRAIN_WORKER
from harel_ref.stateful.parallel import _drain
from harel_ref.transport import InMemoryStore, InMemoryTransport, OutcomeUnknownError, StorageError

PROFILE = Profile("storage-failures", max_examples=30, step_count=20)
LOCKSTEP = ["fifo", "fencing"]


def _losing(base: type, every: int):
    """A factory of ``base`` whose every ``every``-th claim on one storage takes its lease and
    then loses the answer (OutcomeUnknownError): a message leased to nobody.  Counted per
    storage, so that an example replayed loses the same answers."""
    stores: dict[str, InMemoryStore] = {}
    claims: dict[int, itertools.count] = {}

    class Losing(base):
        def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
            lease = super().claim(worker_id, visibility, min_priority, routing_keys)
            if next(claims.setdefault(id(self.store), itertools.count(1))) % every == 0:
                raise OutcomeUnknownError("the answer was lost (a leader change)")
            return lease

    def factory(clock, namespace):
        return Losing(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    return factory


def _certify(factory, profile=PROFILE):
    return certify(factory, Capabilities(durable=True, shared=True), profile=profile, properties=LOCKSTEP)


def test_an_answer_lost_now_and_then_ends_its_example_unjudged_and_the_rest_pass():
    report = _certify(_losing(InMemoryTransport, every=25))
    assert {v.property: v.verdict for v in report.verdicts} == dict.fromkeys(LOCKSTEP, "passed"), report.to_markdown()
    assert any("ended unjudged where the storage failed" in v.reason and "OutcomeUnknownError" in v.reason
               for v in report.verdicts), report.to_markdown()


def test_answers_lost_at_every_claim_leave_the_verdicts_unknown():
    """A transport whose errors of R17 end most examples does not pass: too few were judged."""
    report = _certify(_losing(InMemoryTransport, every=1), Profile("few", max_examples=8, step_count=10))
    assert {v.verdict for v in report.verdicts} == {"unknown"}, report.to_markdown()
    assert all("the storage failed (R17) in" in v.reason for v in report.verdicts), report.to_markdown()


def test_a_bug_beside_answers_lost_now_and_then_is_still_found():
    report = _certify(_losing(UnfencedAck, every=25))
    assert report.verdict("fencing").verdict == "failed", report.to_markdown()


class _DrainLoses(InMemoryTransport):
    """Its second claim loses its answer."""

    claims = 0

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        self.claims += 1
        if self.claims == 2:
            raise OutcomeUnknownError("the answer was lost")
        return super().claim(worker_id, visibility, min_priority, routing_keys)


def test_a_drain_call_the_storage_failed_is_recorded_and_ends_the_drain():
    """The concurrent search's drain records the error of R17 for the history checker (which
    lets the call have acted or not), instead of raising it as a fault of the transport."""
    transport = _DrainLoses(clock=lambda: 1000.0)
    for event in ("a", "b", "c"):
        transport.publish("g", event)
    records = _drain(transport, 30.0, 1000.0, wall=False, limit=3)
    assert [(r.op, r.worker, r.error is not None) for r in records] == [
        ("claim", DRAIN_WORKER, False), ("ack", DRAIN_WORKER, False), ("claim", DRAIN_WORKER, True)]
    assert records[-1].error.startswith("OutcomeUnknownError")


def test_a_refusal_of_the_storage_in_a_drain_is_recorded_as_changing_nothing():
    class Refuses(InMemoryTransport):
        def ack(self, lease):
            raise StorageError("no node took the request")

    transport = Refuses(clock=lambda: 1000.0)
    transport.publish("g", "a")
    records = _drain(transport, 30.0, 1000.0, wall=False, limit=1)
    assert [r.op for r in records] == ["claim", "ack"]
    assert records[-1].error.startswith("StorageError")
