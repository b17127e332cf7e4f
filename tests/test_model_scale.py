"""The model at scale (SPEC.md C13): a claim among thousands of groups finds its answers by
sorting, not by comparing every pair of groups.  Checked against the rule as R4 states it,
pair by pair, on random queues with exact and uncertain stamps."""

import math

from hypothesis import given, settings, strategies as st

from harel_ref.model import QueueModel, When
from harel_ref.model import _queue


def pairwise_outcomes(q: QueueModel, now: When, min_priority=0, routing_keys=None) -> frozenset:
    """R4 as the spec says it: a group's head may be claimed if at some moment of ``now`` it is
    free while every group surely before it (by stamp, ties by arrival) is in flight."""
    keys = None if routing_keys is None else frozenset(routing_keys)
    eligible = [g for g in q._groups.values() if _queue._eligible(g, min_priority, keys)]

    def before(a, b):
        if q.fairness == "unspecified":
            return False
        if a.stamp.hi < b.stamp.lo:
            return True
        return q.ties == "arrival" and a.stamp.hi == b.stamp.lo and a.arrival < b.arrival

    allowed = set()
    for group in eligible:
        ahead_until = min([math.inf, *(_queue._in_flight_until(a) for a in eligible if a is not group and before(a, group))])
        if _queue._may_be_first_free(group, ahead_until, now):
            allowed.add(_queue._head(group))
    if _queue._may_all_be_in_flight(eligible, now):
        allowed.add(None)
    return frozenset(allowed)


moments = st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0])
windows = st.tuples(moments, st.sampled_from([0.0, 0.0, 1.0, 2.0])).map(lambda w: When(w[0], w[0] + w[1]))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 7), st.integers(0, 2), st.sampled_from([None, "a", "b"])),
        st.tuples(st.just("claim"), windows, st.sampled_from([0.5, 1.0, 3.0])),
        st.tuples(st.just("nack"), windows, st.sampled_from([0.0, 1.0, 2.0])),
        st.tuples(st.just("ack"), windows),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    fairness=st.sampled_from(["claim", "ack", "unspecified"]), ties=st.sampled_from(["arrival", "any"]),
    steps=steps, now=windows, min_priority=st.integers(0, 2), routing=st.sampled_from([None, ("a",), ("a", "b")]),
)
def test_a_claims_answers_are_those_of_r4_pair_by_pair(fairness, ties, steps, now, min_priority, routing):
    q = QueueModel(fairness, ties=ties)
    tokens = []
    for step in steps:
        if step[0] == "publish":
            q.publish(f"g{step[1]}", "e", step[2], step[3])
        elif step[0] == "claim":
            outcomes = sorted(q.claim_outcomes(step[1]) - {None}, key=lambda c: c.seq)
            if outcomes:
                tokens.append(f"t{len(tokens)}")
                q.take(outcomes[0], tokens[-1], step[1], step[2])
        elif tokens:
            token = tokens.pop(0)
            q.nack(token, step[2], step[1]) if step[0] == "nack" else q.ack(token, step[1])
    outcomes = q.claim_outcomes(now, min_priority, routing)
    assert outcomes == pairwise_outcomes(q, now, min_priority, routing)
    for group_id in q.contents():  # the one-answer question the checkers ask, alike
        assert q.claimable(group_id, now, min_priority, routing) == (q.head(group_id) in outcomes)
    assert q.may_answer_none(now, min_priority, routing) == (None in outcomes)


def test_the_pairwise_check_catches_a_claim_order_off_by_one_group(monkeypatch):
    """The comparison above can fail: a claim order that counts a group with an equal stamp
    and a later arrival as before it (``bisect_right`` on the wrong key) is caught."""
    q = QueueModel("claim")
    for group in ("g1", "g2"):
        q.publish(group, "e")
    monkeypatch.setattr(_queue.bisect, "bisect_left", _queue.bisect.bisect_right)
    assert q.claim_outcomes(When.at(1.0)) != pairwise_outcomes(q, When.at(1.0))


def test_a_claim_among_ten_thousand_groups_does_not_compare_every_pair():
    """Counted, not timed: a claim looks at each group a few times, not once per other group."""
    q = QueueModel("claim")
    for number in range(10_000):
        q.publish(f"g{number}", "e")
    calls = 0
    real = _queue._in_flight_until

    def counted(group):
        nonlocal calls
        calls += 1
        return real(group)

    _queue._in_flight_until = counted
    try:
        q.claim_outcomes(1.0)
    finally:
        _queue._in_flight_until = real
    assert calls < 3 * 10_000
