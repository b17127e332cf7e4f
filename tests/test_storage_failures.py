"""A call the storage failed (SPEC.md R17) in a search: the example ends there, unjudged
(SPEC.md C15).  rqlite under load raised OutcomeUnknownError at a leader election in a lockstep
search, and the certifier counted it as an error the spec never asks for."""

from __future__ import annotations

import random

from broken import OneCloseClosesEveryInstance, UnfencedAck
from harel_ref.certify import Profile, certify
from harel_ref.stateful import Capabilities
from harel_ref.stateful._linearize import DRAIN_WORKER
from harel_ref.stateful.parallel import _drain
from harel_ref.transport import InMemoryStore, InMemoryTransport, OutcomeUnknownError, StorageError

PROFILE = Profile("storage-failures", max_examples=30, step_count=20)
LOCKSTEP = ["fifo", "fencing"]


def _losing(base: type, every: int):
    """A factory of ``base`` one claim in ``every`` of which takes its lease and then loses the
    answer (OutcomeUnknownError): a message leased to nobody.  Which claims is drawn over the
    run (a fixed seed), as a storage's bad moments come, so that an example replayed meets
    them elsewhere (a period would meet them at the same call of a replay as long as itself)."""
    stores: dict[str, InMemoryStore] = {}
    chance = random.Random(every)

    class Losing(base):
        def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
            lease = super().claim(worker_id, visibility, min_priority, routing_keys)
            if chance.random() < 1 / every:
                raise OutcomeUnknownError("the answer was lost (a leader change)")
            return lease

    def factory(clock, namespace):
        return Losing(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    return factory


def _certify(factory, profile=PROFILE):
    return certify(factory, Capabilities(durable=True, shared=True), profile=profile, properties=LOCKSTEP)


def test_an_answer_lost_now_and_then_ends_its_example_unjudged_and_the_rest_pass():
    report = _certify(_losing(InMemoryTransport, every=40))
    assert {v.property: v.verdict for v in report.verdicts} == dict.fromkeys(LOCKSTEP, "passed"), report.to_markdown()
    assert any("ended unjudged where the storage failed" in v.reason and "OutcomeUnknownError" in v.reason
               for v in report.verdicts), report.to_markdown()


def test_answers_lost_at_every_claim_leave_the_verdicts_unknown():
    """A transport whose errors of R17 end most examples does not pass: too few were judged."""
    report = _certify(_losing(InMemoryTransport, every=1), Profile("few", max_examples=8, step_count=10))
    assert {v.verdict for v in report.verdicts} == {"unknown"}, report.to_markdown()
    assert all("the storage failed (R17) in" in v.reason for v in report.verdicts), report.to_markdown()


def test_a_bug_beside_answers_lost_now_and_then_is_still_found():
    report = _certify(_losing(UnfencedAck, every=40))
    fencing = report.verdict("fencing")
    assert fencing.verdict == "failed" and fencing.failure.kind == "stale-acted", report.to_markdown()


def _factory(cls):
    stores: dict[str, InMemoryStore] = {}
    return lambda clock, namespace: cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))


class RefusesEmptyEvents(InMemoryTransport):
    """publish raises StorageError for an empty event, every time: as a store whose column
    cannot hold what it is given reports the driver's error as the storage's (R17 allows
    that only where the storage failed; on a working one it is the transport's, R19)."""

    def publish(self, group_id, event, priority=0, routing_key=None):
        if event == "":
            raise StorageError("constraint failed: event may not be empty")
        return super().publish(group_id, event, priority, routing_key)


def test_an_error_of_r17_that_repeats_at_the_same_call_fails_the_search():
    """Its examples are set aside; replayed, the first fails at the same call again: the error
    is the transport's, not a storage failing now and then (SPEC.md C15)."""
    report = _certify(_factory(RefusesEmptyEvents))
    failed = [v for v in report.verdicts if v.verdict == "failed"]
    assert failed, report.to_markdown()
    assert all("again at the same call when the example was replayed" in v.failure.answered
               and "StorageError: constraint failed" in v.failure.answered for v in failed), report.to_markdown()
    assert all(v.failure.steps for v in failed), report.to_markdown()


class LosesSomeReleaseAnswers(InMemoryTransport):
    """One ack or nack in twenty acts and then loses its answer (drawn over the run, as in
    :func:`_losing`): stale ones too, which act on nothing (R10), so calling one again is safe."""

    chance = random.Random(20)

    def ack(self, lease):
        return self._lost(super().ack(lease))

    def nack(self, lease, delay=0.0):
        return self._lost(super().nack(lease, delay))

    def _lost(self, answer):
        if self.chance.random() < 1 / 20:
            raise OutcomeUnknownError("the answer was lost (a leader change)")
        return answer


def test_a_stale_release_whose_answer_was_lost_is_made_again_and_judged():
    report = certify(_factory(LosesSomeReleaseAnswers), Capabilities(durable=True, shared=True), profile=PROFILE,
                     properties=["fencing"])
    assert report.verdict("fencing").verdict == "passed", report.to_markdown()


class ClosesOthersWithAStorageError(OneCloseClosesEveryInstance):
    """As its parent, but the other instances say so with a StorageError, as a pool's
    driver does once the pool is closed."""

    def _check_open(self):
        if self._client.closed and not self._closed:
            raise StorageError("connection pool is closed")
        super()._check_open()


def test_another_instance_that_fails_with_an_error_of_r17_after_a_close_fails_close():
    report = certify(_factory(ClosesOthersWithAStorageError), Capabilities(durable=True, shared=True),
                     profile=PROFILE, properties=["close"])
    close = report.verdict("close")
    assert close.verdict == "failed" and close.failure.kind == "closed-another", report.to_markdown()


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


def test_a_run_whose_drain_the_storage_cut_short_is_counted_and_shows_no_loss():
    """What the drain did not claim is unjudged: the run is counted (the concurrent search's
    reason says so), and the messages left show no loss."""
    import collections

    from harel_ref.stateful._properties import DRAIN_CUT
    from harel_ref.stateful.parallel import Claim, Program, Publish, history_failure, run_program

    program = Program(prefix=(Publish("g1", "e1"), Publish("g2", "e2")), branches=((Claim(),), (Claim(),)))
    stores: dict[str, InMemoryStore] = {}

    def factory(clock, namespace):  # the drain's first claim loses its answer
        class DrainLoses(InMemoryTransport):
            def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
                if worker_id == DRAIN_WORKER:
                    raise OutcomeUnknownError("the answer was lost")
                return super().claim(worker_id, visibility, min_priority, routing_keys)
        return DrainLoses(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    run = run_program(factory, program, Capabilities(durable=True, shared=True))
    reached = collections.Counter()
    assert history_failure(run, reached=reached) is None
    assert reached[DRAIN_CUT] == 1


class FailsFirstThenFromSomeCallOn(InMemoryTransport):
    """The first call on the first storage of the search fails (the storage not ready yet),
    later ones answer, and once ``outage`` is set every call fails."""

    first_store: list[InMemoryStore] = []
    outage = False

    def _made(self):
        first = self.first_store and self.first_store[0] is self.store and not getattr(self.store, "called", False)
        self.store.called = True
        if first or self.outage:
            raise StorageError("leader not found")

    def publish(self, group_id, event, priority=0, routing_key=None):
        self._made()
        return super().publish(group_id, event, priority, routing_key)

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        self._made()
        return super().claim(worker_id, visibility, min_priority, routing_keys)


def test_an_outage_at_the_search_s_end_is_not_taken_for_the_transport():
    """The first example, set aside at its first call, would fail there again when replayed
    during the outage that begins at the 15th example and lasts to the end; the last example
    judged whole fails too when it runs again, so nothing is replayed."""
    stores: dict[str, InMemoryStore] = {}
    broken = FailsFirstThenFromSomeCallOn
    broken.first_store.clear()
    broken.outage = False

    def factory(clock, namespace):
        if namespace.startswith("ns_") and namespace not in stores:
            searched = sum(name.startswith("ns_") for name in stores) + 1
            if searched == 1:
                broken.first_store.append(stores.setdefault(namespace, InMemoryStore()))
            broken.outage = broken.outage or searched >= 15
        return broken(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    report = certify(factory, Capabilities(durable=True, shared=True), profile=PROFILE, properties=["fifo"])
    fifo = report.verdict("fifo")
    assert fifo.verdict == "unknown" and "the storage failed (R17) in" in fifo.reason, report.to_markdown()
