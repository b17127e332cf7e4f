"""The history checker on hand-written histories: a clean one, and one per kind of violation.

Times are small integers; ``lease(...)`` builds what a claim returns.  Visibility is 10 unless
a test says otherwise.
"""

import json

import pytest

from harel_ref.transport import InMemoryTransport, OutcomeUnknownError, StorageError
from harel_ref.stateful._machine import FakeClock
from harel_ref.stateful.history import History, Record, RecordingTransport, check, drain, load
from harel_ref.stateful._properties import owner


def lease(group, event, token, seq=1):
    return {"group_id": group, "event": event, "seq": seq, "token": token}


def publish(at, group, event, worker="p"):
    return Record(worker, "publish", at, {"group_id": group, "event": event}, complete=at + 0.5)


def claim(at, done, result, worker="w1", visibility=10):
    return Record(worker, "claim", at, {"worker_id": worker, "visibility": visibility}, complete=done, result=result)


def ack(at, done, held, result=True, worker="w1"):
    return Record(worker, "ack", at, {"lease": held}, complete=done, result=result)


def nack(at, done, held, result=True, worker="w1", delay=0):
    return Record(worker, "nack", at, {"lease": held, "delay": delay}, complete=done, result=result)


def kinds(report):
    return sorted({violation.kind for violation in report.violations})


def test_a_clean_history_passes():
    a, b, c = lease("g", "a", "t1"), lease("g", "b", "t2", 2), lease("h", "c", "t3", 3)
    again = lease("g", "b", "t4", 2)
    records = [
        publish(0, "g", "a"), publish(1, "g", "b"), publish(1, "h", "c"), publish(2, "h", "d"),
        claim(3, 4, a), claim(3, 4, c, worker="w2"),
        ack(5, 6, a), nack(5, 6, c, worker="w2", delay=1),
        claim(7, 8, b), nack(9, 9.5, b),                          # given back at once
        claim(10, 11, again, worker="w2"),
        ack(12, 13, b, result=False),                             # stale: fenced, False
        ack(12, 13, again, worker="w2"),
    ]
    report = check(records, drained=[("h", "c"), ("h", "d")])
    assert report.ok, report
    assert "no violations" in str(report)


def test_overlap_two_leases_on_one_group():
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first), claim(3, 4, second, worker="w2"),
               ack(5, 6, second, worker="w2"), ack(5, 6, first, result=False)]
    report = check(records)
    assert kinds(report) == ["model", "overlap"]  # the model names it too
    assert "w1" in str(report.overlaps[0]) and "w2" in str(report.overlaps[0])
    assert owner(report.linearizability.kind) == "single-in-flight"


def test_no_overlap_once_the_lease_lapsed_or_was_given_up():
    first, second, third = lease("g", "a", "t1"), lease("g", "a", "t2"), lease("g", "a", "t3")
    records = [
        publish(0, "g", "a"),
        claim(1, 2, first, visibility=3),          # surely held over [2, 4]
        claim(4, 5, second, worker="w2"),           # from 5: after first lapsed
        nack(6, 7, second, worker="w2"),            # given up at 6
        claim(6.5, 8, third, worker="w3"),          # claim invoked before the nack completed: fine
        ack(9, 10, third, worker="w3"),
    ]
    assert check(records).ok


def test_fifo_break_a_later_message_acked_first():
    a, b = lease("g", "a", "t1"), lease("g", "b", "t2", 2)
    records = [publish(0, "g", "a"), publish(1, "g", "b"),
               claim(2, 3, b), ack(4, 5, b), claim(6, 7, a), ack(8, 9, a)]
    assert kinds(check(records)) == ["model", "out-of-order"]


def test_fifo_break_a_later_message_acked_while_the_earlier_is_still_queued():
    b = lease("g", "b", "t2", 2)
    records = [publish(0, "g", "a"), publish(1, "g", "b"), claim(2, 3, b), ack(4, 5, b)]
    assert kinds(check(records, drained=[("g", "a")])) == ["model", "out-of-order"]


def test_concurrent_publishes_have_no_order():
    a, b = lease("g", "a", "t1"), lease("g", "b", "t2", 2)
    both = [Record("p1", "publish", 0, {"group_id": "g", "event": "a"}, complete=2),
            Record("p2", "publish", 1, {"group_id": "g", "event": "b"}, complete=3)]
    assert check([*both, claim(4, 5, b), ack(6, 7, b), claim(8, 9, a), ack(10, 11, a)]).ok


def test_lost_a_published_message_neither_acked_nor_drained():
    report = check([publish(0, "g", "a"), publish(1, "g", "b")], drained=[("g", "a")])
    assert kinds(report) == ["lost"]
    assert "'b'" in str(report.lost[0])


def test_not_lost_when_its_fate_is_unknown():
    a = lease("g", "a", "t1")
    unanswered_ack = Record("w1", "ack", 3, {"lease": a})  # the worker died mid-call
    unanswered_publish = Record("p", "publish", 0, {"group_id": "g", "event": "b"})
    assert check([publish(0, "g", "a"), claim(1, 2, a), unanswered_ack, unanswered_publish]).ok


def test_duplicate_a_message_acked_twice():
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first, visibility=1),
               claim(4, 5, second, worker="w2"), ack(6, 7, second, worker="w2"), ack(6, 7, first)]
    assert "duplicated" in kinds(check(records))


def test_unexpected_a_message_nobody_published():
    ghost = lease("g", "ghost", "t1")
    report = check([claim(1, 2, ghost), ack(3, 4, ghost)])
    assert kinds(report) == ["model", "unexpected"]
    assert kinds(check([], drained=[("g", "ghost")])) == ["unexpected"]


def test_redelivered_after_ack():
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first), ack(3, 4, first),
               claim(5, 6, second, worker="w2")]
    assert kinds(check(records)) == ["model", "redelivered"]
    assert kinds(check(records[:3], drained=[("g", "a")])) == ["redelivered"]


def test_publishing_one_event_twice_is_refused():
    with pytest.raises(ValueError, match="published twice"):
        check([publish(0, "g", "a"), publish(1, "g", "a")])


def test_histories_from_files_merge_and_keep_unanswered_calls(tmp_path):
    queue = InMemoryTransport()
    one = History(tmp_path / "one.jsonl")
    RecordingTransport(queue, one, "w1").publish("g", "a")
    held = RecordingTransport(queue, one, "w1").claim("w1", 10)
    one.close()
    two = History(tmp_path / "two.jsonl")
    RecordingTransport(queue, two, "w2").ack(held)
    two.invoke("w2", "ack", lease=held)  # never completed: as if the process was killed
    two.close()

    records = load(tmp_path)
    assert [(r.worker, r.op) for r in records] == [("w1", "publish"), ("w1", "claim"), ("w2", "ack"), ("w2", "ack")]
    assert records[1].result["event"] == "a" and records[2].result is True
    assert records[3].complete is None
    assert json.loads((tmp_path / "two.jsonl").read_text().splitlines()[0])["op"] == "ack"
    assert check(records, drain(queue)).ok


def test_an_exception_is_recorded_as_an_error():
    history = History()
    with pytest.raises(ValueError):
        RecordingTransport(InMemoryTransport(), history, "w1").claim("w1", -1)
    (record,) = history.records
    assert record.error and "ValueError" in record.error and not record.ok


class _NotTakenHere(StorageError):
    """A backend's own StorageError, as rqlite's request that no node took."""


def test_a_storage_error_of_a_backends_own_class_is_a_call_that_changed_nothing():
    """R17: a call that raised StorageError changed nothing, whatever subclass a backend raises.
    Here an ack that raised one, yet acted: the message is gone from the drain.  Recorded under
    its own class name, the checker took it for a call of unknown outcome and passed it (and
    under rqlite's faults, groups holding such calls were left undecided)."""
    clock = FakeClock()
    history, queue = History(clock=clock), InMemoryTransport(clock=clock)

    class ActsThenRaises(InMemoryTransport):
        def ack(self, lease):
            queue.ack(lease)
            raise _NotTakenHere("no node took the request")

    RecordingTransport(queue, history, "p").publish("g", "a")
    taken = RecordingTransport(queue, history, "w1").claim("w1", 60)
    with pytest.raises(StorageError):
        RecordingTransport(ActsThenRaises(), history, "w1").ack(taken)
    assert history.records[-1].error.startswith("StorageError: _NotTakenHere(")
    clock.now += 3600  # every lease lapsed: the drain sees what is left
    report = check(history.records, drained=drain(queue))
    assert kinds(report) == ["lost"], report


# --- What only the model sees: the history checker consults it (SPEC.md R19) ----------------


def test_model_a_claim_during_a_park():
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first), nack(3, 4, first, delay=100),
               claim(10, 11, second, worker="w2")]  # parked until 103 at the earliest
    report = check(records, drained=[("g", "a")])
    assert kinds(report) == ["model"]
    assert owner(report.linearizability.kind) == "parking"


def test_model_a_claim_that_answers_none_while_a_group_is_claimable():
    records = [publish(0, "g", "a"), claim(1, 2, None)]
    report = check(records, drained=[("g", "a")])
    assert kinds(report) == ["model"]
    assert owner(report.linearizability.kind) == "no-loss"


def test_model_an_ack_of_a_superseded_lease_that_answers_true():
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first, visibility=1),   # lapses by 3.5
               claim(5, 6, second, worker="w2"), ack(7, 8, first)]        # t1 was superseded
    report = check(records, drained=[("g", "a")])
    assert "model" in kinds(report)
    assert owner(report.linearizability.kind) == "fencing"


def test_model_allows_what_a_wall_clock_window_allows():
    """A lease ending inside a claim's window may count as lapsed (SPEC.md R18)."""
    first, second = lease("g", "a", "t1"), lease("g", "a", "t2")
    records = [publish(0, "g", "a"), claim(1, 2, first, visibility=3),   # ends in [4, 5]
               claim(4.5, 6, second, worker="w2")]                        # may be at 5.5 > 5
    assert check(records, drained=[("g", "a")]).ok
    early = [publish(0, "g", "a"), claim(1, 2, first, visibility=3), claim(2.5, 3.5, second, worker="w2")]
    assert kinds(check(early, drained=[("g", "a")])) == ["model", "overlap"]


def test_a_line_cut_by_a_kill_is_read_as_a_call_not_recorded(tmp_path):
    """A worker killed while writing leaves half a line at the end of its history: that call
    is unrecorded (its process died), and every whole line before it still counts."""
    path = tmp_path / "history.jsonl"
    history = History(path)
    with history.record("w1", "publish", group_id="g1", event="e1") as call:
        call.complete(None)
    history.close()
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"id": "w1-2", "worker": "w1", "op": "cl')
    (record,) = load(path)
    assert (record.op, record.ok) == ("publish", True)


class UnknownOutcomes:
    """A queue whose first claim leases and then raises OutcomeUnknownError (it acted), whose
    first ack raises it before acting, and whose second ack acts and then raises it: a cluster
    that lost its leader during each."""

    def __init__(self, queue):
        self.queue, self.claims, self.acks = queue, 0, 0

    def publish(self, *args, **kwargs):
        return self.queue.publish(*args, **kwargs)

    def claim(self, *args, **kwargs):
        self.claims += 1
        lease = self.queue.claim(*args, **kwargs)
        if self.claims == 1:
            raise OutcomeUnknownError("leadership lost while committing")
        return lease

    def ack(self, lease):
        self.acks += 1
        if self.acks == 1:
            raise OutcomeUnknownError("leadership lost before committing")
        done = self.queue.ack(lease)
        if self.acks == 2:
            raise OutcomeUnknownError("leadership lost while committing")
        return done


def test_a_drain_tries_again_past_unknown_outcomes_and_the_history_holds(tmp_path):
    clock = FakeClock(1000.0)
    queue = InMemoryTransport(clock=clock)
    history = History(tmp_path / "h.jsonl", clock=clock)
    recorder = RecordingTransport(UnknownOutcomes(queue), history, "w1")
    for event in ("a", "b", "c"):
        recorder.publish("g", event)

    def lapse():
        clock.now += 61.0  # past the drain's visibility of 60 s

    drained = drain(RecordingTransport(UnknownOutcomes(queue), history, "drain"), lapse=lapse)
    history.close()
    # "a": its claim acted unknown, its first ack did not act, its second acted unknown
    assert drained == [("g", "a"), ("g", "b"), ("g", "c")]
    assert check(load(tmp_path), drained).ok
    assert queue.claim("w1", 10) is None


def test_a_drain_without_a_lapse_raises_an_unknown_outcome():
    queue = InMemoryTransport()
    queue.publish("g", "a")
    with pytest.raises(OutcomeUnknownError):
        drain(UnknownOutcomes(queue))
