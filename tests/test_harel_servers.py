"""harel 0.9.0's Postgres, Redis and Mongo transports, unchanged, certified by ``--bundled harel-*``
on real servers the kit starts itself (SPEC.md R20), or on the user's, where what harel made
is removed at exit.

- each of the six classes opens and round-trips a message; the Postgres ones pass the
  fifo and parking searches, given group ids without NUL, at which they raise ``DataError``;
- harel's Redis transports ignore the ack of a lease that lapsed though nobody claimed again;
- a bug of harel's, as the fencing search shrank it, replayed on the real server: a park keeps
  the lease's token, so the parked lease can still ack its message (Postgres and Mongo);
- the claim that passes over a locked group (``SKIP LOCKED``) is reproduced by hand on the real
  server: the linearizability checker names it ``contention`` (tests/test_linearize.py);
- harel's Postgres publishes commit out of seq order: played by hand between the two
  statements of a publish, the linearizability checker names it ``fifo``;
- on a server of the user's, a certification leaves no table, function or key behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from facts_support import blamed, property_of, replay
from harel_ref.certify import Profile, certify, focus_machine
from harel_ref.certify._target import Target
from harel_ref.stateful import Divergence
from harel_ref.stateful._properties import SHARED
from server_support import close_machine, require_mongo, require_server

pytest.importorskip("harel", reason="the harel extra is not installed: pip install 'harel-ref[harel]'")
pytest.importorskip("psycopg", reason="the postgres extra is not installed: pip install 'harel-ref[postgres]'")
pytest.importorskip("redis", reason="the redis extra is not installed: pip install 'harel-ref[redis]'")
require_server("HAREL_POSTGRES_URL", "initdb", "postgresql")
require_server("HAREL_REDIS_URL", "redis-server", "redis-server")


def target_for(name: str, tmp_path) -> Target:
    if "mongo" in name:
        require_mongo()
    return Target.from_bundled(name, tmp_path)

ROOT = Path(__file__).resolve().parent.parent
SMALL = Profile("small", max_examples=15, step_count=12, programs=3, repeats=3)
SERVERS = ["harel-postgres", "harel-postgres-async", "harel-redis", "harel-redis-async", "harel-mongo",
           "harel-mongo-async"]


@pytest.mark.parametrize("name", SERVERS)
def test_harels_server_transports_open_on_the_kits_servers_as_declared(name, tmp_path):
    """Each class opens, and round-trips a message, through the factory the certifier uses."""
    target = target_for(name, tmp_path)
    assert target.capabilities.acks == "fenced" and target.capabilities.protocol == "harel"
    assert target.capabilities.clock == ("wall" if "redis" in name else "injectable")
    machine = focus_machine(target.factory, "fifo", target.capabilities, is_async=target.is_async)()
    machine.prefill(messages=[("g1", "a", 0, None), ("g1", "b", 0, None), ("g2", "c", 0, None)])
    lease = machine.claim_any(via=0, visibility=5.0, worker="w1")
    machine.ack(lease=lease, via=0)
    machine.teardown()  # drains the rest in order, or raises Divergence


@pytest.mark.parametrize("name", ["harel-postgres", "harel-postgres-async"])
def test_harels_postgres_transports_pass_fifo_and_parking(name, tmp_path):
    """Searched, not only stepped (the injectable clock makes the searches repeatable; harel's
    Redis transports run on the wall clock, where a lease of a few milliseconds may lapse under
    load and the verdict would depend on timing)."""
    target = Target.from_bundled(name, tmp_path, {"group_ids": NO_NUL})
    report = certify(target.factory, profile=SMALL, properties=["fifo", "parking"], _target=target)
    assert {v.property: v.verdict for v in report.verdicts} == {"fifo": "passed", "parking": "passed"}, [
        (v.property, v.reason) for v in report.verdicts]


NO_NUL = "[^\\x00]*"
"""The group ids harel's Postgres transports can store: a ``text`` column holds no NUL
(test_harels_postgres_transports_refuse_a_group_id_with_a_nul_as_no_bad_input_may_be)."""


@pytest.mark.parametrize("name", ["harel-postgres", "harel-postgres-async"])
def test_harels_postgres_transports_refuse_a_group_id_with_a_nul_as_no_bad_input_may_be(name, tmp_path):
    """A group id is any text (R1): harel's Postgres transports raise psycopg's ``DataError``
    at a NUL, where R13 would have a refusal raise ``ValueError`` or ``TypeError``.  SPEC C13's
    NUL family found it; declaring ``group_ids`` without NUL is how a user certifies the rest."""
    target = Target.from_bundled(name, tmp_path)
    machine = focus_machine(target.factory, "fifo", target.capabilities, is_async=target.is_async)()
    try:
        with pytest.raises(Exception, match="PostgreSQL text fields cannot contain NUL") as failed:
            machine.prefill(messages=[("g\x00h", "a", 0, None)])
        assert not isinstance(failed.value, (ValueError, TypeError))  # psycopg's DataError
    finally:
        machine.teardown()  # the failed step already reported: this only closes


@pytest.mark.parametrize("name", ["harel-postgres", "harel-mongo", "harel-redis"])
def test_harels_server_transports_stamp_fairness_with_the_leases_end(name, tmp_path):
    """Item 11: the key a group is served by becomes the lease's end when it is claimed and
    the ack's moment when it is acked.  So g2, claimed for 100 s and let lapse, waits behind g1,
    acked at once, where R5 (fairness "ack", their family) puts g2 first: it was never acked.
    (On Redis the 100 s are 5 s of real time and the advance 6 s, so the ack surely comes before
    g2's lease ends.)"""
    target = target_for(name, tmp_path)
    machine = focus_machine(target.factory, "fairness", target.capabilities, is_async=target.is_async)()
    try:
        machine.prefill(messages=[("g1", "a", 0, None), ("g1", "b", 0, None), ("g2", "c", 0, None)])
        acked = machine.claim_any(via=0, visibility=5.0, worker="w1")
        machine.claim_any(via=0, visibility=100.0, worker="w2")  # g2, let lapse
        machine.ack(lease=acked, via=0)
        machine.advance(seconds=120.0)
        with pytest.raises(Divergence) as failed:
            machine.claim_any(via=0, visibility=5.0, worker="w1")
    finally:
        close_machine(machine)
    assert property_of(failed.value) == "fairness" and "group_id='g1'" in failed.value.answered, failed.value


@pytest.mark.parametrize("name", ["harel-postgres", "harel-postgres-async", "harel-redis", "harel-redis-async",
                                  "harel-mongo"])
def test_harels_postgres_and_redis_break_ties_by_group_id(name, tmp_path):
    """R4: groups never claimed go in arrival order.  Postgres's claim function orders by
    ``COALESCE(lock_expiry, 0), group_id``, and Redis's sorted set orders equal scores by
    member: both by the group's id, so g1 goes before g2 published first.  The tie-break
    search's seed 0 shrank to these two steps on both.  (harel's Mongo keeps arrival order
    here, the control; its tie-break failure is item 11's lease-end stamp.)"""
    target = target_for(name, tmp_path)
    machine = focus_machine(target.factory, "tie-break", target.capabilities, is_async=target.is_async)()
    machine.prefill(messages=[("g2", "", 0, None), ("g1", "", 0, None)])
    if name == "harel-mongo":
        machine.teardown()
        return
    with pytest.raises(Divergence) as failed:
        machine.teardown()  # the drain takes g1 first
    assert "group_id='g1'" in failed.value.answered and "the head of 'g2'" in failed.value.expected
    assert blamed(failed.value, "tie-break") == "tie-break"


@pytest.mark.parametrize("hold", ["lease", "park"])
@pytest.mark.parametrize("name", ["harel-mongo", "harel-mongo-async"])
def test_harels_mongo_hands_out_a_lease_or_park_at_its_exact_end(name, hold, tmp_path):
    """R3, R9: a lease or park is live while now <= its end; harel's Mongo claim takes a group
    whose ``available_at <= now``, so at the exact end: lease-expiry's failure for a lease,
    parking's for a park (a park cut short shows only at its end too)."""
    target = target_for(name, tmp_path)
    machine = focus_machine(target.factory, "lease-expiry", target.capabilities, is_async=target.is_async)()
    try:
        machine.prefill(messages=[("g1", "a", 0, None)])
        lease = machine.claim_any(via=0, visibility=0.25, worker="w1")
        if hold == "park":
            machine.nack_later(delay=0.125, lease=lease, via=0)
        with pytest.raises(Divergence) as failed:
            machine.claim_at_deadline(past=False, via=0, visibility=0.25, which=0, worker="w2")
    finally:
        machine.teardown()
    assert property_of(failed.value) == ("lease-expiry" if hold == "lease" else "parking")
    assert failed.value.expected == "None (nothing claimable)"


@pytest.mark.parametrize("name", ["harel-mongo", "harel-mongo-async"])
def test_harels_mongo_hands_out_a_live_lease_at_a_whole_clock_from_2_to_the_31_on_mongo_java_server(name, tmp_path):
    """Not harel's bug: mongo-java-server 1.47.0 compares two numbers as longs when either is a
    whole number from 2**31 on (``ValueComparator``: ``normalizeNumber`` makes it a Long, and
    the other's ``longValue()`` drops its fraction).  With the clock at 2**40 (SPEC C13's far
    clock), a lease's end of 2**40 + 0.25 is ``$lte`` 2**40 there, so harel's claim takes the
    group its lease still holds: single-in-flight's fact.  At 2**30 the same claim is right.
    MongoDB compares doubles exactly; harel-ref's Mongo transport stores times as the bits of
    their floats (``_moment``)."""
    import pymongo

    from harel_ref.stateful.backends.mongo import _SERVER

    target = target_for(name, tmp_path)
    if _SERVER.users():
        pytest.skip("this is mongo-java-server's comparison: HAREL_MONGO_URL names a server of the user's")
    with pymongo.MongoClient(_SERVER.url()) as client:  # the server harel's transport is opened on
        times = client["harel_ref_probe"][f"t_{uuid.uuid4().hex[:8]}"]
        try:
            found = {}
            for whole in (2**30, 2**31 - 1, 2**31, 2**40):
                times.insert_one({"_id": whole, "t": whole + 0.25})
                found[whole] = times.count_documents({"_id": whole, "t": {"$lte": float(whole)}})
            # is whole + 0.25 <= whole?  Exactly no within the int range; yes (truncated) past it
            assert found == {2**30: 0, 2**31 - 1: 0, 2**31: 1, 2**40: 1}
            assert times.count_documents({"_id": 2**40, "t": {"$lte": 2.0**40 + 0.125}}) == 0  # two fractions
        finally:
            times.drop()
    for clock, diverges in ((2.0**30, False), (2.0**40, True)):
        machine = focus_machine(target.factory, "single-in-flight", target.capabilities, is_async=target.is_async)()
        try:
            machine.clock.now = clock
            machine.prefill(messages=[("g1", "a", 0, None)])
            machine.claim_any(via=0, visibility=0.25, worker="w1")
            if not diverges:
                machine.claim_any(via=0, visibility=0.25, worker="w2")  # None, as the model says
                continue
            with pytest.raises(Divergence) as failed:
                machine.claim_any(via=0, visibility=0.25, worker="w2")
        finally:
            close_machine(machine)
    assert failed.value.expected == "None (nothing claimable)" and "group_id='g1'" in failed.value.answered
    assert property_of(failed.value) == "single-in-flight"


@pytest.mark.parametrize("name", ["harel-mongo", "harel-mongo-async"])
def test_harels_mongo_answers_none_after_the_clock_steps_back_and_that_is_lease_expirys(name, tmp_path):
    """The ack stamps the group claimable from its moment: a step back of a millisecond and
    the freed group is not claimable.  The failure comes after a step back, which
    lease-expiry owns; without the step back the same steps pass, so the step back is the cause
    (and the shrinker, which drops the steps a failure of the same kind does without, keeps it)."""
    target = target_for(name, tmp_path)
    steps = ["state = LeaseExpiryMachine()", "state.prefill(messages=[('g1', '', 0, None), ('g1', '', 0, None)])",
             "leases_0 = state.claim_any(via=0, visibility=0.25, worker='w1')", "state.ack(lease=leases_0, via=0)",
             "state.step_back(seconds=0.0009765625)", "state.claim_any(via=0, visibility=0.25, worker='w1')",
             "state.teardown()"]
    error = replay(steps, target, "lease-expiry")
    assert error is not None and property_of(error) == "no-loss" and error.answered == "None"
    assert blamed(error, "lease-expiry") == "lease-expiry"
    assert replay([step for step in steps if not step.startswith("state.step_back(")], target, "lease-expiry") is None


def _recorded(lease) -> dict:
    """A harel Lease as a history Record holds it."""
    from harel_ref.stateful._harel import from_event

    return {"group_id": lease.group_id, "event": from_event(lease.event), "seq": lease.seq, "token": lease.token}


def test_harels_mongo_stale_ack_deletes_the_message_its_new_holder_works_on():
    """harel's Mongo ack reads the lock (is the token still mine?), then deletes the message by
    seq in a second request.  A claim of the lapsed lease's group between the two is played
    here by hand, so nothing depends on timing: the stale ack deletes the message the new
    holder has just been handed, and when that holder gives it back (nack) it is gone.  The
    linearizability checker names the cause: the history fits only if an ack may act by seq
    (fencing, R10).  Issue 20 saw it in 23 of 100 races of two threads."""
    require_mongo()
    import pymongo
    from harel.engine.transport import MongoTransport

    from harel_ref.stateful import check_linearizable
    from harel_ref.stateful._harel import from_event, to_event
    from harel_ref.stateful._record import Record
    from harel_ref.stateful.backends.mongo import server_url

    now = [100.0]
    client = pymongo.MongoClient(server_url())
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    transport = MongoTransport(client, "harel", lambda: now[0], prefix=prefix)
    try:
        transport.publish("g", to_event("e1"))
        transport.publish("g", to_event("e2"))
        stale = transport.claim("w1", 10.0)  # e1, until 110
        now[0] = 111.0  # it lapsed, and nobody claimed it yet
        owns, handed = transport._owns, []

        def owns_then_another_claims(group_id, token):
            mine = owns(group_id, token)  # True: the token is still w1's
            handed.append(transport.claim("w2", 10.0))  # the lapsed group goes to w2: e1
            return mine

        transport._owns = owns_then_another_claims
        transport.ack(stale)
        transport._owns = owns
        fresh = handed[0]
        assert from_event(fresh.event) == "e1"
        transport.nack(fresh, 0)  # w2 gives e1 back: it should be the head again (R8)
        after = transport.claim("w3", 10.0)
        assert from_event(after.event) == "e2", "e1 came back: the stale ack did not delete it"
    finally:
        client["harel"].drop_collection(f"{prefix}_transport_messages")
        client["harel"].drop_collection(f"{prefix}_transport_locks")
        client["harel"].drop_collection(f"{prefix}_transport_counters")
        transport.close()

    history = [
        Record("p", "publish", 0, {"group_id": "g", "event": "e1"}, 1, None, at=100.0),
        Record("p", "publish", 2, {"group_id": "g", "event": "e2"}, 3, None, at=100.0),
        Record("w1", "claim", 4, {"visibility": 10.0}, 5, _recorded(stale), at=100.0),
        Record("w1", "ack", 6, {"lease": _recorded(stale)}, 9, None, at=111.0),
        Record("w2", "claim", 7, {"visibility": 10.0}, 8, _recorded(fresh), at=111.0),
        Record("w2", "nack", 10, {"lease": _recorded(fresh), "delay": 0}, 11, None, at=111.0),
        Record("w3", "claim", 12, {"visibility": 10.0}, 13, _recorded(after), at=111.0),
    ]
    verdict = check_linearizable(history, fairness="unspecified", acks_answer=False)
    assert not verdict.ok and property_of(verdict) == "fencing", verdict


@pytest.mark.parametrize("events", [("a", "b"), ("a", "b", "a")])
@pytest.mark.parametrize("name", ["harel-redis", "harel-redis-async"])
def test_harels_redis_ignores_the_ack_of_a_lapsed_lease_nobody_replaced(name, events, tmp_path):
    """harel's Redis lease is a lock key with a TTL: once it expired the ack does nothing, and
    the acked message comes out again (R10: a lapsed lease nobody re-claimed still acts).  The
    claim lasts 12.5 ms of real time and the ack comes 50 ms later at the earliest, so the lease
    has surely lapsed; the failure is no-loss, not fifo, also when a later message of the group
    has the same text (harel's Redis gives every lease seq 0, so only the text names a message:
    the quick search's seed 0 found it so, and labelled it fifo)."""
    target = Target.from_bundled(name, tmp_path)
    machine = focus_machine(target.factory, "no-loss", target.capabilities, is_async=target.is_async)()
    machine.prefill(messages=[("g1", event, 0, None) for event in events])
    lease = machine.claim_any(via=0, visibility=0.25, worker="w1")
    machine.advance(seconds=1.0)  # sleeps 4 lease lengths
    machine.ack(lease=lease, via=0)
    with pytest.raises(Divergence) as failed:
        machine.teardown()  # the drain gets 'a' again, then 'b'
    assert property_of(failed.value) == "no-loss" and "'a'" in failed.value.answered, failed.value


@pytest.mark.parametrize("name", ["harel-redis", "harel-redis-async"])
def test_harels_redis_ignores_the_park_of_a_lapsed_lease_nobody_replaced(name, tmp_path):
    """The same cause seen through a nack: ``nack`` first checks that the lock key still holds
    the token, and once its TTL ran out it returns without parking, so the group is claimable
    at once where R9 keeps it parked (R10: the lapsed lease nobody re-claimed still acts).  The
    quick search's seed 0 found it so and named it parking.  The park asked for lasts 5 s of
    real time, so the claim right after it surely falls within it."""
    target = Target.from_bundled(name, tmp_path)
    machine = focus_machine(target.factory, "parking", target.capabilities, is_async=target.is_async)()
    try:
        machine.prefill(messages=[("g1", "a", 0, None)])
        lease = machine.claim_any(via=0, visibility=0.25, worker="w1")
        machine.advance(seconds=1.0)  # sleeps 4 lease lengths
        machine.nack_later(delay=100.0, lease=lease, via=0)
        with pytest.raises(Divergence) as failed:
            machine.claim_any(via=0, visibility=0.25, worker="w2")
    finally:
        close_machine(machine)
    assert property_of(failed.value) == "parking" and "'a'" in failed.value.answered, failed.value


def test_harels_redis_nack_checks_then_frees_the_group_under_its_next_holder():
    """harel's Redis ``nack`` reads the lock (is the token still mine?), then frees the group in
    further requests (``ZADD`` the group due now, ``DEL`` the lock).  Played by hand between
    the two on the real server, as the Mongo ack above: after the read, w1's lease lapses (the
    clock moves past it and its lock key is expired by hand, so nothing depends on timing) and
    w2 claims the group; then w1's nack deletes w2's lock, and w3 is handed the message w2 is
    working on.  The quick search of ``harel-redis-async`` found it in its concurrent search,
    and the linearizability checker names it as that did: single-in-flight (R2), the contract
    property a stale nack acting breaks (item 1)."""
    import redis as redis_py
    from harel.engine.transport import RedisTransport

    from harel_ref.stateful import check_linearizable
    from harel_ref.stateful._harel import from_event, to_event
    from harel_ref.stateful._record import Record
    from harel_ref.stateful.backends.redis import server_url

    client = redis_py.Redis.from_url(server_url())
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    now = [100.0]
    transport = RedisTransport(client, lambda: now[0], prefix=prefix)
    try:
        transport.publish("g", to_event("e1"))
        transport.publish("g", to_event("e2"))
        stale = transport.claim("w1", 30.0)  # until 130
        owns, handed = transport._owns, []

        def owns_then_the_lease_lapses_and_another_claims(group_id, token):
            mine = owns(group_id, token)  # True: w1's lock is there
            now[0] = 160.0
            client.delete(f"{prefix}:lock:{group_id}")  # what the lock key's TTL does at 130
            handed.append(transport.claim("w2", 30.0))
            return mine

        transport._owns = owns_then_the_lease_lapses_and_another_claims
        transport.nack(stale, 0)
        transport._owns = owns
        fresh = handed[0]
        assert fresh is not None and from_event(fresh.event) == "e1"
        third = transport.claim("w3", 30.0)
        assert third is not None and from_event(third.event) == "e1", "the stale nack left w2's lock alone"
    finally:
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()

    history = [
        Record("p", "publish", 0, {"group_id": "g", "event": "e1"}, 1, None, at=100.0),
        Record("p", "publish", 2, {"group_id": "g", "event": "e2"}, 3, None, at=100.0),
        Record("w1", "claim", 4, {"visibility": 30.0}, 5, _recorded(stale), at=100.0),
        Record("w1", "nack", 6, {"lease": _recorded(stale), "delay": 0}, 9, None, at=160.0),
        Record("w2", "claim", 7, {"visibility": 30.0}, 8, _recorded(fresh), at=160.0),
        Record("w3", "claim", 10, {"visibility": 30.0}, 11, _recorded(third), at=160.0),
    ]
    verdict = check_linearizable(history, fairness="unspecified", acks_answer=False)
    assert not verdict.ok and property_of(verdict) == "single-in-flight", verdict


@pytest.mark.parametrize("name", ["harel-redis", "harel-redis-async"])
def test_harels_redis_park_keeps_the_token_so_the_parked_lease_unparks_it(name, tmp_path):
    """Item 8 on Redis: ``nack(lease, delay)`` sets the lock key to the lease's own token for
    the park, so the same lease's ``nack(0)`` afterwards still owns it and frees the parked
    group, where R10 makes the park the end of the lease.  The fencing search's seed 0 found
    it (named fencing: the check that failed, parking, came after a stale nack).  The park
    lasts 5 s of real time, so the claim right after surely falls within it."""
    target = Target.from_bundled(name, tmp_path)
    machine = focus_machine(target.factory, "fencing", target.capabilities, is_async=target.is_async)()
    try:
        machine.prefill(messages=[("g1", "a", 0, None)])
        lease = machine.claim_any(via=0, visibility=5.0, worker="w1")
        machine.nack_later(delay=100.0, lease=lease, via=0)
        machine.nack_now(lease=lease, via=0)  # stale: the park ended the lease
        with pytest.raises(Divergence) as failed:
            machine.claim_any(via=0, visibility=5.0, worker="w2")
    finally:
        close_machine(machine)
    assert property_of(failed.value) == "parking" and "'a'" in failed.value.answered, failed.value
    assert blamed(failed.value, "fencing") == "fencing"


@pytest.mark.parametrize("name", [
    "harel-postgres", "harel-postgres-async", "harel-mongo", "harel-mongo-async", "postgres"])
def test_a_park_that_keeps_its_token_is_caught_as_fencing(name, tmp_path):
    """harel's nack(lease, delay) keeps the lease's token on the group, so after the park the
    same lease still acks the parked message.  The steps the shared search shrank to (quick,
    seed 0, less three reopens that played no part), replayed on the real server: the message
    is gone, and the stale ack that took it counts against fencing.  (harel's Mongo transports
    do the same: the fencing search's seed 0 shrank to these steps there.)"""
    target = target_for(name, tmp_path)
    machine = focus_machine(target.factory, SHARED, target.capabilities, is_async=target.is_async)()
    machine.prefill(messages=[("g1", "", 0, None)])
    lease = machine.claim_any(via=0, visibility=0.25, worker="w1")
    machine.nack_later(delay=0.125, lease=lease, via=0)
    machine.advance_to_deadline(past=True, which=0)
    machine.ack(lease=lease, via=0)  # stale: the park handed the message back
    if name == "postgres":  # the control: harel-ref's transport, fenced, keeps the message
        machine.teardown()
        return
    with pytest.raises(Divergence) as failed:
        machine.teardown()  # the drain finds nothing
    assert failed.value.answered == "None" and "the head of 'g1'" in failed.value.expected
    assert blamed(failed.value, SHARED) == "fencing"


def test_harels_postgres_claim_passes_over_a_group_another_transaction_has_locked():
    """The cause of the ``contention`` failure, by hand on the real server: while a
    transaction holds g's row (as harel's ack function does), a claim answers None although
    g's message is claimable, and finds it once the transaction ends."""
    import psycopg
    from harel.engine.transport import PostgresTransport
    from harel.spec.states import Event

    from harel_ref.stateful.backends.postgres import server_url

    prefix = f"t_{uuid.uuid4().hex[:12]}"
    transport = PostgresTransport(psycopg.connect(server_url()), prefix=prefix)
    try:
        transport.publish("g", Event(id="e1", kind="k", data={}))
        with psycopg.connect(server_url()) as other:
            other.execute(f"SELECT 1 FROM {prefix}_transport_groups WHERE group_id = 'g' FOR UPDATE")
            assert transport.claim("w", 30.0) is None  # passed over, though claimable
        lease = transport.claim("w", 30.0)
        assert lease is not None and lease.group_id == "g"
    finally:
        with psycopg.connect(server_url(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {prefix}_transport_messages, {prefix}_transport_groups")
            conn.execute(f"DROP FUNCTION {prefix}_claim, {prefix}_ack")
        transport.close()


class _PausesAfterInsert:
    """A psycopg connection that runs ``between()`` once, right after the first statement of
    harel's publish (the message's INSERT) and before its second (the group's upsert) and its
    commit: another worker's calls, played by hand in the middle of a publish."""

    def __init__(self, conn, between):
        self._conn, self._between = conn, between

    def cursor(self):
        outer = self

        class Cursor:
            def __enter__(self):
                self._cursor = outer._conn.cursor().__enter__()
                return self

            def __exit__(self, *exc):
                return self._cursor.__exit__(*exc)

            def execute(self, sql, params=()):
                self._cursor.execute(sql, params)
                if "_messages" in sql and sql.startswith("INSERT") and outer._between is not None:
                    between, outer._between = outer._between, None
                    between()

        return Cursor()

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_harels_postgres_publishes_commit_out_of_seq_order_and_that_is_fifos():
    """The cause of the ``fifo`` failure the quick search's concurrent drain found: a publish
    draws its seq (``BIGSERIAL``) with its first statement and commits after its second, so a
    publish that started earlier but committed later puts its message *ahead* of one already
    handed out as the head.  Played by hand: e1's publish has inserted its row, e2's publish runs
    to its end, a claim takes e2 as the head of g, e1's publish commits, and e2's holder nacks
    it; e2 should be the head again (R8), and e1 comes out.  The linearizability checker names
    it fifo (R1, R6)."""
    import psycopg
    from harel.engine.transport import PostgresTransport

    from harel_ref.stateful._harel import from_event, to_event
    from harel_ref.stateful.backends.postgres import server_url

    prefix = f"t_{uuid.uuid4().hex[:12]}"
    other = PostgresTransport(psycopg.connect(server_url()), prefix=prefix, clock=lambda: 100.0)
    handed = []

    def another_publish_and_a_claim():
        other.publish("g", to_event("e2"))
        handed.append(other.claim("w1", 30.0))

    first = PostgresTransport(psycopg.connect(server_url()), prefix=prefix, clock=lambda: 100.0)
    first._conn = _PausesAfterInsert(first._conn, another_publish_and_a_claim)
    try:
        first.publish("g", to_event("e1"))  # its commit comes after e2's publish and w1's claim
        held = handed[0]
        assert from_event(held.event) == "e2"  # e1 was not committed: e2 was the head
        other.nack(held, 0)  # w1 gives e2 back: it is the head again (R8)
        after = other.claim("w2", 30.0)
        assert from_event(after.event) == "e1", "e2 came out again: the publishes kept their order"
    finally:
        first.close()  # before the tables are dropped: an open transaction would hold them
        other.close()
        with psycopg.connect(server_url(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {prefix}_transport_messages, {prefix}_transport_groups")
            conn.execute(f"DROP FUNCTION {prefix}_claim, {prefix}_ack")

    _assert_publishes_out_of_order_are_fifos(held, after)


def _assert_publishes_out_of_order_are_fifos(held, after) -> None:
    """e1's publish began first and ended last; e2's ran within it, then w1 claimed e2, gave it
    back, and w2 claimed e1.  The linearizability checker names it: fifo (R1, R6)."""
    from harel_ref.stateful import check_linearizable
    from harel_ref.stateful._record import Record

    history = [
        Record("p1", "publish", 0, {"group_id": "g", "event": "e1"}, 5, None, at=100.0),
        Record("p2", "publish", 1, {"group_id": "g", "event": "e2"}, 2, None, at=100.0),
        Record("w1", "claim", 3, {"visibility": 30.0}, 4, _recorded(held), at=100.0),
        Record("w1", "nack", 6, {"lease": _recorded(held), "delay": 0}, 7, None, at=100.0),
        Record("w2", "claim", 8, {"visibility": 30.0}, 9, _recorded(after), at=100.0),
    ]
    verdict = check_linearizable(history, fairness="unspecified", acks_answer=False)
    assert not verdict.ok and property_of(verdict) == "fifo", verdict


def test_harels_mongo_publishes_insert_out_of_seq_order_and_that_is_fifos():
    """The same on Mongo: ``publish`` draws its seq from a counter, then inserts the message in
    a second request.  Played by hand between the two, as above."""
    require_mongo()
    import pymongo
    from harel.engine.transport import MongoTransport

    from harel_ref.stateful._harel import from_event, to_event
    from harel_ref.stateful.backends.mongo import server_url

    client = pymongo.MongoClient(server_url())
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    other = MongoTransport(client, "harel", lambda: 100.0, prefix=prefix)
    first = MongoTransport(client, "harel", lambda: 100.0, prefix=prefix)
    draw, handed = first._next_seq, []

    def draw_then_another_publishes_and_claims():
        seq = draw()
        other.publish("g", to_event("e2"))
        handed.append(other.claim("w1", 30.0))
        return seq

    first._next_seq = draw_then_another_publishes_and_claims
    try:
        first.publish("g", to_event("e1"))  # its seq is drawn before e2's, its insert comes after
        held = handed[0]
        assert from_event(held.event) == "e2"
        other.nack(held, 0)
        after = other.claim("w2", 30.0)
        assert from_event(after.event) == "e1", "e2 came out again: the publishes kept their order"
    finally:
        for collection in ("messages", "locks", "counters"):
            client["harel"].drop_collection(f"{prefix}_transport_{collection}")
        client.close()
    _assert_publishes_out_of_order_are_fifos(held, after)


def _left_on_postgres(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' UNION ALL SELECT proname FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        ).fetchall()
    return sorted(row[0] for row in rows)


def _left_on_redis(url: str) -> list[bytes]:
    import redis

    with redis.Redis.from_url(url) as client:
        return sorted(client.scan_iter(match="*"))


def _left_on_mongo(url: str) -> list[str]:
    import pymongo

    with pymongo.MongoClient(url) as client:
        return sorted(f"{database}.{name}" for database in client.list_database_names()
                      if database not in ("admin", "config", "local")
                      for name in client[database].list_collection_names())


CERTIFIED_ON = {
    "postgres": ("postgres", "harel-postgres", "harel-postgres-async"),
    "redis": ("redis", "harel-redis", "harel-redis-async"),
    "mongo": ("mongo", "mongo-async", "harel-mongo", "harel-mongo-async"),
}


@pytest.mark.parametrize("kind", sorted(CERTIFIED_ON))
def test_a_certification_on_the_users_server_leaves_nothing_there(kind, tmp_path):
    """``HAREL_POSTGRES_URL``, ``HAREL_REDIS_URL`` or ``HAREL_MONGO_URL`` name a server of the
    user's: harel's and harel-ref's transports certified there, sync and async, with searches
    in two processes (``--jobs 2``), leave no table, function, key or collection."""
    from harel_ref.testing.servers import MongoServer, PostgresServer, RedisServer

    if kind == "mongo":
        require_mongo()
    server_class = {"postgres": PostgresServer, "redis": RedisServer, "mongo": MongoServer}[kind]
    left = {"postgres": _left_on_postgres, "redis": _left_on_redis, "mongo": _left_on_mongo}[kind]
    with server_class() as server:
        assert left(server.url) == []
        env = {**os.environ, f"HAREL_{kind.upper()}_URL": server.url}
        for name in CERTIFIED_ON[kind]:
            run = subprocess.run(
                [sys.executable, "-m", "harel_ref._cli", "certify", "--bundled", name, "--profile", "quick/10",
                 "--only", "durability", "--only", "priority-floor", "--jobs", "2",
                 # what a failure leaves is what its search made: shrinking it longer (harel's
                 # Redis class fails durability here, 42 s to shrink) only repeats that
                 "--shrink-limit", "1",
                 "--report-dir", str(tmp_path / name), "--quiet"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
            )
            assert run.returncode in (0, 1), run.stdout + run.stderr[-3000:]
            verdicts = json.loads((tmp_path / name / "report.json").read_text())["properties"]
            assert any(verdict["examples"] > 0 for verdict in verdicts)  # queues were made there
            assert left(server.url) == [], name


def test_what_a_search_process_made_on_the_users_server_is_there_until_it_is_removed(monkeypatch):
    """The control for the test above: a namespace opened on the user's server is remembered,
    its tables are there, and ``clean_up`` (what a search process calls as it ends) removes them."""
    from harel_ref.stateful.backends import clean_up, load
    from harel_ref.stateful.backends.postgres import _SERVER
    from harel_ref.stateful._machine import FakeClock
    from harel_ref.testing.servers import PostgresServer

    with PostgresServer() as server:
        monkeypatch.setenv("HAREL_POSTGRES_URL", server.url)
        transport = load("harel-postgres")(None).factory(FakeClock(1000.0), "ns_control")
        transport.close()
        assert "ns_control_transport_messages" in _left_on_postgres(server.url)
        clean_up()
        assert _left_on_postgres(server.url) == [] and not _SERVER.opened


DURABILITY_AS_SHRUNK = """state = SharedMachine()
state.prefill(messages=[('g1', '', 0, None)])
state.open_second_instance()
state.reopen()
leases_0 = state.claim_any(via=0, visibility=0.25, worker='w1')
state.nack_later(delay=0.125, lease=leases_0, via=0)
state.reopen()
state.open_second_instance()
state.reopen()
state.advance(seconds=0.0009765625)
state.claim(min_priority=0, routing_keys=None, via=1, visibility=0.5, worker='w1')
state.publish(event='', group='g1', priority=0, routing_key='green', via=0)
state.bad_input(case='publish with a lone surrogate in the group_id', via=1)
state.open_second_instance()
state.step_back(seconds=4.0)
state.advance(seconds=0.0009765625)
state.advance_to_deadline(past=True, which=0)
state.ack(lease=leases_0, via=0)
leases_1 = state.claim_at_deadline(past=False, via=1, visibility=5.0, which=0, worker='w2')
state.release_stale(release='nack now', via=1, which=1)
state.release_stale(release='nack later', via=0, which=1)
state.teardown()""".splitlines()
"""The shared search's counterexample on harel-postgres (quick, seed 0), blamed on the reopens."""


def test_steps_that_played_no_part_in_a_failure_are_shrunk_away(tmp_path):
    """Shrunk under durability when a failure's kind of exception was its property, the stale
    ack after a park kept three reopens, a refused bad input and a step back, which made it
    durability's.  Without them it fails with the same fact at the same step, and is fencing's:
    a lockstep search now gives each kind of fact one kind of exception, whatever came before
    it (SPEC.md C7), so Hypothesis drops such steps as it shrinks."""
    target = Target.from_bundled("harel-postgres", tmp_path)
    error = replay(DURABILITY_AS_SHRUNK, target, SHARED)
    assert error is not None and blamed(error, SHARED) == "durability"
    steps = [step for step in DURABILITY_AS_SHRUNK
             if not step.startswith(("state.reopen(", "state.bad_input(", "state.step_back("))]
    without = replay(steps, target, SHARED)
    assert without is not None and (without.kind, without.fact.step) == (error.kind, error.fact.step)
    assert blamed(without, SHARED) == "fencing" and type(without) is type(error)


def test_a_mongo_server_whose_port_is_taken_says_so_and_leaves_no_process():
    """Another listener on the port must not pass for the server: the Java main ends when it
    cannot bind (netty's threads would keep the JVM up), and start() waits for its own word.
    A restart keeps the port its clients know, so there it says so (a first start chooses
    another port: tests/test_servers.py)."""
    import socket

    from harel_ref.testing.servers import MongoServer, ServerUnavailable

    require_mongo()
    server = MongoServer()
    try:
        server.stop()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", server.port))
            taken.listen()
            with pytest.raises(ServerUnavailable, match=r"did not listen .* and ended \(exit code 1\)"):
                server.start()
        assert server._process is None  # stopped
    finally:
        server.close()


@pytest.mark.parametrize("name", ["harel-memory", "harel-redis"])
def test_harels_transports_still_publish_after_close(name, tmp_path):
    """docs/harel-0.9.md, item 4: after ``close()`` a call should say the transport is closed
    (R14); harel's in-memory transport keeps its dict, and redis-py reconnects, so the publish
    goes through."""
    from harel_ref.stateful._harel import to_event

    target = Target.from_bundled(name, tmp_path)
    transport = target.factory(lambda: 100.0, f"closed_{uuid.uuid4().hex[:8]}")
    transport.close()
    assert transport.publish("g", to_event("e1")) is None  # no error
    transport.close()
