"""The linearizability checker (SPEC.md R19): exact against a brute-force oracle on small
histories, its diagnoses, calls without answers, and partitioning by group.

Records are written by hand (times are small numbers); ``at`` freezes the transport's clock.
"""

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from harel_ref.transport import InMemoryTransport
from harel_ref.model import QueueModel, When
from harel_ref.stateful import check_linearizable
from harel_ref.stateful.history import Record
from harel_ref.stateful._properties import owner


def lease(group, event, token, seq=1):
    return {"group_id": group, "event": event, "seq": seq, "token": token}


def publish(at, done, group, event, worker="p", clock=0.0):
    return Record(worker, "publish", at, {"group_id": group, "event": event}, complete=done, at=clock)


def claim(at, done, answer, worker="w", visibility=5.0, clock=0.0, error=None):
    return Record(worker, "claim", at, {"worker_id": worker, "visibility": visibility}, complete=done,
                  result=answer, at=clock, error=error)


def ack(at, done, held, answer=True, worker="w", clock=0.0, error=None):
    return Record(worker, "ack", at, {"lease": held}, complete=done, result=answer, at=clock, error=error)


def nack(at, done, held, delay=0.0, answer=True, worker="w", clock=0.0):
    return Record(worker, "nack", at, {"lease": held, "delay": delay}, complete=done, result=answer, at=clock)


# --- diagnoses --------------------------------------------------------------------------------


def test_two_claims_of_one_head_at_once_break_single_in_flight():
    records = [publish(0, 1, "g", "a"), claim(2, 5, lease("g", "a", "t1"), worker="w1"),
               claim(3, 6, lease("g", "a", "t2"), worker="w2")]
    result = check_linearizable(records)
    assert result.ok is False and owner(result.kind) == "single-in-flight" and result.relaxed == "R2"
    assert {r.worker for r in result.culprits} == {"w1", "w2"}  # both claims are marked
    assert "leased by" in result.state


def test_a_stale_ack_racing_a_claim_that_takes_over_breaks_fencing():
    stale = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, stale, visibility=1.0),
               claim(4, 6, lease("g", "a", "t2"), worker="w2", clock=10.0),  # t1 lapsed at 5
               ack(4.5, 7, stale, clock=10.0)]  # answered True: it deleted w2's message
    result = check_linearizable(records)
    assert result.ok is False and owner(result.kind) == "fencing" and result.relaxed == "R10"
    assert result.expected == "False" and result.answered == "True"


def test_one_lease_acked_twice_breaks_fencing():
    held = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, held), ack(4, 6, held, worker="w1"), ack(5, 7, held, worker="w2")]
    result = check_linearizable(records)
    assert result.ok is False and owner(result.kind) == "fencing" and result.relaxed is None


def test_the_claim_that_took_a_message_out_of_order_is_blamed_not_the_claims_that_then_found_none():
    """A nack(0) that sent its message to the back of its group (the broken variant "nack(0)
    to the back of its group") let a branch claim the next message; claims beside it answered
    None, as they should on that transport.  Here the search is stuck at the claim that took a
    message (not-head, fifo)."""
    held = lease("g", "e1", "t0")
    records = [publish(0, 1, "g", "e1"), claim(2, 3, held),
               publish(6, 9, "g", "e2", worker="b1"), nack(7, 11, held, worker="b2"),
               nack(8, 15, held, answer=False, worker="b3"),
               claim(12, 21, None, worker="b2"), claim(14, 17, lease("g", "e2", "t2", seq=2), worker="b0"),
               claim(16, 18, None, worker="b3")]
    result = check_linearizable(records)
    assert result.ok is False and owner(result.kind) == "fifo", result
    assert result.step.startswith("b0: claim"), result.step
    assert "'e1'" in result.expected and "'e2'" in result.answered


def nacked_to_the_back(drained_first: bool):
    """The broken variant "nack(0) to the back of its group" as a certification recorded it: b1
    nacks e1, which the store sends behind e2; b2 claims e2, and b0's claim then answers None
    (right on that store: its group is in flight).  The search gets stuck at b0's None."""
    held = lease("g", "e1", "t0")
    records = [publish(0, 1, "g", "e1", worker="prefix"), claim(2, 3, held, worker="prefix"),
               claim(4, 5, None, worker="prefix"),
               claim(10, 100, lease("g", "e2", "t2", seq=2), worker="b2"),
               publish(11, 12, "g", "e2", worker="b1"), nack(13, 14, held, worker="b1"),
               ack(15, 60, held, answer=False, worker="b0"), claim(61, 62, None, worker="b0")]
    taken = [lease("g", "e2", "t3", seq=2), lease("g", "e1", "t4")] if drained_first else [lease("g", "e2", "t3", seq=2)]
    return check_linearizable(drained(records, taken), fairness="claim")


def test_a_none_beside_a_claim_past_the_head_it_missed_is_fifo_when_the_head_came_out_later():
    """The None missed e1, which the drain handed out afterwards: nothing was lost, and the claim
    that took e2 past it broke the group's order.  Had e1 never come out, the None is a loss."""
    result = nacked_to_the_back(drained_first=True)
    assert owner(result.kind) == "fifo" and result.step.startswith("b2: claim"), result
    assert "'e1'" in result.expected and "'e2'" in result.answered
    lost = nacked_to_the_back(drained_first=False)
    assert owner(lost.kind) == "no-loss", lost


def test_a_none_beside_a_claim_past_its_head_is_fifo_when_a_branch_hands_the_head_out_later():
    """As above, with ``e1`` claimed and acked by a branch, not the drain (a reviewer's
    history): handed out later, by whoever, it was not lost."""
    held, e2, again = lease("g", "e1", "t0"), lease("g", "e2", "t2", seq=2), lease("g", "e1", "t5")
    records = [publish(0, 1, "g", "e1", worker="prefix"), claim(2, 3, held, worker="prefix"),
               claim(4, 5, None, worker="prefix"), claim(10, 100, e2, worker="b2"),
               publish(11, 12, "g", "e2", worker="b1"), nack(13, 14, held, worker="b1"),
               ack(15, 60, held, answer=False, worker="b0"), claim(61, 62, None, worker="b0"),
               ack(101, 102, e2, worker="b2"), claim(103, 104, again, worker="b1"), ack(105, 106, again, worker="b1")]
    for partition in (False, True):
        result = check_linearizable(drained(list(records), []), partition=partition)
        assert owner(result.kind) == "fifo" and result.step.startswith("b2: claim"), result


def drained(records, taken, start=200):
    """``records`` and a final drain that takes and acks ``taken`` in turn, then finds nothing."""
    for number, held in enumerate(taken):
        at = start + 10 * number
        records += [claim(at, at + 1, held, worker="drain"), ack(at + 2, at + 3, held, worker="drain")]
    return records + [claim(start + 100, start + 101, None, worker="drain")]


def test_a_wrong_none_beside_correct_claims_past_its_head_stays_the_none():
    """A fresh reviewer's histories, where a claim took a later message of the group a wrong
    None missed, the missed head came out of the drain, and that claim was right in another
    order: judged again without the None, the rest fits (or shows its own bug), so the None,
    not the claim, is blamed."""
    e1, e2, e3 = lease("g", "e1", "t2"), lease("g", "e2", "t1", seq=2), lease("g", "e3", "t3", seq=3)
    at_once = [publish(0, 10, "g", "e1", worker="p1"), publish(0, 10, "g", "e2", worker="p2"),  # e2 may be first
               claim(11, 12, None, worker="w0"), claim(13, 14, e2, worker="w1"), ack(15, 16, e2, worker="w1")]
    beside_a_publish = at_once[:3] + [publish(11, 14, "g", "e3", worker="p3")] + at_once[3:]  # SKIP LOCKED's case
    for records in (drained(list(at_once), [e1]), drained(beside_a_publish, [e1, e3])):
        result = check_linearizable(records, fairness="claim")
        assert owner(result.kind) in ("no-loss", "contention") and result.step.startswith("w0: claim"), result
    first, second, again = lease("g", "e1", "t1"), lease("g", "e2", "t2", seq=2), lease("g", "e1", "t3", seq=3)
    handed_out = [publish(0, 1, "g", "e1"), publish(1.2, 1.8, "g", "e2"), claim(2, 3, None, worker="w0"),
                  claim(4, 5, first, worker="w1"), ack(6, 7, first, worker="w1"),
                  claim(8, 9, second, worker="w2"), ack(10, 11, second, worker="w2")]
    published_again = check_linearizable(drained(handed_out + [publish(12, 13, "g", "e1")], [again]))
    assert owner(published_again.kind) == "no-loss" and published_again.step.startswith("w0: claim"), published_again
    acked_comes_back = check_linearizable(drained(list(handed_out), [again]))  # the None, and a duplicate
    assert owner(acked_comes_back.kind) == "no-loss", acked_comes_back


def test_a_claim_that_missed_a_free_group_is_blamed_not_a_later_claim_that_had_no_state_yet():
    """A fresh reviewer's two histories, against a rule tried and dropped (blame the first call
    no state the search reached allowed, one that took a message first): the search never gets
    past a claim that answered None while a group was free, so a slower claim, right once an
    ack that comes later is placed, is never offered that state.  The None is what broke."""
    a = lease("g", "A", "t1")
    free_elsewhere = [publish(0, 0.1, "h", "X"), publish(0.2, 0.3, "g", "A"), publish(0.4, 0.5, "g", "B"),
                      claim(2, 3, a, worker="w1"), claim(3.5, 20, lease("g", "B", "t3", seq=2), worker="w3"),
                      claim(3.6, 3.9, None, worker="w2"), ack(4, 5, a, worker="w1")]
    result = check_linearizable(free_elsewhere)
    assert owner(result.kind) == "no-loss" and result.step.startswith("w2: claim"), result
    head_lost = [publish(0, 1, "g", "A"), claim(2, 6, None, worker="w1"), publish(3, 4, "g", "B"),
                 claim(5, 10, lease("g", "B", "t3", seq=2), worker="w3")]  # as a store that dropped A
    result = check_linearizable(head_lost)
    assert owner(result.kind) == "no-loss" and result.step.startswith("w1: claim"), result


def test_a_claim_during_a_park_breaks_parking():
    held = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, held), nack(4, 5, held, delay=3.0),
               claim(6, 7, lease("g", "a", "t2"), clock=1.0)]
    assert owner(check_linearizable(records).kind) == "parking"
    later = records[:3] + [claim(6, 7, lease("g", "a", "t2"), clock=3.0 + 2.0**-10)]
    assert check_linearizable(later).ok


def test_a_park_ended_by_its_own_lease_is_no_cover_for_a_none_in_any_partition():
    """R10a: the lease that parked its message acks it, which frees the group; a claim that then
    answers None while the next message waits is wrong, also when histories are split by group
    (the park's window used to last until its delay, and the None was never judged).  Found
    by review."""
    held = lease("g", "m1", "A")
    records = [publish(0, 0.1, "g", "m1"), publish(0.2, 0.3, "g", "m2"), claim(1, 1.1, held, worker="a"),
               nack(1.2, 1.3, held, delay=100.0, worker="a", clock=1.2), ack(2, 2.1, held, worker="a", clock=2.0),
               claim(3, 3.1, None, worker="b", clock=3.0), claim(4, 4.1, lease("g", "m2", "C", seq=2), worker="c", clock=4.0)]
    for partition in (True, False):
        result = check_linearizable(records, partition=partition, acks="until-reclaimed")
        assert result.ok is False and owner(result.kind) == "no-loss", (partition, result)
    right = records[:5] + [claim(3, 3.1, lease("g", "m2", "B", seq=2), worker="b", clock=3.0)]
    assert check_linearizable(right, partition=True, acks="until-reclaimed").ok


def test_none_while_something_is_claimable_breaks_no_loss():
    result = check_linearizable([publish(0, 1, "g", "a"), claim(2, 3, None)])
    assert owner(result.kind) == "no-loss" and "the head of 'g'" in result.expected


def skipped_while_acking(drained, raced=True):
    """harel 0.9.0's PostgresTransport: g holds a then b; w1's lease on a lapsed, nobody took
    it, and w1 acks it (as it may) while w2's claim runs; the claim passes over g, whose row
    the ack has locked (SKIP LOCKED); the drain then finds b, or not."""
    held = lease("g", "a", "t1")
    w2_claim = (5, 6) if raced else (8, 9)
    records = [publish(0, 1, "g", "a"), publish(1, 2, "g", "b"), claim(2, 3, held, worker="w1", visibility=1.0),
               ack(4, 7, held, worker="w1", clock=10.0), claim(*w2_claim, None, worker="w2", clock=10.0)]
    records.append(claim(10, 11, lease("g", "b", "t3", seq=2) if drained else None, worker="drain", clock=10.0))
    return check_linearizable(records)


def test_none_from_a_claim_that_raced_a_call_on_its_group_breaks_contention_when_nothing_was_lost():
    result = skipped_while_acking(drained=True)
    assert result.ok is False and owner(result.kind) == "contention", result
    assert result.step.startswith("w2: claim") and "the head of 'g'" in result.expected


def test_none_from_a_claim_that_raced_is_no_loss_when_the_drain_does_not_find_the_message():
    assert owner(skipped_while_acking(drained=False).kind) == "no-loss"


def test_none_from_a_claim_that_raced_nothing_is_no_loss():
    assert owner(skipped_while_acking(drained=True, raced=False).kind) == "no-loss"


def test_none_from_a_claim_that_raced_a_call_on_another_group_is_no_loss():
    records = [publish(0, 1, "g", "a"), claim(2, 4, None, worker="w2"), publish(3, 5, "h", "b", worker="w1"),
               claim(6, 7, lease("g", "a", "t1"), worker="drain"), claim(8, 9, lease("h", "b", "t2", seq=2), worker="drain")]
    assert owner(check_linearizable(records).kind) == "no-loss"


def test_a_message_handed_out_again_after_its_ack_breaks_no_loss_not_fifo():
    """harel 0.9.0's RedisTransport ignores the ack of a lease that lapsed (its lock key
    expired) though nobody claimed again, and hands the acked message out once more: the
    group's order is not at fault, the message should be gone."""
    held = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), publish(1, 2, "g", "b"), claim(2, 3, held, visibility=1.0),
               ack(4, 5, held, answer=None, clock=10.0), claim(6, 7, lease("g", "a", "t2"), worker="w2", clock=10.0)]
    result = check_linearizable(records, acks_answer=False)
    assert result.ok is False and owner(result.kind) == "no-loss", result
    assert "the head of 'g' (event 'b')" in result.expected


def test_a_drain_that_finds_a_message_ahead_of_a_head_already_handed_out_breaks_fifo():
    """harel 0.9.0's MongoTransport draws a message's seq, then inserts it: of two publishes at
    once, the one with the lower seq can land after the other was claimed as the head.  The
    drain then hands it out first: nothing is lost, the order is broken."""
    records = [publish(0, 5, "g", "e5", worker="w1"), publish(1, 3, "g", "e6", worker="w2"),
               claim(3.5, 4, lease("g", "e6", "t1", seq=2), worker="w3", visibility=1.0),
               claim(10, 11, lease("g", "e5", "t2", seq=1), worker="drain", clock=10.0),
               ack(12, 13, lease("g", "e5", "t2", seq=1), worker="drain", clock=10.0),
               claim(14, 15, lease("g", "e6", "t3", seq=2), worker="drain", clock=10.0)]
    assert owner(check_linearizable(records).kind) == "fifo"
    assert owner(check_linearizable(records[:4]).kind) == "no-loss"  # e5 never comes out: lost


def test_a_drain_that_finds_an_acked_message_breaks_no_loss():
    held = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, held), ack(4, 5, held),
               claim(6, 7, lease("g", "a", "t2"), worker="drain")]
    assert owner(check_linearizable(records).kind) == "no-loss"


def test_overlapping_calls_may_take_either_order():
    held = lease("g", "a", "t1")
    # The ack overlaps the claim after it: the claim may come first (None: "a" is leased)
    # or after (None: "a" is gone).  Both fit.
    records = [publish(0, 1, "g", "a"), claim(2, 3, held), ack(4, 8, held), claim(5, 6, None, worker="w2")]
    assert check_linearizable(records).ok
    # Concurrent publishes to one group come out in either order.
    both = [publish(0, 3, "g", "a", worker="p1"), publish(1, 4, "g", "b", worker="p2"),
            claim(5, 6, lease("g", "b", "t1")), ack(7, 8, lease("g", "b", "t1")), claim(9, 10, lease("g", "a", "t2"))]
    assert check_linearizable(both).ok
    # ...but not when one surely came first.
    ordered = [publish(0, 1, "g", "a"), publish(2, 3, "g", "b"), claim(5, 6, lease("g", "b", "t1"))]
    assert owner(check_linearizable(ordered).kind) == "fifo"


# --- calls without an answer (SPEC.md R17) ------------------------------------------------------


def test_a_claim_whose_answer_was_lost_may_have_leased_the_head():
    records = [publish(0, 1, "g", "a"), claim(2, 3, None, error="OutcomeUnknownError('timeout')"),
               claim(4, 5, None, worker="w2")]  # "a" may be held by the lost claim
    assert check_linearizable(records).ok


def test_a_claim_refused_with_storage_error_did_nothing():
    records = [publish(0, 1, "g", "a"), claim(2, 3, None, error="StorageError('node down')"),
               claim(4, 5, None, worker="w2")]
    assert owner(check_linearizable(records).kind) == "no-loss"


def test_an_ack_without_answer_may_or_may_not_have_acted():
    held = lease("g", "a", "t1")
    unanswered = Record("w", "ack", 4, {"lease": held}, at=0.0)  # the process died
    gone = [publish(0, 1, "g", "a"), claim(2, 3, held), unanswered, claim(6, 7, None, worker="w2", clock=100)]
    kept = [publish(0, 1, "g", "a"), claim(2, 3, held), unanswered,
            claim(6, 7, lease("g", "a", "t2"), worker="w2", clock=100)]
    assert check_linearizable(gone).ok and check_linearizable(kept).ok


# --- exact: against a brute-force oracle on small histories -------------------------------------


def oracle(records) -> bool:
    """Try every order consistent with real time, with a fresh model each time: slow, simple."""
    calls = [r for r in records if not (r.error or "").startswith("StorageError")]

    def known(r):
        return r.error is None and r.complete is not None

    def ends(r):
        return r.complete if known(r) else math.inf

    def after(model, r):
        now = When.at(r.at) if r.at is not None else When(r.invoke, ends(r))
        args = r.args
        if r.op == "publish":
            nxt = model.copy()
            nxt.publish(args["group_id"], args["event"])
            return [nxt] if not known(r) or r.result is None else []
        if r.op == "claim":
            outcomes = model.claim_outcomes(now)
            found = []
            for outcome in outcomes:
                if known(r) and (outcome is None) != (r.result is None):
                    continue
                if known(r) and outcome is not None and (outcome.group_id, outcome.event) != (
                        r.result["group_id"], r.result["event"]):
                    continue
                nxt = model.copy()
                if outcome is not None:
                    nxt.take(outcome, r.result["token"] if known(r) else "?", now, args["visibility"])
                found.append(nxt)
            return found
        nxt = model.copy()
        acted = nxt.ack(args["lease"]["token"], now) if r.op == "ack" else \
            nxt.nack(args["lease"]["token"], args["delay"], now)
        return [nxt] if not known(r) or acted == r.result else []

    def fits(model, left) -> bool:
        if all(not known(r) for r in left):
            return True
        for r in left:
            if any(ends(o) < r.invoke for o in left if o is not r):
                continue  # another call returned before this one began: it goes first
            rest = [o for o in left if o is not r]
            if any(fits(nxt, rest) for nxt in after(model, r)):
                return True
        return False

    return fits(QueueModel("unspecified"), calls)


@st.composite
def histories(draw):
    """A run of InMemoryTransport, one call at a time, given overlapping intervals afterwards;
    sometimes an answer is changed, sometimes an answer is lost.  The transport's clock is
    frozen per call (``at``), or read from the intervals themselves (a wall clock: ``at`` is
    None and the call happened somewhere in [invoke, complete], SPEC.md R18)."""
    wall = draw(st.booleans())
    clock = [0.0]
    queue = InMemoryTransport(clock=lambda: clock[0])
    records, leases, events = [], [], iter("abcdefgh")
    for number in range(draw(st.integers(2, 6))):
        clock[0] += draw(st.sampled_from([0.0, 0.0, 3.0]))  # visibility 2: leases may lapse
        kind = draw(st.sampled_from(["publish", "claim", "claim", "ack", "nack"] if leases else ["publish", "claim"]))
        invoke = number * 2 + draw(st.sampled_from([0.0, 0.5]))
        done = invoke + draw(st.sampled_from([0.5, 1.5, 2.5, 4.5]))
        if wall:
            clock[0] = invoke + 0.25
        if kind == "publish":
            args, answer = {"group_id": draw(st.sampled_from(["g", "h"])), "event": next(events)}, None
            queue.publish(args["group_id"], args["event"])
        elif kind == "claim":
            args = {"worker_id": "w", "visibility": 2.0}
            held = queue.claim("w", 2.0)
            answer = None if held is None else lease(held.group_id, held.event, held.token, held.seq)
            if held is not None:
                leases.append(held)
        else:
            held = draw(st.sampled_from(leases))
            args = {"lease": lease(held.group_id, held.event, held.token, held.seq)}
            if kind == "nack":
                args["delay"] = draw(st.sampled_from([0.0, 1.0]))
                answer = queue.nack(held, args["delay"])
            else:
                answer = queue.ack(held)
        records.append(Record(f"w{number % 3}", kind, invoke, args, complete=done, result=answer,
                              at=None if wall else clock[0]))
    tamper = draw(st.sampled_from(["none", "none", "answer", "lost", "raised"]))
    victim = records[draw(st.integers(0, len(records) - 1))]
    if tamper == "answer":
        if victim.op in ("ack", "nack"):
            victim.result = not victim.result
        elif victim.op == "claim":
            victim.result = None if victim.result is not None else lease("g", "a", "forged")
    elif tamper == "lost":
        victim.complete, victim.result, victim.error = None, None, None
    elif tamper == "raised":  # it may have happened, even after the error came back (R17)
        victim.result, victim.error = None, "OutcomeUnknownError('timeout')"
    return records


@settings(max_examples=400, deadline=None)
@given(histories())
def test_the_checker_agrees_with_the_brute_force_oracle(records):
    assert check_linearizable(records).ok is oracle(records)


@settings(max_examples=150, deadline=None)
@given(histories(), st.randoms())
def test_the_order_of_the_records_does_not_matter(records, rng):
    shuffled = list(records)
    rng.shuffle(shuffled)
    assert check_linearizable(shuffled).ok is check_linearizable(records).ok


@settings(max_examples=300, deadline=None)
@given(histories())
def test_partitioning_by_group_agrees_where_it_is_exact(records):
    """Partitioned is never stricter; without claims that answered None or whose answer was
    lost, it is exactly as strict (module docstring of stateful._linearize)."""
    whole, parts = check_linearizable(records).ok, check_linearizable(records, partition=True).ok
    if whole:
        assert parts
    floating = [r for r in records if r.op == "claim" and (r.result is None or not r.ok)]
    if not floating:
        assert parts is whole


def test_partitioning_needs_fairness_left_out():
    import pytest

    with pytest.raises(ValueError, match="fairness"):
        check_linearizable([], fairness="claim", partition=True)


def test_a_long_correct_history_is_linearizable_partitioned():
    """Thousands of calls from threads on a real transport, with wall-clock windows."""
    import threading
    import time

    from harel_ref.stateful.history import History, RecordingTransport

    queue = InMemoryTransport()
    history = History()

    def work(name):
        rng = random.Random(name)
        worker = RecordingTransport(queue, history, name)
        for n in range(500):
            if rng.random() < 0.4:
                worker.publish(f"g{rng.randrange(6)}", f"{name}-{n}")
            elif (held := worker.claim(name, 0.01)) is not None:
                time.sleep(rng.choice([0, 0, 0.012]))  # sometimes past the lease's end
                worker.ack(held) if rng.random() < 0.7 else worker.nack(held, rng.choice([0, 0.005]))

    threads = [threading.Thread(target=work, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.05)
    drain = RecordingTransport(queue, history, "drain")
    while (held := drain.claim("drain", 60.0)) is not None:
        drain.ack(held)
    result = check_linearizable(history.records, partition=True)
    assert result.ok, result
    assert result.calls == len(history.records) >= 2000


def test_leaving_out_a_rule_known_broken_still_finds_what_else_breaks():
    """Two claims take one head (R2) and a superseded lease acks (R10): once single-in-flight
    is known broken, the checker without R2 still names fencing."""
    stale = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, stale, visibility=1.0),
               claim(4, 6, lease("g", "a", "t2"), worker="w2", clock=10.0),
               claim(4, 6, lease("g", "a", "t3"), worker="w3", clock=10.0),
               ack(7, 8, stale, clock=10.0)]
    assert owner(check_linearizable(records).kind) == "single-in-flight"
    without_r2 = check_linearizable(records, relax=["R2"])
    assert owner(without_r2.kind) == "fencing" and without_r2.relaxed == "R10"
    assert check_linearizable(records, relax=["R2", "R10"]).ok


def test_a_claim_without_answer_is_not_blamed_when_one_with_an_answer_broke_the_rule():
    held = lease("g", "a", "t1")
    records = [publish(0, 1, "g", "a"), claim(2, 3, held),
               claim(4, 9, None, worker="wx", error="OutcomeUnknownError('timeout')"),
               claim(5, 6, lease("g", "a", "t2"), worker="w2")]  # took the head t1 holds
    result = check_linearizable(records)
    assert owner(result.kind) == "single-in-flight"
    assert [r.worker for r in result.culprits][0] == "w2", result


@settings(max_examples=300, deadline=None)
@given(histories())
def test_leaving_rules_out_only_ever_allows_more(records):
    """What fits the model fits it without R2, without R10, and without both (model.RELAXABLE)."""
    if check_linearizable(records).ok:
        for relax in (["R2"], ["R10"], ["R2", "R10"]):
            assert check_linearizable(records, relax=relax).ok, relax


def test_a_group_with_raised_calls_left_undecided_does_not_hide_a_failure_in_another():
    """``uncertain_steps`` (what the soak gives, SPEC.md R19): a group whose calls raised may take
    only that many steps (their possible orders multiply); undecided there, the checker still
    judges the other groups, and a failure in one of them is the answer."""
    held = lease("u", "a", "t1")
    uncertain = [publish(0, 1, "u", "a"), claim(2, 3, held), ack(4, 5, held, answer=None, error="TimeoutError"),
                 publish(6, 7, "u", "b"), claim(8, 9, lease("u", "b", "t2"), worker="w2")]
    broken = [publish(0, 1, "v", "c"), claim(2, 5, lease("v", "c", "t3"), worker="w3"),
              claim(3, 6, lease("v", "c", "t4"), worker="w4")]
    alone = check_linearizable(uncertain, partition=True, uncertain_steps=1)
    assert alone.ok is None  # too few steps for the group whose ack raised: undecided, not passed
    assert check_linearizable(uncertain, partition=True).ok is True  # decided with the default steps
    result = check_linearizable(uncertain + broken, partition=True, uncertain_steps=1)
    assert result.ok is False and owner(result.kind) == "single-in-flight", result
    assert check_linearizable(broken + uncertain, partition=True, uncertain_steps=1).ok is False
