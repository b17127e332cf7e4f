"""RedisTransport and its async twin on a real redis-server.

The server is this xdist worker's throwaway one (``harel_ref.stateful.backends.redis``: Debian's
``redis-server``, started on first use, deleted at exit), or the one ``HAREL_REDIS_URL`` names.
Each Hypothesis example gets its own key prefix.

- the lockstep machine, sync and async, with fairness stamped on ack (SPEC R5);
- broken variants of that policy (stamping on claim, never stamping), caught as ``fairness``;
- the concurrent properties with branches in processes racing for claims;
- what a restart does, with and without the append-only file;
- errors: a bad prefix, a server that is down, a connection lost mid-call (R17).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from facts_support import property_of
from twin_support import twin_settings
from harel_ref.certify import focus_machine
from harel_ref.transport import AsyncRedisTransport, OutcomeUnknownError, RedisTransport, StorageError
from harel_ref.transport import redis as redis_module
from server_support import assert_concurrent_properties_pass_in_processes, require_server
from harel_ref.stateful import Divergence, make_machine
from harel_ref.stateful.backends.redis import CAPABILITIES, _opened_prefix, prefix_for, redis, redis_async, server_url

pytest.importorskip("redis", reason="the redis extra is not installed: pip install 'harel-ref[redis]'")
require_server("HAREL_REDIS_URL", "redis-server", "redis-server")

TestRedisMachine = make_machine(redis()).TestCase
TestAsyncRedisMachine = make_machine(redis_async()).TestCase
TestAsyncRedisMachine.settings = twin_settings(TestAsyncRedisMachine.settings)


# --- broken variants of the ack-stamped fairness policy -------------------------------------


NEVER_STAMPS = redis_module.ACK.replace("h.stamp = ARGV[5]", "h.stamp = h.stamp")
STAMPS_ON_CLAIM = redis_module.CLAIM.replace(
    "redis.call('HSET', K .. ':g:' .. group, 'holder', token,",
    "redis.call('HSET', K .. ':g:' .. group, 'stamp', ARGV[2], 'holder', token,",
)


class _Broken(RedisTransport):
    scripts: dict[str, str] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, lua in self.scripts.items():
            self._scripts[name] = self._client.register_script(lua)


class NeverStamps(_Broken):
    scripts = {"ack": NEVER_STAMPS}


class StampsOnClaim(_Broken):
    scripts = {"ack": NEVER_STAMPS, "claim": STAMPS_ON_CLAIM}


def test_the_broken_scripts_differ_from_the_real_ones():
    assert NEVER_STAMPS != redis_module.ACK and STAMPS_ON_CLAIM != redis_module.CLAIM


@pytest.mark.parametrize("broken", [NeverStamps, StampsOnClaim], ids=["never-stamps", "stamps-on-claim"])
def test_broken_fairness_policies_fail_fairness(broken):
    def factory(clock, namespace):
        return broken(server_url(), clock=clock, prefix=prefix_for(namespace))

    # the order of groups is fairness's to judge: in its search, groups stamped alike may go in
    # any order, so a wrong stamp shows as a group passed over, not as a tie taken out of turn
    machine = focus_machine(factory, "fairness", CAPABILITIES)
    with pytest.raises(Divergence) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(max_examples=300, derandomize=True, database=None, deadline=None,
                              report_multiple_bugs=False, phases=[Phase.generate]),
        )
    assert property_of(caught.value) == "fairness", str(caught.value)


# --- processes racing for claims ------------------------------------------------------------


@pytest.mark.waits
def test_concurrent_properties_pass_with_branches_in_processes(tmp_path):
    assert_concurrent_properties_pass_in_processes(["redis", "redis-async"], tmp_path)


# --- a restart of the server ----------------------------------------------------------------


def _fill(queue: RedisTransport):
    queue.publish("a", "a-1")
    queue.publish("a", "a-2")
    queue.publish("b", "b-1")
    return queue.claim("w", 60)  # a-1, held


@pytest.mark.parametrize("appendonly", [False, True], ids=["no-persistence", "append-only-file"])
def test_a_restart_empties_the_queue_without_persistence_and_keeps_it_with_aof(appendonly):
    from harel_ref.testing.servers import RedisServer

    now = [100.0]
    with RedisServer(appendonly=appendonly) as server:
        queue = RedisTransport(server.url, clock=lambda: now[0], prefix="restart")
        held = _fill(queue)
        server.restart()  # SIGTERM: Redis writes its append-only file out before it exits
        # redis-py finds the idle connection closed before it sends anything, and connects
        # again: no call fails.
        if appendonly:
            assert queue.claim("w", 60).event == "b-1"  # "a" is still held
            assert queue.ack(held)
            assert queue.claim("w", 60).event == "a-2"
        else:
            assert queue.claim("w", 60) is None  # everything is gone
            assert queue.ack(held) is False  # the lease of before the restart has no message
            queue.publish("a", "a-3")
            assert queue.claim("w", 60).event == "a-3"
        queue.close()


# --- times that are not whole numbers ------------------------------------------------------


@pytest.mark.parametrize("start, delay", [(0.1, 0.2), (1_700_000_000.123446, 0.5), (1e15, 1.0)])
def test_a_park_ends_exactly_at_now_plus_delay(start, delay):
    """Found by review: the park's end was summed in Lua, whose tostring keeps 14 digits, so a
    park could end before now + delay (R9) or after it.  The lockstep machine's clock moves in
    whole steps and could not see it."""
    now = [start]
    url, prefix = _opened_prefix(f"park-precision-{start}")
    queue = RedisTransport(url, clock=lambda: now[0], prefix=prefix)
    try:
        queue.publish("g", "e")
        assert queue.nack(queue.claim("w", 60), delay)
        end = start + delay
        now[0] = end
        assert queue.claim("w", 60) is None, "claimed at the park's end: still parked (R3)"
        now[0] = end + max(abs(end) * 2.2e-16, 1e-300) * 2  # the next float or two after it
        assert queue.claim("w", 60) is not None, "not claimable just after the park's end"
    finally:
        queue.close()


def test_seqs_past_ten_to_the_fourteen_stay_exact():
    """Lua's tostring writes 10^14 as 1e+14: seqs are formatted as integers."""
    import redis as redis_py

    url, prefix = _opened_prefix("big-seqs")
    queue = RedisTransport(url, prefix=prefix)
    client = redis_py.Redis.from_url(url)
    try:
        client.set(f"{redis_module.key_prefix(prefix)}:seq", 10**14 - 1)
        queue.publish("g", "first")
        queue.publish("g", "second")
        leases = []
        for _ in range(2):
            lease = queue.claim("w", 60)
            leases.append(lease.seq)
            assert queue.ack(lease)
        assert leases == [10**14, 10**14 + 1]
    finally:
        client.close()
        queue.close()


# --- errors ---------------------------------------------------------------------------------


def test_a_bad_prefix_is_refused_before_connecting():
    with pytest.raises(ValueError, match="prefix must be"):
        RedisTransport("redis://127.0.0.1:1/0", prefix="has space")


def test_a_server_that_is_down_raises_storage_error_naming_it():
    from harel_ref.testing.servers import _free_port

    url = f"redis://:secret@127.0.0.1:{_free_port()}/0"
    with pytest.raises(StorageError, match="cannot connect") as caught:
        RedisTransport(url, timeout=2)
    assert "secret" not in str(caught.value)


def test_an_answer_that_does_not_come_in_time_is_an_unknown_outcome_and_the_next_call_works():
    """A script of another client keeps the server busy for a second; a claim with a 0.3 s
    timeout sent meanwhile may or may not run once the server is free: OutcomeUnknownError."""
    import threading

    import redis as redis_py

    url, prefix = _opened_prefix("answer-too-late")  # its keys deleted at exit on a server of yours
    queue = RedisTransport(url, prefix=prefix, timeout=0.3)
    busy_for_a_second = (
        "local start = redis.call('TIME') repeat local now = redis.call('TIME')"
        " until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > 1000000 return 1"
    )
    admin = redis_py.Redis.from_url(url)
    try:
        queue.publish("g", "e")
        busy = threading.Thread(target=admin.eval, args=(busy_for_a_second, 0))
        busy.start()
        time.sleep(0.1)
        with pytest.raises(OutcomeUnknownError, match="may or may not"):
            queue.claim("w", 60)
        busy.join()
        first = queue.claim("w", 60)  # the timed-out claim may have leased it: then None
        assert first is None or first.event == "e"
    finally:
        admin.close()
        queue.close()


async def _async_round_trip() -> None:
    url, prefix = _opened_prefix("async-round-trip")
    queue = await AsyncRedisTransport.create(url, prefix=prefix)
    try:
        await queue.publish("g", "e\x00")
        lease = await queue.claim("w", 60, routing_keys=None)
        assert lease.event == "e\x00" and await queue.ack(lease) and await queue.claim("w", 60) is None
    finally:
        await queue.close()


def test_async_round_trip_with_a_nul_in_the_event():
    import asyncio

    asyncio.run(_async_round_trip())


# --- a restart of the server mid-traffic, with the append-only file --------------------------


def test_a_restart_with_aof_mid_traffic_loses_and_duplicates_nothing(request):
    """Workers publish, claim and ack while redis-server (appendonly yes) is stopped by SIGTERM,
    which writes the append-only file out, and started again on it.  The history checker then
    finds no overlap, FIFO break, loss, duplicate or model violation."""
    from harel_ref.testing.servers import RedisServer
    from restart_traffic import traffic_through_a_restart

    with RedisServer(appendonly=True) as server:
        def restart():
            server.stop()
            time.sleep(0.3)
            server.start()

        traffic = traffic_through_a_restart(lambda: RedisTransport(server.url, prefix="restart"), restart)
    request.node.user_properties.append(("fault_counts", f"redis restart with AOF: {traffic.summary()}"))
    assert traffic.report.ok, traffic.summary()
    assert traffic.failures, "no call failed: the restart did not happen under traffic"
    assert traffic.calls["ack"] > 20, traffic.summary()
