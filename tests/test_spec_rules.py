"""One or more examples per rule of SPEC.md, written against the model (R1-R12, R18) or,
for the rules about calls (R13-R17), against InMemoryTransport; R20 and R21 against the
model, the harel adapter and the report levels."""

import math

import pytest

from harel_ref.transport import InMemoryStore, InMemoryTransport, Lease, TransportClosedError
from harel_ref.model import Claimed, QueueModel, When
from harel_ref.stateful._properties import owner


def claim(q: QueueModel, now, token="t", visibility=10.0, **filters):
    """Claim in the model when exactly one answer is allowed; return it."""
    (outcome,) = q.claim_outcomes(now, **filters)
    if outcome is not None:
        q.take(outcome, token, now, visibility)
    return outcome


def test_r1_groups_are_fifo():
    q = QueueModel()
    for event in ["a", "", "\x00nul", "ü" * 5000]:
        q.publish("g", event)
    got = []
    for i in range(4):
        outcome = claim(q, 1.0, token=f"t{i}")
        got.append(outcome.event)
        assert q.ack(f"t{i}", 1.0)
    assert got == ["a", "", "\x00nul", "ü" * 5000]


def test_r1_seq_increases_across_the_queue():
    q = QueueModel()
    q.publish("g1", "a")
    q.publish("g2", "b")
    q.publish("g1", "c")
    assert claim(q, 1.0, token="t1") == Claimed("g1", 1, "a")
    assert claim(q, 1.0, token="t2") == Claimed("g2", 2, "b")
    q.ack("t1", 1.0)
    assert claim(q, 2.0, token="t3") == Claimed("g1", 3, "c")


def test_r2_a_group_with_a_live_lease_is_not_claimable():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("g", "b")
    assert claim(q, 1.0, token="t1").event == "a"
    assert q.claim_outcomes(2.0) == {None}  # "b" waits: one message per group in flight


def test_r2_other_groups_stay_claimable():
    q = QueueModel()
    q.publish("g1", "a")
    q.publish("g2", "b")
    claim(q, 1.0, token="t1")
    assert claim(q, 1.0, token="t2") == Claimed("g2", 2, "b")


def test_r3_lease_is_live_at_its_exact_end_and_lapses_one_tick_later():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 100.0, visibility=0.5)
    assert q.claim_outcomes(100.5) == {None}
    assert q.claim_outcomes(math.nextafter(100.5, math.inf)) == {Claimed("g", 1, "a")}


def test_r4_priority_floor():
    q = QueueModel()
    q.publish("low", "a", priority=1)
    q.publish("high", "b", priority=3)
    assert q.claim_outcomes(1.0, min_priority=2) == {Claimed("high", 2, "b")}
    assert q.claim_outcomes(1.0, min_priority=4) == {None}


def test_r4_routing_keys_and_groups_without_a_key():
    q = QueueModel()
    q.publish("plain", "a")
    q.publish("blue", "b", routing_key="blue")
    assert q.claim_outcomes(1.0, routing_keys=["blue", "green"]) == {Claimed("blue", 2, "b")}
    assert q.claim_outcomes(1.0, routing_keys=["green"]) == {None}
    assert q.claim_outcomes(1.0) == {Claimed("plain", 1, "a")}  # unfiltered: arrival order


def test_r4_ties_go_by_arrival_order():
    q = QueueModel()
    q.publish("second", "x")  # "second" arrives first
    q.publish("first", "y")
    assert q.claim_outcomes(1.0) == {Claimed("second", 1, "x")}


def test_r5_claim_policy_round_robin():
    q = QueueModel("claim")
    for group in ("g1", "g2"):
        q.publish(group, "1")
        q.publish(group, "2")
    order = []
    for i, now in enumerate([1.0, 2.0, 3.0, 4.0]):
        outcome = claim(q, now, token=f"t{i}")
        order.append(outcome.group_id)
        q.ack(f"t{i}", now)
    assert order == ["g1", "g2", "g1", "g2"]


def test_r5_ack_policy_stamps_on_ack_not_on_claim():
    q = QueueModel("ack")
    q.publish("g1", "1")
    q.publish("g1", "2")
    q.publish("g2", "3")
    claim(q, 1.0, token="t1")  # g1, not stamped: still ahead of g2 by arrival
    q.nack("t1", 0, 1.0)
    assert q.claim_outcomes(2.0) == {Claimed("g1", 1, "1")}
    claim(q, 2.0, token="t2")
    q.ack("t2", 3.0)  # now g1 is stamped 3.0 and yields to g2
    assert q.claim_outcomes(4.0) == {Claimed("g2", 3, "3")}


def test_r5_unspecified_policy_allows_every_claimable_group():
    q = QueueModel("unspecified")
    q.publish("g1", "a")
    q.publish("g2", "b")
    assert q.claim_outcomes(1.0) == {Claimed("g1", 1, "a"), Claimed("g2", 2, "b")}


def test_r6_the_head_comes_back_after_its_lease_lapses():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("g", "b")
    claim(q, 1.0, token="t1", visibility=1.0)
    assert claim(q, 2.5, token="t2") == Claimed("g", 1, "a")


def test_r7_ack_removes_and_frees_the_group():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("g", "b")
    claim(q, 1.0, token="t1")
    assert q.ack("t1", 1.0) is True
    assert q.contents() == {"g": ["b"]}
    assert q.claim_outcomes(1.0) == {Claimed("g", 2, "b")}


def test_r8_nack_now_keeps_the_message_at_the_head():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("g", "b")
    claim(q, 1.0, token="t1")
    assert q.nack("t1", 0, 1.0) is True
    assert q.claim_outcomes(1.0) == {Claimed("g", 1, "a")}


def test_r9_nack_later_parks_the_group_until_the_delay_ends_inclusive():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 1.0, token="t1")
    assert q.nack("t1", 2.0, 1.0) is True
    assert q.claim_outcomes(3.0) == {None}
    assert q.claim_outcomes(3.0 + 2**-10) == {Claimed("g", 1, "a")}
    assert q.ack("t1", 4.0) is False  # no lease acts on a parked message


def test_r10_a_superseded_lease_cannot_ack():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 1.0, token="old", visibility=1.0)
    claim(q, 5.0, token="new")  # the old lease lapsed and the message was re-claimed
    assert q.ack("old", 5.0) is False
    assert q.nack("old", 0, 5.0) is False
    assert q.contents() == {"g": ["a"]}
    assert q.ack("new", 5.0) is True


def test_r10_a_lapsed_lease_nobody_reclaimed_can_still_ack():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 1.0, token="t1", visibility=1.0)
    assert q.ack("t1", 50.0) is True
    assert q.contents() == {}


def test_r10_a_consumed_lease_has_no_effect():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("g", "b")
    claim(q, 1.0, token="t1")
    assert q.ack("t1", 1.0)
    assert q.ack("t1", 1.0) is False  # "b" is now the head; the old lease must not touch it
    assert q.contents() == {"g": ["b"]}


def test_r11_a_group_recreated_after_its_last_ack_starts_afresh():
    q = QueueModel()
    q.publish("g", "a")
    q.publish("h", "b")
    claim(q, 1.0, token="t1")
    q.ack("t1", 1.0)
    q.publish("g", "c")  # new arrival rank, behind "h"; stamp 0 again
    assert q.claim_outcomes(2.0) == {Claimed("h", 2, "b")}
    assert q.group_info("g") == (0, None)


def test_r12_priority_and_routing_key_are_fixed_by_the_creating_publish():
    q = QueueModel()
    q.publish("g", "a", priority=1, routing_key="blue")
    q.publish("g", "b", priority=4, routing_key="green")
    assert q.group_info("g") == (1, "blue")
    assert q.claim_outcomes(1.0, min_priority=2) == {None}


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda t: t.publish("", "e"), ValueError),
        (lambda t: t.publish("g", b"e"), TypeError),
        (lambda t: t.publish("g", "\udc80"), ValueError),
        (lambda t: t.publish("g", "e", priority=5), ValueError),
        (lambda t: t.publish("g", "e", priority=True), TypeError),
        (lambda t: t.claim("w", 0), ValueError),
        (lambda t: t.claim("w", math.inf), ValueError),
        (lambda t: t.claim("w", 1, routing_keys="blue"), TypeError),
        (lambda t: t.claim("w", 1, routing_keys=[]), ValueError),
        (lambda t: t.nack(Lease("g", "e", 1, "x"), -1), ValueError),
        (lambda t: t.ack("not a lease"), TypeError),
    ],
)
def test_r13_bad_input_is_refused_and_nothing_changes(call, error):
    transport = InMemoryTransport(clock=lambda: 1.0)
    transport.publish("g", "kept")
    with pytest.raises(error) as raised:
        call(transport)
    assert str(raised.value)  # the message says what was wrong
    lease = transport.claim("w", 1.0)
    assert (lease.group_id, lease.event) == ("g", "kept")


def test_r14_close_twice_is_harmless_and_calls_after_close_fail():
    transport = InMemoryTransport()
    transport.close()
    transport.close()
    with pytest.raises(TransportClosedError, match="closed"):
        transport.publish("g", "e")
    with pytest.raises(TransportClosedError):
        transport.claim("w", 1.0)


def test_r15_a_reopened_transport_keeps_leases_and_a_shared_store_is_one_queue():
    store = InMemoryStore()
    first = InMemoryTransport(clock=lambda: 1.0, store=store)
    first.publish("g", "a")
    lease = first.claim("w", 10.0)
    second = InMemoryTransport(clock=lambda: 2.0, store=store)
    assert second.claim("w", 10.0) is None  # R2 across instances
    first.close()
    assert second.ack(lease) is True  # the lease outlives the transport that took it


def test_r16_tokens_are_unique_and_seq_is_stable():
    now = [1.0]
    transport = InMemoryTransport(clock=lambda: now[0])
    transport.publish("g", "a")
    transport.publish("g", "b")
    first = transport.claim("w", 1.0)
    now[0] = 5.0
    again = transport.claim("w", 1.0)
    assert first.token != again.token and first.seq == again.seq
    transport.ack(again)
    assert transport.claim("w", 1.0).seq > again.seq


def test_r17_a_claim_whose_answer_was_lost_comes_back_when_its_lease_lapses():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 1.0, token="answer-lost", visibility=2.0)  # nobody will ever ack this token
    assert q.claim_outcomes(3.0) == {None}
    assert claim(q, 3.5, token="t2") == Claimed("g", 1, "a")


def test_r18_uncertain_time_allows_both_answers_at_a_boundary():
    q = QueueModel()
    q.publish("g", "a")
    claim(q, 1.0, token="t1", visibility=1.0)  # live until 2.0
    assert q.claim_outcomes(When(1.5, 2.5)) == {None, Claimed("g", 1, "a")}
    assert q.claim_outcomes(When(1.0, 1.9)) == {None}
    assert q.claim_outcomes(When(2.1, 2.5)) == {Claimed("g", 1, "a")}


def test_r18_fairness_counts_only_when_stamp_windows_do_not_overlap():
    q = QueueModel()
    q.publish("g1", "a")
    q.publish("g2", "b")
    (first,) = q.claim_outcomes(When(1.0, 1.2))
    q.take(first, "t1", When(1.0, 1.2), 0.1)
    q.nack("t1", 0, When(1.3, 1.4))
    (second,) = q.claim_outcomes(When(1.1, 1.3)) - {first}
    q.take(second, "t2", When(1.1, 1.3), 0.1)
    q.nack("t2", 0, When(1.4, 1.5))
    # Both stamps are uncertain and overlap: either group may come next.
    assert q.claim_outcomes(When(2.0, 2.1)) == {Claimed("g1", 1, "a"), Claimed("g2", 2, "b")}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "libsql"])
def test_r10_a_forged_lease_with_the_park_marker_cannot_free_a_parked_message(kind, tmp_path):
    from harel_ref.transport import LibsqlTransport, SqliteTransport
    from harel_ref.transport._base import PARKED

    clock = lambda: 1.0  # noqa: E731
    transport = {
        "memory": lambda: InMemoryTransport(clock=clock),
        "sqlite": lambda: SqliteTransport(str(tmp_path / "q.db"), clock=clock),
        "libsql": lambda: LibsqlTransport(str(tmp_path / "q.db"), clock=clock),
    }[kind]()
    transport.publish("g", "e")
    lease = transport.claim("w", 10.0)
    assert transport.nack(lease, 5.0)
    forged = Lease(lease.group_id, lease.event, lease.seq, PARKED)
    with pytest.raises(ValueError, match="parked"):
        transport.ack(forged)
    with pytest.raises(ValueError, match="parked"):
        transport.nack(forged, 0)
    assert transport.claim("w", 10.0) is None  # still parked until 6.0
    transport.close()


def test_r19_overlapping_calls_need_one_order_that_fits_the_model():
    from harel_ref.stateful import check_linearizable
    from harel_ref.stateful.history import Record

    def lease(token):
        return {"group_id": "g", "event": "a", "seq": 1, "token": token}

    publish = Record("p", "publish", 0, {"group_id": "g", "event": "a"}, complete=1, at=1.0)
    first = Record("w1", "claim", 2, {"worker_id": "w1", "visibility": 5.0}, complete=5, result=lease("t1"), at=1.0)
    nothing = Record("w2", "claim", 3, {"worker_id": "w2", "visibility": 5.0}, complete=6, result=None, at=1.0)
    assert check_linearizable([publish, first, nothing])  # w1 first, then w2 finds "a" leased
    both = Record("w2", "claim", 3, {"worker_id": "w2", "visibility": 5.0}, complete=6, result=lease("t2"), at=1.0)
    refused = check_linearizable([publish, first, both])  # two leases on one head: no order fits
    assert refused.ok is False and owner(refused.kind) == "single-in-flight"


def test_r10a_until_reclaimed_a_lease_acts_after_its_own_nack_until_the_message_is_claimed_again():
    q = QueueModel(acks="until-reclaimed")
    q.publish("g", "a")
    q.publish("g", "b")
    q.take(Claimed("g", 1, "a"), "t1", 1.0, 5.0)
    assert q.nack("t1", 2.0, 2.0) is True  # parked until 4.0
    assert q.acts("t1") and q.nack("t1", 0, 2.5) is True  # the park is the lease's still: freed
    q.take(Claimed("g", 1, "a"), "t2", 3.0, 5.0)  # claimed again: t1 is stale from here
    assert not q.acts("t1") and q.ack("t1", 3.5) is False and q.nack("t1", 0, 3.5) is False
    assert q.nack("t2", 1.0, 4.0) is True and q.ack("t2", 4.5) is True  # parked, then acked by t2
    assert q.contents() == {"g": ["b"]} and q.ack("t2", 4.6) is False  # used up with its message
    fenced = QueueModel()  # R10: the nack ends the lease
    fenced.publish("g", "a")
    fenced.take(Claimed("g", 1, "a"), "t1", 1.0, 5.0)
    assert fenced.nack("t1", 2.0, 2.0) is True and fenced.ack("t1", 2.5) is False


def test_r10a_until_reclaimed_is_judged_in_histories_too():
    from harel_ref.stateful import check_linearizable
    from harel_ref.stateful.history import Record

    def lease(token):
        return {"group_id": "g", "event": "a", "seq": 1, "token": token}

    publish = Record("p", "publish", 0, {"group_id": "g", "event": "a"}, complete=1, at=1.0)
    claim = Record("w1", "claim", 2, {"worker_id": "w1", "visibility": 50.0}, complete=3, result=lease("t1"), at=2.0)
    nack = Record("w1", "nack", 4, {"lease": lease("t1"), "delay": 0}, complete=5, result=True, at=3.0)
    ack = Record("w1", "ack", 6, {"lease": lease("t1")}, complete=7, result=True, at=4.0)
    assert check_linearizable([publish, claim, nack, ack], acks="until-reclaimed").ok
    refused = check_linearizable([publish, claim, nack, ack])  # fenced: the nack ended the lease
    assert refused.ok is False and owner(refused.kind) == "fencing"
    reclaim = Record("w2", "claim", 6, {"worker_id": "w2", "visibility": 50.0}, complete=7, result=lease("t2"), at=4.0)
    stale = Record("w1", "ack", 8, {"lease": lease("t1")}, complete=9, result=True, at=5.0)
    refused = check_linearizable([publish, claim, nack, reclaim, stale], acks="until-reclaimed")
    assert refused.ok is False and owner(refused.kind) == "fencing"  # claimed again: t1 is done


def test_r20_an_ack_by_seq_acts_whoever_holds_the_message_and_the_holder_still_holds_it():
    q = QueueModel(acks="by-seq")
    q.publish("g", "a")
    q.publish("g", "b")
    q.take(Claimed("g", 1, "a"), "t1", 1.0, 1.0)  # w1's lease lapses at 2.0
    q.take(Claimed("g", 1, "a"), "t2", 3.0, 5.0)  # w2 takes "a" over, until 8.0
    assert [h.token for h in q.holdings("g", 4.0)] == ["t2"]
    assert q.ack("t1", 4.0) is True  # w1's stale ack deletes "a" under w2 (fenced: False)
    assert q.contents() == {"g": ["b"]}
    assert [h.token for h in q.holdings("g", 4.0)] == ["t2"]  # w2 still works on "a": no-loss broken
    assert q.claim_outcomes(4.0) == {Claimed("g", 2, "b")}  # and "b" is claimable: single-in-flight broken


def test_r20_a_stale_nack_by_seq_frees_the_message_under_its_holder():
    q = QueueModel(acks="by-seq")
    q.publish("g", "a")
    q.take(Claimed("g", 1, "a"), "t1", 1.0, 1.0)
    q.take(Claimed("g", 1, "a"), "t2", 3.0, 5.0)
    assert q.nack("t1", 0, 4.0) is True
    assert q.claim_outcomes(4.0) == {Claimed("g", 1, "a")}  # a third worker can claim it
    fenced = QueueModel()
    fenced.publish("g", "a")
    fenced.take(Claimed("g", 1, "a"), "t1", 1.0, 1.0)
    fenced.take(Claimed("g", 1, "a"), "t2", 3.0, 5.0)
    assert fenced.nack("t1", 0, 4.0) is False and fenced.claim_outcomes(4.0) == {None}


def test_r20_a_holding_ends_with_its_own_ack_or_nack_or_when_it_lapses():
    q = QueueModel(acks="by-seq")
    q.publish("g", "a")
    q.take(Claimed("g", 1, "a"), "t1", 1.0, 1.0)
    assert [h.token for h in q.holdings("g", 2.0)] == ["t1"]  # live at its exact end (R3)
    assert q.holdings("g", 2.0 + 2.0**-10) == []
    q.nack("t1", 0, 1.5)
    assert q.holdings("g", 1.5) == []


def test_r20_each_event_text_is_one_harel_event_compared_by_equality():
    from harel.spec.states import Event  # the harel extra: pip install 'harel-ref[harel]'

    from harel_ref.stateful._harel import from_event, to_event

    assert to_event("a") == to_event("a") and to_event("a") != to_event("b")
    assert from_event(to_event("ü✓")) == "ü✓"
    assert from_event(Event.model_validate_json(to_event("x").model_dump_json())) == "x"  # through storage
    stranger = Event(kind="harel-ref", data={"text": "x"})  # the right text, another id
    assert from_event(stranger) != "x" and "not an event harel-ref published" in from_event(stranger)


def test_r21_the_contract_level_is_what_harel_promises_and_strict_is_everything():
    from harel_ref.certify import PROPERTIES
    from harel_ref.certify._report import in_level

    contract = {p for p in PROPERTIES if in_level(p, "contract")}
    assert {p for p in PROPERTIES if p not in contract} == {"fencing", "tie-break", "bad-input", "close", "routing"}
    assert all(in_level(p, "strict") for p in PROPERTIES)
    with pytest.raises(ValueError, match="unknown level"):
        in_level("fifo", "lenient")


def test_r21_without_the_tie_break_groups_stamped_at_one_instant_may_go_in_any_order():
    q = QueueModel(ties="any")
    q.publish("g1", "a")
    q.publish("g2", "b")
    assert q.claim_outcomes(1.0) == {Claimed("g1", 1, "a"), Claimed("g2", 2, "b")}  # both never claimed
    q.take(Claimed("g1", 1, "a"), "t1", 1.0, 1.0)
    q.publish("g1", "c")
    q.ack("t1", 1.5)
    assert q.claim_outcomes(1.5) == {Claimed("g2", 2, "b")}  # round-robin still holds: g1 was served
    strict = QueueModel()
    strict.publish("g1", "a")
    strict.publish("g2", "b")
    assert strict.claim_outcomes(1.0) == {Claimed("g1", 1, "a")}  # with R4's tie-break: arrival


@pytest.mark.parametrize("name", ["a closed nack with a delay parks", "a closed claim with keys answers",
                                  "a closed publish by keyword answers", "a closed claim of more than a day answers"])
def test_r14_every_call_after_close_is_tried_whatever_the_search_judges(name):
    """R14 in the close search (which judges neither priorities nor routing keys): each call
    the declared capabilities allow, by position and by keyword, and the longest durations."""
    from broken import broken_backend

    from harel_ref.certify import focus_machine
    from harel_ref.stateful import Divergence

    backend = broken_backend(name)
    state = focus_machine(backend.factory, "close", backend.capabilities)()
    state.begin(group_ids=["g1", "g2"], clock=1000.0)
    state.choose_keys(routing_keys=["blue", "green"])
    with pytest.raises(Divergence, match="after close"):
        state.teardown()
