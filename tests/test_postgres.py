"""PostgresTransport and its async twin on a real Postgres server.

The server is this xdist worker's throwaway one (``harel_ref.stateful.backends.postgres``: Debian's
binaries, started on first use, deleted at exit), or the one ``HAREL_POSTGRES_URL`` names.
Each Hypothesis example gets its own table prefix.

- the lockstep machine, sync and async, with fairness stamped on ack (SPEC R5);
- broken variants of that policy (stamping on claim, never stamping), caught as ``fairness``;
- the concurrent properties with branches in processes racing for claims;
- the in-place upgrade of harel 0.9's tables, written by harel's own PostgresTransport;
- errors: a bad prefix, a server that is down, a connection lost mid-call (R17).
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from facts_support import property_of
from twin_support import twin_settings
from harel_ref.certify import focus_machine
from harel_ref.transport import (
    AsyncPostgresTransport,
    OutcomeUnknownError,
    PostgresTransport,
    StorageError,
)
from harel_ref.transport.postgres import PgNames, _functions
from server_support import assert_concurrent_properties_pass_in_processes, require_server
from harel_ref.stateful import Divergence, make_machine
from harel_ref.stateful.backends.postgres import CAPABILITIES, postgres, postgres_async, prefix_for, server_url

pytest.importorskip("psycopg", reason="the postgres extra is not installed: pip install 'harel-ref[postgres]'")
require_server("HAREL_POSTGRES_URL", "initdb", "postgresql")

TestPostgresMachine = make_machine(postgres()).TestCase
TestAsyncPostgresMachine = make_machine(postgres_async()).TestCase
TestAsyncPostgresMachine.settings = twin_settings(TestAsyncPostgresMachine.settings)


# --- broken variants of the ack-stamped fairness policy -------------------------------------


def _with_functions(transport: PostgresTransport, edit) -> PostgresTransport:
    """Replace the transport's server-side functions with ``edit(name, sql)`` of each."""
    names = transport._names
    with transport._lock:
        conn = transport._connection()
        for sql in _functions(names):
            conn.execute(edit(names, sql))
    return transport


def _never_stamps(names: PgNames, sql: str) -> str:
    return sql.replace(", last_claimed_at = p_now", "")


def _stamps_on_claim(names: PgNames, sql: str) -> str:
    sql = _never_stamps(names, sql)
    return sql.replace("lock_expiry = p_until, leased_seq = head", "lock_expiry = p_until, leased_seq = head, last_claimed_at = p_now")


@pytest.mark.parametrize("edit", [_never_stamps, _stamps_on_claim], ids=["never-stamps", "stamps-on-claim"])
def test_broken_fairness_policies_fail_fairness(edit):
    def factory(clock, namespace):
        return _with_functions(PostgresTransport(server_url(), clock=clock, prefix=prefix_for(namespace)), edit)

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


def test_the_broken_edits_change_the_functions():
    """The edits above must hit the SQL they aim at, or the variants would be the real thing."""
    names = PgNames.named("x")
    for edit in (_never_stamps, _stamps_on_claim):
        assert [edit(names, sql) for sql in _functions(names)] != _functions(names)
    assert "last_claimed_at = p_now" in _stamps_on_claim(names, _functions(names)[1])


# --- processes racing for claims ------------------------------------------------------------


@pytest.mark.waits
def test_concurrent_properties_pass_with_branches_in_processes(tmp_path):
    assert_concurrent_properties_pass_in_processes(["postgres", "postgres-async"], tmp_path)


# --- upgrade from harel 0.9's layout --------------------------------------------------------


def test_harels_tables_are_upgraded_in_place_with_their_data():
    harel_postgres = pytest.importorskip("harel.engine.transport.postgres", reason="harel is not installed")
    import psycopg

    from harel_ref.stateful._harel import to_event

    prefix = f"up{os.getpid()}"  # short: harel allows 30 characters in its own prefix
    harel_prefix = f"{prefix}_harel"  # harel names its tables <prefix>_transport_..., ours <prefix>_harel_transport_...
    now = 1_000.0
    conn = psycopg.connect(server_url())
    harel = harel_postgres.PostgresTransport(conn, clock=lambda: now, prefix=harel_prefix)
    events = {}
    for group in ("a-free", "b-leased", "c-never-claimed"):
        for index in range(2):
            event = to_event(f"{group}-{index}")
            events[(group, index)] = event.model_dump_json()
            harel.publish(group, event)
    # harel claims in order of COALESCE(lock_expiry, 0), then group_id; its ack stamps
    # lock_expiry = now.  "a-free" is claimed and acked (stamped 1000), "b-leased" stays held.
    first = harel.claim("w", 60)
    assert first.group_id == "a-free"
    harel.ack(first)
    held = harel.claim("w", 600)
    assert held.group_id == "b-leased"
    conn.close()

    queue = PostgresTransport(server_url(), clock=lambda: now + 1, prefix=prefix)
    try:
        # Ours claims by last_claimed_at, then arrival: "c-never-claimed" (0) first, then
        # "a-free" (1000, harel's stamp) before "c-never-claimed" again (stamped 1001 by our
        # ack); "b-leased" stays blocked under harel's lease, whose token still acks.
        got = []
        while (claimed := queue.claim("w", 60)) is not None:
            got.append((claimed.group_id, claimed.event))
            assert queue.ack(claimed)
        assert got == [
            ("c-never-claimed", events[("c-never-claimed", 0)]),
            ("a-free", events[("a-free", 1)]),
            ("c-never-claimed", events[("c-never-claimed", 1)]),
        ]
        from harel_ref.transport import Lease

        assert queue.ack(Lease("b-leased", held.event.model_dump_json(), held.seq, held.token))
        last = queue.claim("w", 60)
        assert (last.group_id, last.event) == ("b-leased", events[("b-leased", 1)])
        assert queue.ack(last) and queue.claim("w", 60) is None
    finally:
        queue.close()
        _drop(prefix, also=[f"{harel_prefix}_claim", f"{harel_prefix}_ack"])  # harel's functions too


def _drop(prefix: str, also: list[str] = ()) -> None:
    """Drop what a test made outside the backend's namespaces (those are dropped at exit)."""
    import psycopg

    names = PgNames.named(prefix)
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {names.messages}, {names.groups}, {names.meta}")
        for function in (names.publish, names.claim, names.ack, *also):
            conn.execute(f"DROP FUNCTION IF EXISTS {function}")


# --- errors ---------------------------------------------------------------------------------


def test_a_prefix_too_long_for_postgres_is_refused_before_connecting():
    with pytest.raises(ValueError, match="too long for Postgres"):
        PostgresTransport("postgresql://nobody@127.0.0.1:1/none", prefix="p" * 30)


def test_a_server_that_is_down_raises_storage_error_naming_it():
    from harel_ref.testing.servers import _free_port

    url = f"postgresql://postgres:secret@127.0.0.1:{_free_port()}/postgres"
    with pytest.raises(StorageError, match="cannot connect to Postgres") as caught:
        PostgresTransport(url, connect_timeout=2)
    assert "secret" not in str(caught.value)


def test_a_connection_lost_mid_call_is_an_unknown_outcome_and_the_next_call_reconnects():
    import psycopg

    prefix = prefix_for("lost-connection")
    queue = PostgresTransport(server_url(), prefix=prefix)
    try:
        queue.publish("g", "e")
        pid = queue._conn.info.backend_pid
        with psycopg.connect(server_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(OutcomeUnknownError, match="may or may not"):
            queue.claim("w", 60)
        lease = queue.claim("w", 60)  # a new connection
        assert lease is not None and lease.event == "e"
    finally:
        queue.close()
        _drop(prefix)


async def _async_lost_connection() -> None:
    import psycopg

    prefix = prefix_for("lost-connection-async")
    queue = await AsyncPostgresTransport.create(server_url(), prefix=prefix, max_connections=1)
    try:
        await queue.publish("g", "e")
        async with queue._pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(server_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        try:
            lease = await queue.claim("w", 60)
        except OutcomeUnknownError:
            lease = await queue.claim("w", 60)  # the pool replaced the connection
        assert lease is not None and lease.event == "e"
    finally:
        await queue.close()
        _drop(prefix)


def test_async_a_lost_connection_is_replaced_by_the_pool():
    import asyncio

    asyncio.run(_async_lost_connection())


# --- a claim never answers None while a group is claimable (R19), whoever holds locks --------


def test_a_claim_that_waited_for_a_lock_does_not_answer_none_while_a_group_is_claimable():
    """Found by review: the claim waited on the lock of the one claimable group it had seen,
    and answered None when that group was gone by the time it got the lock, although another
    group (Z) had become claimable meanwhile and stayed so.  Two calls commit late here (M0, a
    claim; M1, a publish), as a backend descheduled before its commit would."""
    import threading

    import psycopg

    from harel_ref.transport.postgres import claim_statement, publish_statement

    prefix = prefix_for("claim-after-a-wait")
    names = PgNames.named(prefix)
    now = [0.0]
    others = PostgresTransport(server_url(), clock=lambda: now[0], prefix=prefix)
    waiter = PostgresTransport(server_url(), clock=lambda: now[0], prefix=prefix)
    late = [psycopg.connect(server_url()) for _ in range(2)]
    admin = psycopg.connect(server_url(), autocommit=True)
    try:
        others.publish("X0", "x0-1")
        others.publish("Z", "z-1")
        others.publish("Z", "z-2")
        assert others.claim("w0", 1).group_id == "X0"  # lapses at 1
        z_lease = others.claim("wz", 1000)  # live
        others.publish("X", "x-1")
        now[0] = 10.0
        m0, m1 = late
        statement = claim_statement(names, "m0:token", 10.0, 100.0, 0, None)
        assert [bytes(row[1]).decode() for row in m0.execute(statement.sql, statement.params)] == ["X0"]
        statement = publish_statement(names, "X", "x-2", 0, None)
        m1.execute(statement.sql, statement.params)  # holds X's row lock

        answer = {}
        thread = threading.Thread(target=lambda: answer.setdefault("q", waiter.claim("wq", 100)))
        thread.start()
        for _ in range(250):  # until the claim waits for a lock
            waiting = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f"%{names.claim}(%",)).fetchone()[0]
            if waiting:
                break
            time.sleep(0.02)
        assert waiting, "the claim never waited for a lock: the scenario did not happen"
        m1.commit()
        assert others.ack(z_lease)  # Z is claimable from here on
        taken = others.claim("w1", 100)  # X, or Z if the waiting claim took X first
        m0.commit()
        thread.join(10)
        assert not thread.is_alive()
        assert answer["q"] is not None, "answered None while Z was claimable"
        assert {answer["q"].group_id, taken.group_id} == {"X", "Z"}
    finally:
        for conn in (*late, admin):
            conn.close()
        others.close()
        waiter.close()
        _drop(prefix)


# --- a fast shutdown and a restart of the server mid-traffic --------------------------------


def test_a_fast_shutdown_and_restart_mid_traffic_loses_and_duplicates_nothing(request):
    """Workers publish, claim and ack while the server is stopped (``pg_ctl -m fast``: open
    transactions roll back, connections close) and started again on the same data.  Calls
    under way fail with OutcomeUnknownError, calls while it is down with StorageError; the
    history checker then finds no overlap, FIFO break, loss, duplicate or model violation."""
    from harel_ref.testing.servers import PostgresServer
    from restart_traffic import traffic_through_a_restart

    with PostgresServer() as server:
        def restart():
            server.stop(fast=True)
            time.sleep(0.3)
            server.start()

        traffic = traffic_through_a_restart(lambda: PostgresTransport(server.url, prefix="restart"), restart)
    request.node.user_properties.append(("fault_counts", f"postgres fast shutdown: {traffic.summary()}"))
    assert traffic.report.ok, traffic.summary()
    assert traffic.failures, "no call failed: the restart did not happen under traffic"
    assert traffic.calls["ack"] > 20, traffic.summary()
