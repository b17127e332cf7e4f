"""SqsTransport and its async twin on ElasticMQ (or the server ``HAREL_SQS_URL`` names):
SQS FIFO as the queue, its receipt handles as the fence (SPEC.md R10a, R15; docs/sqs.md).

- the lockstep machine, sync and async, on the wall clock in whole seconds;
- broken variants of the fence SQS gives: a stale handle that raises, and a transport that
  fences harder than it declares (an ack after its own nack answers False), each caught on
  ``fencing`` by steps played on the real server;
- the concurrent properties with branches in processes;
- what a restart of ElasticMQ on its H2 files keeps, judged by the history checker;
- events SQS bodies refuse, carried; bad input refused before anything is sent (R13);
  a server that is down, a queue of another kind (R17).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from hypothesis import settings

from facts_support import property_of
from harel_ref.certify import focus_machine
from harel_ref.stateful import Backend, Divergence, make_machine
from server_support import (assert_concurrent_properties_pass_in_processes, close_machine, require_server,
                            stale_after_a_reclaim)

pytest.importorskip("boto3", reason="the sqs extra is not installed: pip install 'harel-ref[sqs]'")
pytest.importorskip("aiobotocore", reason="the sqs extra is not installed: pip install 'harel-ref[sqs]'")
require_server("HAREL_SQS_URL", "java", "default-jre-headless")
require_server("HAREL_SQS_URL", "mvn", "maven")

from harel_ref.stateful.backends.sqs import CAPABILITIES, _opened_prefix, credentials, sqs, sqs_async  # noqa: E402
from harel_ref.transport import AsyncSqsTransport, SqsTransport, StorageError  # noqa: E402

# Every step on the wall clock takes real seconds: fewer and shorter examples than elsewhere.
WALL_CLOCK = settings(max_examples=8, stateful_step_count=16, deadline=None, derandomize=True, database=None)

TestSqsMachine = make_machine(sqs()).TestCase
TestSqsMachine.settings = WALL_CLOCK
TestAsyncSqsMachine = make_machine(sqs_async()).TestCase
TestAsyncSqsMachine.settings = WALL_CLOCK


def _queue(name: str, **kwargs) -> SqsTransport:
    url, prefix = _opened_prefix(f"{name}-{uuid.uuid4().hex[:8]}")  # deleted at exit on a server of yours
    return SqsTransport(url, prefix=prefix, client_options=credentials(), **kwargs)


# --- broken variants of the fence --------------------------------------------------------------


class RaisesOnStaleHandle(SqsTransport):
    """Lets SQS's ``ReceiptHandleIsInvalid`` through, as harel's SQS transport does."""

    def _perform(self, operation, step):
        from harel_ref.transport import sqs as sqs_module

        with sqs_module._errors(self.url, operation):
            return sqs_module._answer(step, sqs_module._request(self._client, self.queue_url, self._wait, step))


class FencesItsOwnNacks(SqsTransport):
    """Remembers the handles it nacked and answers False for them: more than SQS fences, and
    not what it declares (an ack after the lease's own nack acts, R10a)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.given_up: set[str] = set()

    def ack(self, lease):
        return False if lease.token in self.given_up else super().ack(lease)

    def nack(self, lease, delay=0):
        answer = super().nack(lease, delay)
        self.given_up.add(lease.token)
        return answer


def _backend(transport_class: type) -> Backend:
    def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return transport_class(url, prefix=prefix, client_options=credentials())

    return Backend(f"sqs-{transport_class.__name__}", factory, CAPABILITIES)


def _fencing_machine(transport_class: type):
    return focus_machine(_backend(transport_class).factory, "fencing", CAPABILITIES)()


def test_a_stale_handle_that_raises_fails_fencing():
    """A lease lapses, the message is claimed again, and the old lease's nack raises instead
    of answering False."""
    machine = _fencing_machine(RaisesOnStaleHandle)
    try:
        stale = stale_after_a_reclaim(machine)
        with pytest.raises(Divergence) as caught:
            machine.nack_later(delay=1.0, lease=stale, via=0)
        assert property_of(caught.value) == "fencing" and "ReceiptHandleIsInvalid" in repr(caught.value.__cause__)
    finally:
        close_machine(machine)


def test_the_same_steps_pass_on_the_reference():
    machine = _fencing_machine(SqsTransport)
    stale = stale_after_a_reclaim(machine)
    machine.nack_later(delay=1.0, lease=stale, via=0)  # False: nothing changes
    machine.teardown()  # drains the message after the second lease, or raises Divergence


def test_a_transport_that_fences_its_own_nacks_does_not_do_what_it_declares():
    machine = _fencing_machine(FencesItsOwnNacks)
    try:
        machine.prefill(messages=[("g1", "", 0, None)])
        lease = machine.claim_any(via=0, visibility=3.0, worker="w1")
        machine.nack_now(lease=lease, via=0)
        with pytest.raises(Divergence) as caught:
            machine.ack(lease=lease, via=0)  # R10a: the handle still deletes the message
        assert property_of(caught.value) == "fencing" and caught.value.answered == "False"
    finally:
        close_machine(machine)


# --- processes racing ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sqs", "sqs-async"])
def test_concurrent_properties_pass_with_branches_in_processes(name, tmp_path):
    """Fewer programs than for the other servers: every lease lasts a whole second, and a run
    of a program took about 3 s here (the certification at the standard profile runs 40 × 30)."""
    from harel_ref.certify import Profile

    few = Profile("small", max_examples=4, step_count=6, programs=2, repeats=3)
    assert_concurrent_properties_pass_in_processes([name], tmp_path, few)


# --- a restart of the server --------------------------------------------------------------------


def test_what_a_restart_of_elasticmq_on_its_files_keeps_judged_by_the_history_checker():
    """ElasticMQ 1.7.1 on its H2 files keeps the queue and every message across a restart, and
    the handles of before it still delete.  It does not keep a message in flight, nor its
    sequence numbers: after the restart the group of a held message gives out its next one
    (two leases on one group: single-in-flight), and a new message gets a seq below those of
    before (R16).  The history checker names both; docs/sqs.md says what that means."""
    from harel_ref.stateful.history import History, RecordingTransport, check, drain, load
    from harel_ref.testing.servers import SqsServer

    history = History()
    with SqsServer(persistent=True) as server:
        def opened(worker: str) -> RecordingTransport:
            return RecordingTransport(SqsTransport(server.url, prefix="restart", client_options=credentials()),
                                      history, worker)

        before = opened("w1")
        for event in ("e0", "e1", "e2"):
            before.publish("g", event)
        held = before.claim("w1", 60)
        before.transport.close()
        server.restart()
        after = opened("w2")
        second = after.claim("w2", 60)  # e1, while e0 is held
        after.publish("g", "e3")
        assert (held.event, second.event) == ("e0", "e1")
        assert after.ack(held) is True  # the handle of before the restart still deletes
        assert after.ack(second) is True
        drained = drain(after.transport)
        after.transport.close()
    report = check(load(history.records), drained, acks="until-reclaimed")
    assert [v.kind for v in report.overlaps] == ["overlap"], report
    assert report.fifo_breaks, report  # e3's seq is below e2's


def test_the_queue_outlives_the_transport_and_is_one_for_two_instances():
    url, prefix = _opened_prefix(f"shared-{uuid.uuid4().hex[:8]}")
    first = SqsTransport(url, prefix=prefix, client_options=credentials())
    second = SqsTransport(url, prefix=prefix, client_options=credentials())
    try:
        first.publish("g", "a")
        lease = second.claim("w", 5)
        assert lease.event == "a" and first.claim("w", 5) is None  # one group in flight across both
        first.close()
        assert second.ack(lease) is True
    finally:
        first.close()
        second.close()


# --- bodies, bad input, errors -----------------------------------------------------------------


def test_events_sqs_bodies_refuse_travel_and_come_back_as_they_were():
    events = ["\x00", "\ufffe and \uffff", "\U0010ffff", '"\\ufffe"', "\x1b[0m", ""]
    queue = _queue("bodies")
    try:
        for event in events:
            queue.publish("g", event)
        got = []
        while (lease := queue.claim("w", 5)) is not None:
            got.append(lease.event)
            assert queue.ack(lease) is True
        assert got == events
    finally:
        queue.close()


@pytest.mark.parametrize("call, message", [
    (lambda q: q.publish("grüppe", "x"), "printable ASCII"),
    (lambda q: q.publish(" g", "x"), "printable ASCII"),
    (lambda q: q.publish("g" * 129, "x"), "printable ASCII"),
    (lambda q: q.publish("g", "x", priority=1), "no priorities"),
    (lambda q: q.publish("g", "x", routing_key="k"), "no routing keys"),
    (lambda q: q.publish("g", "\U0001f600" * 70_000), "at most 262144"),
    (lambda q: q.claim("w", 43_201), "at most 43200"),
    (lambda q: q.claim("w", 0), "> 0"),
], ids=["non-ascii", "space", "long", "priority", "routing-key", "large", "visibility", "zero"])
def test_bad_input_is_refused_and_nothing_is_sent(call, message):
    queue = _queue("bad")
    try:
        queue.publish("g", "kept")
        with pytest.raises(ValueError, match=message):
            call(queue)
        lease = queue.claim("w", 5)
        assert lease.event == "kept" and queue.ack(lease) is True
        assert queue.claim("w", 5) is None
    finally:
        queue.close()


def test_a_nack_delay_over_twelve_hours_is_refused_and_the_lease_kept():
    queue = _queue("delay")
    try:
        queue.publish("g", "a")
        lease = queue.claim("w", 5)
        with pytest.raises(ValueError, match="at most 43200"):
            queue.nack(lease, 43_200.5)
        assert queue.ack(lease) is True
    finally:
        queue.close()


def test_a_claim_for_a_priority_or_routing_keys_finds_none():
    """Every group has priority 0 and no routing key (R4)."""
    queue = _queue("floors")
    try:
        queue.publish("g", "a")
        assert queue.claim("w", 5, min_priority=1) is None
        assert queue.claim("w", 5, routing_keys=["k"]) is None
        assert queue.claim("w", 5).event == "a"
    finally:
        queue.close()


@pytest.mark.parametrize("visibility", [0.2, 1e-7])
def test_whole_seconds_are_rounded_up_never_down(visibility):
    """A lease of 0.2 s (or 1e-7 s) lasts a whole second: the message is not handed out again
    at once.  Shown when the second claim answered within the second (it takes milliseconds)."""
    queue = _queue("round")
    try:
        queue.publish("g", "a")
        started = time.time()
        assert queue.claim("w1", visibility) is not None
        second = queue.claim("w2", visibility)
        if time.time() - started < 1.0:  # the lease surely had not ended on the server
            assert second is None
    finally:
        queue.close()


def test_bad_arguments_of_the_transport_are_refused():
    with pytest.raises(ValueError, match="prefix"):
        SqsTransport("http://127.0.0.1:1", prefix="a.b")
    with pytest.raises(ValueError, match="endpoint"):
        SqsTransport("127.0.0.1:9324")
    with pytest.raises(ValueError, match="wait_seconds"):
        SqsTransport("http://127.0.0.1:1", wait_seconds=21)


def test_a_server_that_is_down_raises_storage_error_naming_it():
    with pytest.raises(StorageError, match="127.0.0.1:1.*cannot connect"):
        SqsTransport("http://127.0.0.1:1", client_options=credentials(), timeout=2)


def test_a_server_that_stops_answering_leaves_the_outcome_unknown():
    """The server is frozen (SIGSTOP) after the transport opened: each request is sent and no
    answer comes, so the call may or may not have taken effect (R17), sync and async."""
    import signal

    from harel_ref.testing.servers import SqsServer
    from harel_ref.transport import OutcomeUnknownError

    with SqsServer() as server:
        # The queue made, and the server's first requests served, with time to spare: a server
        # just started on a busy machine took more than the 1 s below to answer the open.
        warm = SqsTransport(server.url, prefix="frozen", client_options=credentials(), timeout=30)
        warm.publish("g", "warm-up")
        warm.ack(warm.claim("w", 30))
        warm.close()
        queue = SqsTransport(server.url, prefix="frozen", client_options=credentials(), timeout=1)

        async def opened():
            return await AsyncSqsTransport.create(server.url, prefix="frozen", client_options=credentials(), timeout=1)

        loop = asyncio.new_event_loop()
        twin = loop.run_until_complete(opened())
        queue.publish("g", "a")
        lease = queue.claim("w", 30)
        os.kill(server._process.pid, signal.SIGSTOP)
        try:
            for call in (lambda: queue.publish("g", "b"), lambda: queue.claim("w", 5), lambda: queue.ack(lease),
                         lambda: queue.nack(lease, 1), lambda: loop.run_until_complete(twin.claim("w", 5)),
                         lambda: loop.run_until_complete(twin.ack(lease))):
                with pytest.raises(OutcomeUnknownError, match="may or may not"):
                    call()
        finally:
            os.kill(server._process.pid, signal.SIGCONT)
            queue.close()
            loop.run_until_complete(twin.close())
            loop.close()


def test_a_long_poll_waits_longer_than_the_timeout_without_an_error():
    """``wait_seconds`` is added to how long an answer is awaited: a claim on an empty queue
    waits for a message and answers None, rather than giving up while the server still polls."""
    queue = _queue("poll", wait_seconds=2, timeout=1)
    try:
        started = time.monotonic()
        assert queue.claim("w", 5) is None
        assert time.monotonic() - started >= 1.9
    finally:
        queue.close()


def test_a_message_that_is_not_harel_refs_is_refused_and_given_back():
    from harel_ref.stateful.backends.sqs import client

    queue = _queue("foreign")
    sqs_client = client(queue.url)
    try:
        sqs_client.send_message(QueueUrl=queue.queue_url, MessageBody="not json", MessageGroupId="g",
                                MessageDeduplicationId=uuid.uuid4().hex)
        with pytest.raises(StorageError, match="not one of harel-ref's.*left in the queue"):
            queue.claim("w", 60)
        again = sqs_client.receive_message(QueueUrl=queue.queue_url, VisibilityTimeout=60).get("Messages")
        assert again and again[0]["Body"] == "not json"  # visible again at once, not held for 60 s
    finally:
        sqs_client.close()
        queue.close()


def test_a_queue_that_is_not_fifo_is_refused_and_kept():
    from harel_ref.stateful.backends.sqs import client

    url, prefix = _opened_prefix(f"standard-{uuid.uuid4().hex[:8]}")
    sqs_client = client(url)
    try:
        standard = sqs_client.create_queue(QueueName=f"{prefix}.fifo", Attributes={"FifoQueue": "true",
                                           "ContentBasedDeduplication": "true"})["QueueUrl"]
        with pytest.raises(StorageError, match="open"):
            SqsTransport(url, prefix=prefix, client_options=credentials())
        assert sqs_client.get_queue_attributes(QueueUrl=standard, AttributeNames=["All"])["Attributes"][
            "ContentBasedDeduplication"] == "true"  # kept as it was
    finally:
        sqs_client.close()


def test_async_round_trip_and_close():
    async def main():
        url, prefix = _opened_prefix(f"async-{uuid.uuid4().hex[:8]}")
        queue = await AsyncSqsTransport.create(url, prefix=prefix, client_options=credentials())
        await queue.publish("g", "\x00ü")
        lease = await queue.claim("w", 5)
        assert lease.event == "\x00ü" and lease.seq >= 1
        assert await queue.nack(lease, 0) is True
        assert await queue.ack(lease) is True  # R10a: the handle deletes until the next claim
        assert await queue.ack(lease) is False
        await queue.close()
        await queue.close()
        with pytest.raises(Exception, match="closed"):
            await queue.claim("w", 5)

    asyncio.run(main())
