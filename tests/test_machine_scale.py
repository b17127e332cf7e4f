"""The lockstep machine at scale (SPEC.md C13): its backlog and claim_many steps reach the sizes
its evidence counts, and the checks that scale changed (seqs, the failure message) still fail."""

import pytest

from harel_ref.stateful import Backend, Capabilities, Divergence, make_machine
from harel_ref.stateful import _facts as facts
from harel_ref.stateful._machine import ANEW_THEN, SHOWN_GROUPS
import collections
import contextlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from harel_ref.stateful._properties import (
    ANEW_BY_FLOOR, ANEW_BY_KEY, GROUPS_AT_A_CLAIM, LONG_GROUP, MANY_GROUPS, MANY_NACKS, MANY_WORKERS, MESSAGES_IN_A_GROUP, NACKS_OF_A_MESSAGE,
    WORKERS_IN_AN_EXAMPLE, tally,
)
from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.transport.memory import InMemoryCore

from broken import GroupSettingsKeptByEachInstance


def machine(cls=InMemoryTransport):
    stores = {}
    backend = Backend(f"memory-{cls.__name__}", lambda clock, namespace: cls(
        clock=clock, store=stores.setdefault(namespace, InMemoryStore())), Capabilities(durable=True, shared=True))
    state = make_machine(backend)()
    state.begin(group_ids=["g1", "g2"], clock=1000.0)
    state.choose_keys(routing_keys=["blue", "green"])
    return state


def test_backlogs_and_claims_in_a_row_reach_the_sizes_the_evidence_counts():
    state = machine()
    state.backlog(shape=(128, 1), events="numbered", priority=0, routing_key=None, via=0)
    state.backlog(shape=(1, 128), events="equal", priority=0, routing_key=None, via=0)
    held = state.claim_many(count=16, then="hold", visibility=5, via=0)
    assert len(held.values) == 16
    state.claim_many(count=128, then="nack now", visibility=5, via=0)
    assert state.reached[MANY_GROUPS] and state.reached[MANY_WORKERS] and state.reached[LONG_GROUP]
    state.teardown()

    state = machine()
    state.backlog(shape=(1, 4), events="numbered", priority=0, routing_key=None, via=0)
    state.claim_many(count=16, then="nack now", visibility=5, via=0)  # one group: its head nacked 16 times
    assert state.reached[MANY_NACKS] == 16 - 7 and not state.reached[MANY_GROUPS]
    state.teardown()


def test_the_machine_keeps_the_largest_sizes_it_reached():
    """SPEC.md C13: beside the counts of situations, the largest of each size; a tally of two
    examples adds the counts and keeps the larger size."""
    state = machine()
    state.backlog(shape=(3, 2), events="numbered", priority=0, routing_key=None, via=0)
    state.claim_many(count=4, then="nack now", visibility=5, via=0)
    small = dict(state.reached)
    state.teardown()
    assert small[GROUPS_AT_A_CLAIM] == 3 and small[MESSAGES_IN_A_GROUP] == 2, small
    # four claims among three groups, each nacked at once: the first group's head twice
    assert small[WORKERS_IN_AN_EXAMPLE] == 4 and small[NACKS_OF_A_MESSAGE] == 2, small

    state = machine()
    state.backlog(shape=(1, 128), events="equal", priority=0, routing_key=None, via=0)
    state.claim_many(count=16, then="nack now", visibility=5, via=0)
    large = dict(state.reached)
    state.teardown()
    assert large[GROUPS_AT_A_CLAIM] == 1 and large[MESSAGES_IN_A_GROUP] == 128, large
    assert large[NACKS_OF_A_MESSAGE] == 16 and large[MANY_NACKS] == 16 - 7, large

    both = collections.Counter()
    tally(both, small)
    tally(both, large)
    assert both[GROUPS_AT_A_CLAIM] == 3 and both[MESSAGES_IN_A_GROUP] == 128 and both[NACKS_OF_A_MESSAGE] == 16
    assert both[MANY_NACKS] == small.get(MANY_NACKS, 0) + large[MANY_NACKS]  # counts add up


class SeqsDecrease(InMemoryTransport):
    """Each message published gets a smaller seq than the one before (R16)."""

    class Core(InMemoryCore):
        def publish(self, group_id, event, priority, routing_key):
            super().publish(group_id, event, priority, routing_key)
            self.store.groups[group_id].messages[-1].seq = 10**6 - self.store.last_seq


class SeqChangesAtNack(InMemoryTransport):
    """A nacked message gets a new seq (R16)."""

    class Core(InMemoryCore):
        def nack(self, lease, now, delay):
            group, head = self._held_by(lease)
            nacked = super().nack(lease, now, delay)
            if head is not None:
                head.seq += 1000
            return nacked


class FirstSeqIsNone(InMemoryTransport):
    """The first lease it hands out carries no seq; the message's next lease has one (R16)."""

    class Core(InMemoryCore):
        def claim(self, token, now, visibility, min_priority, routing_keys):
            lease = super().claim(token, now, visibility, min_priority, routing_keys)
            if lease is not None and not getattr(self.store, "handed_out", False):
                self.store.handed_out = True
                return lease._replace(seq=None) if hasattr(lease, "_replace") else type(lease)(
                    lease.group_id, lease.event, None, lease.token)
            return lease


def test_a_seq_of_none_that_becomes_a_number_is_a_seq_changed():
    state = machine(FirstSeqIsNone)
    state.backlog(shape=(1, 4), events="numbered", priority=0, routing_key=None, via=0)
    state.claim_many(count=1, then="hold", visibility=5, via=0)
    state.advance(seconds=10)
    with pytest.raises(Divergence) as caught:
        state.claim_any(worker="w1", visibility=5, via=0)
    assert caught.value.kind == facts.SEQ_CHANGED, str(caught.value)


@pytest.mark.parametrize("cls, kind", [(SeqsDecrease, facts.SEQ_ORDER), (SeqChangesAtNack, facts.SEQ_CHANGED)])
def test_seqs_that_break_r16_in_a_long_group_are_caught(cls, kind):
    state = machine(cls)
    state.backlog(shape=(1, 128), events="numbered", priority=0, routing_key=None, via=0)
    with pytest.raises(Divergence) as caught:
        state.claim_many(count=4, then="nack now" if kind == facts.SEQ_CHANGED else "ack", visibility=5, via=0)
    assert caught.value.kind == kind, str(caught.value)


def test_a_failure_among_a_backlog_shows_a_bounded_queue():
    class ForgetsAfter100(InMemoryTransport):
        class Core(InMemoryCore):
            def publish(self, group_id, event, priority, routing_key):
                if len(self.store.groups) < 100 or group_id in self.store.groups:
                    super().publish(group_id, event, priority, routing_key)

    state = machine(ForgetsAfter100)
    state.backlog(shape=(128, 1), events="numbered", priority=0, routing_key=None, via=0)
    with pytest.raises(Divergence) as caught:
        state.teardown()
    message = str(caught.value)  # a claim of the drain found none of the groups it forgot
    shown = [line for line in message.splitlines() if line.startswith("    'g1+")]
    assert len(shown) == SHOWN_GROUPS and "    ... and 4 more groups" in message, message  # 100 drained, 28 left


def test_a_long_event_in_an_answer_is_cut_in_the_failure_message():
    """A transport that answers a 4,096-byte event where the model allows another: the message
    gives its first 8 characters and its length, not 4 KiB of it."""
    from harel_ref.stateful._machine import cut_runs

    assert cut_runs(repr(("9" * 4096, "\x00" * 40, "ab" * 40, 10**40))) == (
        "('99999999...(4096 chars)', '\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00...(40 chars)', "
        f"'{'ab' * 40}', {10**40})")


_ONE_PATTERN = re.compile(r"(?<=['\"])(\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}|\\.|.)\1{31,}", re.DOTALL)
"""cut_runs as it was, one pattern with a backreference repeated over the run (55 ms over a run
of 1 MiB): the oracle of the next test."""

_PIECES = st.lists(st.tuples(st.sampled_from(["a", "'", '"', "\\", "\x00", "\udcff", "é", "\n", "*", "ab"]),
                             st.sampled_from([1, 5, 31, 32, 33, 40, 100])), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(pieces=_PIECES, shape=st.sampled_from([list, tuple, "".join]))
def test_long_runs_are_cut_as_the_one_pattern_cut_them(pieces, shape):
    from harel_ref.stateful._machine import cut_runs

    text = repr(shape([unit * count for unit, count in pieces]))
    assert cut_runs(text) == _ONE_PATTERN.sub(
        lambda run: f"{run.group(1) * 8}...({len(run.group(0)) // len(run.group(1))} chars)", text)


@pytest.mark.parametrize("then", ANEW_THEN)
def test_a_group_made_anew_is_claimed_through_the_instance_that_made_the_old_one(then):
    """``publish_anew`` (SPEC.md C13) publishes through the other instance and claims through
    the one that made the old group, the setting it claims by moved so that the claim tells the
    new group from the old where the drawn one is the old one's (priority 2, key ``blue``): a
    store whose instances keep each group's settings fails every such claim, a correct one
    none, and each counts as its situation."""
    for cls in (InMemoryTransport, GroupSettingsKeptByEachInstance):
        state = machine(cls)
        state.publish(group="g1", event="a", priority=2, routing_key="blue", via=0)
        state.ack(lease=state.claim_any(worker="w1", visibility=5, via=0), via=0)
        try:
            state.publish_anew(which=0, event="b", priority=2, routing_key="blue", then=then, visibility=5)
        except Divergence as seen:
            assert cls is GroupSettingsKeptByEachInstance, seen
        else:
            assert cls is InMemoryTransport, f"{then}: a stale setting passed"
        finally:
            with contextlib.suppress(Divergence):
                state.teardown()
        assert state.reached[ANEW_BY_KEY if "key" in then else ANEW_BY_FLOOR] == 1, dict(state.reached)


def test_a_claim_after_a_group_made_anew_counts_only_where_that_group_is_its_answer():
    """A group ahead of the one made anew, past every floor, is the claim's answer by the new
    settings and by the old: the claim cannot tell them apart, the stale store passes, and the
    situation is not counted (a reviewer's example)."""
    for cls in (InMemoryTransport, GroupSettingsKeptByEachInstance):
        state = machine(cls)
        state.publish(group="g2", event="x", priority=4, routing_key=None, via=0)  # ahead of g1, past every floor
        state.publish(group="g1", event="a", priority=2, routing_key="blue", via=0)
        state.ack(lease=state.claim(worker="w1", visibility=5, min_priority=2, routing_keys=["blue"], via=0), via=0)
        state.publish_anew(which=0, event="b", priority=2, routing_key="blue", then="claim at its floor", visibility=5)
        assert not state.reached[ANEW_BY_FLOOR], dict(state.reached)
        state.teardown()
