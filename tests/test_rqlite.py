"""The rqlite transports against the live three-node cluster (`bash .ci/cluster up`).

No mocks: every test talks to the real cluster.  Each test uses its own table prefix, so xdist
workers share the cluster safely; the fault tests live in test_rqlite_faults.py and wait for
these to finish (see rqlite_support.py).  Without a cluster these tests skip, or fail on CI.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import traceback
import uuid

import httpx
import pytest
from hypothesis import settings
from rqlite_support import rerun_after_an_election, shared_cluster  # noqa: F401  (autouse fixture)

from twin_support import twin_settings
from harel_ref.transport import (
    AsyncRqliteTransport,
    Lease,
    RqliteTransport,
    StorageError,
    TransportClosedError,
)
from harel_ref.transport._sql import head_params, head_query
from old_schemas import EXPECTED_CLAIMABLE_AT, EXPECTED_LEASES, NOW, check_upgraded, names, v4_with_data, v5_with_data
from harel_ref.stateful import FakeClock, make_machine
from harel_ref.stateful.backends.rqlite import prefix_for, rqlite, rqlite_async

# Every example costs a few dozen Raft round trips: fewer examples than the local backends.
_MACHINE_SETTINGS = settings(parent=settings.default, max_examples=min(settings.default.max_examples, 20))

TestRqliteMachine = rerun_after_an_election(make_machine(rqlite()).TestCase)
TestRqliteMachine.settings = _MACHINE_SETTINGS
TestAsyncRqliteMachine = rerun_after_an_election(make_machine(rqlite_async()).TestCase)
TestAsyncRqliteMachine.settings = twin_settings(_MACHINE_SETTINGS)

SECRET = "s3cr3t-pa55"


def _prefix() -> str:
    return prefix_for(f"t_{uuid.uuid4().hex[:16]}")


def _drop(url: str, prefix: str) -> None:
    names = ("messages", "groups", "meta")
    statements = [[f"DROP TABLE IF EXISTS {prefix}_harel_transport_{name}"] for name in names]
    httpx.post(f"{url}/db/execute?transaction", json=statements, timeout=10).raise_for_status()


@pytest.fixture
def queue(shared_cluster):  # noqa: F811
    """A fresh RqliteTransport on a fake clock, and its clock; its tables dropped after."""
    clock, prefix = FakeClock(), _prefix()
    transport = RqliteTransport.from_url(shared_cluster, clock=clock, prefix=prefix)
    yield transport, clock
    transport.close()
    _drop(shared_cluster[0], prefix)


class Counter:
    """An httpx request hook that counts the requests a client sends."""

    def __init__(self, client: httpx.Client) -> None:
        self.sent = 0
        client.event_hooks["request"].append(self)

    def __call__(self, request: httpx.Request) -> None:
        self.sent += 1


def test_claim_ack_nack_are_one_request_each(queue):
    transport, clock = queue
    counter = Counter(transport.client)

    def requests_for(call, *args):
        before = counter.sent
        answer = call(*args)
        return answer, counter.sent - before

    assert requests_for(transport.publish, "g", "first") == (None, 1)
    transport.publish("g", "second")
    lease, sent = requests_for(transport.claim, "w", 5.0)
    assert (lease.event, sent) == ("first", 1)
    assert requests_for(transport.claim, "w", 5.0) == (None, 1)  # g is in flight
    assert requests_for(transport.nack, lease, 0) == (True, 1)
    lease = transport.claim("w", 5.0)
    assert requests_for(transport.nack, lease, 2.0) == (True, 1)  # parked
    assert requests_for(transport.ack, lease) == (False, 1)  # the park took it from the lease
    clock.now += 3
    lease = transport.claim("w", 5.0)
    assert requests_for(transport.ack, lease) == (True, 1)
    assert requests_for(transport.ack, lease) == (False, 1)
    assert transport.claim("w", 5.0).event == "second"


def test_opening_new_or_current_tables_takes_three_requests(shared_cluster):  # noqa: F811
    """A leader check and two more: new tables are one read (which tables exist) and one
    write request holding the whole schema; tables at the current version are two reads."""
    prefix = _prefix()
    try:
        for opened in ("new", "current"):
            with httpx.Client() as client:
                counter = Counter(client)
                transport = RqliteTransport.from_url(shared_cluster, clock=FakeClock(), prefix=prefix, client=client)
                assert counter.sent == 3, opened
                transport.publish("g", opened)
                transport.close()
        with RqliteTransport.from_url(shared_cluster, clock=FakeClock(), prefix=prefix) as transport:
            assert transport.claim("w", 5.0).event == "new"
    finally:
        _drop(shared_cluster[0], prefix)


def test_async_claim_ack_nack_are_one_request_each(shared_cluster):  # noqa: F811
    sent = []

    async def count(request):
        sent.append(request.url.path)

    async def scenario(prefix):
        clock = FakeClock()
        transport = await AsyncRqliteTransport.from_url(shared_cluster, clock=clock, prefix=prefix)
        try:
            transport.client.event_hooks["request"].append(count)
            await transport.publish("g", "only")
            lease = await transport.claim("w", 5.0)
            assert await transport.nack(lease, 0) is True
            lease = await transport.claim("w", 5.0)
            assert await transport.ack(lease) is True
            assert await transport.claim("w", 5.0) is None
        finally:
            await transport.close()

    prefix = _prefix()
    try:
        asyncio.run(scenario(prefix))
    finally:
        _drop(shared_cluster[0], prefix)
    assert sent == ["/db/execute"] * 6  # publish, claim, nack, claim, ack, claim


def test_bad_input_and_closed_transport_send_nothing(queue):
    transport, _ = queue
    counter = Counter(transport.client)
    lease = Lease("g", "e", 1, "w:0")
    for call, args in [
        (transport.publish, ("", "e")),
        (transport.claim, ("w", 0)),
        (transport.claim, ("w", 1.0, 0, "blue")),
        (transport.nack, (lease, -1)),
        (transport.ack, (("g", 1),)),
    ]:
        with pytest.raises((TypeError, ValueError)):
            call(*args)
    transport.close()
    transport.close()
    for call, args in [(transport.publish, ("g", "e")), (transport.claim, ("w", 1.0)), (transport.ack, (lease,))]:
        with pytest.raises(TransportClosedError):
            call(*args)
    assert counter.sent == 0


def _leaks(text: str) -> bool:
    token = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    return SECRET in text or token in text


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


def test_credentials_never_appear_in_repr_errors_or_logs(shared_cluster, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    with_auth = [url.replace("://", f"://alice:{SECRET}@", 1) for url in shared_cluster]
    prefix = _prefix()
    transport = RqliteTransport.from_url(",".join(with_auth), prefix=prefix)
    try:
        transport.publish("g", "e")  # rqlite without auth ignores the header: it works
        assert transport.claim("w", 1.0).event == "e"
        assert "alice" not in repr(transport) and not _leaks(repr(transport))
    finally:
        transport.close()
        _drop(shared_cluster[0], prefix)

    # A node that is not there: the error names the node, never the password.
    with pytest.raises(StorageError) as caught:
        RqliteTransport.from_url(f"http://alice:{SECRET}@127.0.0.1:1", wait=0, timeout=2)
    assert "127.0.0.1:1" in str(caught.value)
    assert not _leaks(_error_text(caught.value))

    async def open_async():
        await AsyncRqliteTransport.from_url(f"http://alice:{SECRET}@127.0.0.1:1", wait=0, timeout=2)

    with pytest.raises(StorageError) as caught:
        asyncio.run(open_async())
    assert not _leaks(_error_text(caught.value))

    # A malformed URL is refused without echoing the password.
    for bad in (f"ftp://alice:{SECRET}@127.0.0.1:4001", f"http://alice:{SECRET}@127.0.0.1:4001/?x=1"):
        with pytest.raises(ValueError) as caught:
            RqliteTransport.from_url(bad)
        assert not _leaks(_error_text(caught.value))

    assert not _leaks(caplog.text)
    assert not any(_leaks(record.getMessage()) for record in caplog.records)


def test_a_dead_first_node_fails_over_to_the_next(shared_cluster):  # noqa: F811
    """Connection refused means the request never left: it goes to the next URL given."""
    prefix = _prefix()
    transport = RqliteTransport.from_url(["http://127.0.0.1:1", *shared_cluster], prefix=prefix, timeout=5)
    try:
        transport.publish("g", "e")
        assert transport.claim("w", 1.0).event == "e"
    finally:
        transport.close()
        _drop(shared_cluster[0], prefix)


def test_prefix_is_validated_before_any_request():
    with pytest.raises(ValueError, match="prefix"):
        RqliteTransport.from_url("http://127.0.0.1:1", prefix="no-dashes; DROP TABLE x")


def test_two_clients_upgrading_one_old_table_at_once_both_open_and_keep_every_message(
    shared_cluster,  # noqa: F811
):
    """The schema plan is one request per statement, so two clients may both send the seeds'
    missing-column ALTER TABLE; the one that loses the race must still open."""
    prefix = _prefix()
    old_schema = [
        [f"CREATE TABLE {prefix}_harel_transport_messages (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
         " group_id TEXT NOT NULL, event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)"],
        [f"CREATE TABLE {prefix}_harel_transport_groups (group_id TEXT PRIMARY KEY,"
         " last_claimed_at REAL NOT NULL DEFAULT 0.0, priority INT NOT NULL DEFAULT 0)"],
        [f"INSERT INTO {prefix}_harel_transport_messages (group_id, event) VALUES ('g', 'old')"],
        [f"INSERT INTO {prefix}_harel_transport_groups (group_id) VALUES ('g')"],
    ]
    url = shared_cluster[0]
    try:
        httpx.post(f"{url}/db/execute?transaction", json=old_schema, timeout=10).raise_for_status()

        async def open_two_at_once_then_close():
            both = await asyncio.gather(
                *(AsyncRqliteTransport.from_url(shared_cluster, prefix=prefix) for _ in range(2))
            )
            for transport in both:
                await transport.close()

        asyncio.run(open_two_at_once_then_close())
        transport = RqliteTransport.from_url(shared_cluster, prefix=prefix)
        lease = transport.claim("w", 5.0)
        transport.close()
        assert (lease.group_id, lease.event) == ("g", "old")
    finally:
        _drop(url, prefix)


@pytest.mark.parametrize("routing_keys", [None, ("blue",)])
def test_the_claim_reads_only_free_groups_on_the_cluster_sqlite(queue, shared_cluster, routing_keys):  # noqa: F811
    """The plan of the claim's head query by the SQLite inside rqlite (rqlite answers EXPLAIN
    only for reads; the claim's write around it is the SQL that test_sqlite.py checks): both
    candidates are read on the claim-order index, FREE groups in order, the lapsed ones by
    range, and no table is scanned."""
    transport, _ = queue
    t = transport._core.tables
    keys = None if routing_keys is None else len(routing_keys)
    # A real read first: EXPLAIN does not check the schema's version, and rqlite's read
    # connection may still hold the schema it read while the tables were being created.
    reads = [[f"SELECT count(*) FROM {t.groups}"],
             [f"EXPLAIN QUERY PLAN {head_query(t, keys)}", *head_params(1.0, 0, routing_keys)]]
    answer = httpx.post(f"{shared_cluster[0]}/db/query?level=strong", json=reads, timeout=10).json()
    plan = [row[3] for row in answer["results"][1]["values"]]
    index = "claim_order" if routing_keys is None else "claim_order_by_routing_key"
    groups_lines = [line for line in plan if " g " in f"{line} "]
    assert len(groups_lines) == 2 and all(f"USING INDEX {t.groups}_{index} (" in line for line in groups_lines), plan
    assert "claimable_at=?)" in groups_lines[0] and "claimable_at>? AND claimable_at<?)" in groups_lines[1], plan
    tables = [line for line in plan if line.startswith(("SCAN", "SEARCH")) and not line.startswith("SCAN (subquery")]
    assert all(line.startswith("SEARCH") for line in tables), plan


@pytest.mark.parametrize("old_tables", [v4_with_data, v5_with_data, lambda prefix: v5_with_data(prefix, first_release=True)],
                         ids=["version 4", "version 5", "version 5, first release"])
def test_upgrade_keeps_every_message_and_every_lease(shared_cluster, old_tables):  # noqa: F811
    """The tables of harel-ref's schema versions 4 and 5, with heads leased, parked, lapsed and
    free, upgraded in place through the cluster (each group takes its head's lease), then an
    open of the current tables: two reads."""
    prefix, url = _prefix(), shared_cluster[0]
    _, groups, _ = names(prefix)
    try:
        old = [[statement] for statement in old_tables(prefix)]
        httpx.post(f"{url}/db/execute?transaction", json=old, timeout=10).raise_for_status()
        clock = FakeClock(NOW)
        with RqliteTransport.from_url(shared_cluster, clock=clock, prefix=prefix) as transport:
            stored = httpx.post(f"{url}/db/query?level=strong",
                                json=[[f"SELECT group_id, claimable_at, locked_by, lock_expiry FROM {groups}"]],
                                timeout=10).json()["results"][0]["values"]
            assert {group: until for group, until, _, _ in stored} == EXPECTED_CLAIMABLE_AT
            assert {group: (holder, end) for group, _, holder, end in stored} == EXPECTED_LEASES
            check_upgraded(transport, clock)
        with httpx.Client() as client:
            counter = Counter(client)
            RqliteTransport.from_url(shared_cluster, prefix=prefix, client=client).close()
        assert counter.sent == 1 + 2  # readiness, then the schema version: nothing to create
    finally:
        _drop(url, prefix)


# --- Concurrent callers: the concurrent search, each branch through its own node ------------


@pytest.mark.parametrize("make", [rqlite, rqlite_async], ids=["sync", "async"])
def test_the_concurrent_searches_pass_with_branches_through_different_nodes(make, shared_cluster):  # noqa: F811
    from harel_ref.certify import Profile, certify

    backend = make()
    first_nodes = []

    def factory(clock, namespace):
        opened = backend.factory(clock, namespace)
        if backend.is_async:
            async def remember():
                transport = await opened
                first_nodes.append(transport._core.nodes.urls[0])
                return transport
            return remember()
        first_nodes.append(opened._core.nodes.urls[0])
        return opened

    profile = Profile("rqlite", max_examples=5, step_count=10, programs=6, repeats=4)
    concurrent = ["single-in-flight", "fencing", "no-loss", "contention"]
    report = certify(factory, backend.capabilities, profile=profile, properties=concurrent,
                     is_async=backend.is_async)
    assert {v.property: v.verdict for v in report.verdicts} == dict.fromkeys(concurrent, "passed"), report.to_markdown()
    assert len(set(first_nodes)) == len(shared_cluster) >= 3  # every node served some branch


def test_with_and_async_with_close_the_transports(shared_cluster):  # noqa: F811
    prefix = _prefix()
    try:
        with RqliteTransport.from_url(shared_cluster, prefix=prefix) as transport:
            transport.publish("g1", "e")
        with pytest.raises(TransportClosedError):
            transport.publish("g1", "e")

        async def scenario():
            async with await AsyncRqliteTransport.from_url(shared_cluster, prefix=prefix) as queue:
                assert (await queue.claim("w1", 5.0)).event == "e"
            with pytest.raises(TransportClosedError):
                await queue.publish("g1", "e")

        asyncio.run(scenario())
    finally:
        _drop(shared_cluster[0], prefix)


@pytest.mark.parametrize("make", [rqlite, rqlite_async], ids=["sync", "async"])
def test_discard_drops_the_namespace_tables_and_only_those(make, shared_cluster):  # noqa: F811
    """The certifier calls ``factory.discard(namespace)`` after each lockstep example, so that
    the cluster's schema does not grow by a namespace per example (SPEC.md C3)."""
    backend = make()
    kept, discarded = f"ns_{uuid.uuid4().hex[:12]}", f"ns_{uuid.uuid4().hex[:12]}"

    def tables(prefix: str) -> set[str]:
        answer = httpx.get(f"{shared_cluster[0]}/db/query", params={
            "level": "strong", "q": f"SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '{prefix}%'"})
        return {row[0] for row in answer.json()["results"][0].get("values", [])}

    async def open_and_close(namespace: str) -> None:
        await (await backend.factory(FakeClock(), namespace)).close()

    for namespace in (kept, discarded):
        if backend.is_async:
            asyncio.run(open_and_close(namespace))
        else:
            backend.factory(FakeClock(), namespace).close()
    assert len(tables(kept)) == len(tables(discarded)) == 3
    backend.factory.discard(discarded)
    assert tables(discarded) == set() and len(tables(kept)) == 3
    backend.factory.discard(discarded)  # again: nothing to drop, nothing raised
    backend.factory.discard(f"ns_{uuid.uuid4().hex[:12]}")  # never opened here: not touched
    assert len(tables(kept)) == 3


def test_a_machine_test_runs_again_once_after_an_election_and_only_then():
    """rerun_after_an_election: a call cut off by an election (inside Hypothesis's exception
    group, as the machine raises it) runs the test once more; any other error, or a second
    election, fails it."""
    from hypothesis.errors import FlakyFailure

    from harel_ref.transport import OutcomeUnknownError

    election = OutcomeUnknownError("ack at http://127.0.0.1:4001: rqlite error: (HTTP 200, error: node failed "
                                   "to process Execute on remote node at rqlite2:4002: leadership lost while "
                                   "committing log); the request may or may not have been applied")

    def case_raising(*errors):
        class Case:
            runs = 0

            def runTest(self):  # noqa: N802
                Case.runs += 1
                if Case.runs <= len(errors):
                    raise errors[Case.runs - 1]

        return rerun_after_an_election(Case)

    once = case_raising(FlakyFailure("flaky", [election]))
    with pytest.warns(UserWarning, match="run again from its start after an election"):
        once().runTest()
    assert once.runs == 2
    twice = case_raising(election, election)
    with pytest.warns(UserWarning), pytest.raises(OutcomeUnknownError):
        twice().runTest()
    other = case_raising(OutcomeUnknownError("ack at http://x: timed out after 5 s"))
    with pytest.raises(OutcomeUnknownError):
        other().runTest()
    assert other.runs == 1
