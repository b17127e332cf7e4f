"""What is particular to LibsqlTransport: libsql's quirks, threads, the async wrapper.

The schema, upgrade, query plan and storage-error tests run against libsql too, in
test_sqlite.py (they are parametrized over both drivers).
"""

import asyncio
import threading

import libsql
import pytest

from harel_ref.transport import AsyncLibsqlTransport, LibsqlTransport, StorageError, TransportClosedError


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_libsql_cuts_text_at_nul_so_the_transport_reads_blobs(tmp_path):
    # The quirk itself, so that we notice the day libsql fixes it ...
    conn = libsql.connect(str(tmp_path / "raw.db"), isolation_level=None)
    conn.execute("CREATE TABLE t (s TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", ("a\x00b",))
    assert conn.execute("SELECT s FROM t").fetchall() == [("a",)]
    assert conn.execute("SELECT CAST(s AS BLOB) FROM t").fetchall() == [(b"a\x00b",)]
    conn.close()
    # ... and that the transport is not affected by it.
    queue = LibsqlTransport(tmp_path / "q.db")
    queue.publish("g\x00h", "a\x00b")
    lease = queue.claim("w", 10)
    assert (lease.group_id, lease.event) == ("g\x00h", "a\x00b")
    assert queue.ack(lease)
    queue.close()


def test_floats_round_trip_exactly(tmp_path):
    # Lease deadlines are compared in SQL, so now + visibility must come back unchanged.
    for now in (0.1, 1712345678.123456789, 2.0**-10 * 3, 1e15 + 0.5):
        clock = Clock(now)
        queue = LibsqlTransport(tmp_path / "q.db", clock=clock)
        queue.publish("g", "e")
        lease = queue.claim("w", 0.25)
        clock.now = now + 0.25
        assert queue.claim("w", 1) is None  # still live at exactly t + v
        clock.now = (now + 0.25) + 2.0**-20 * max(1.0, now)
        assert queue.claim("w", 1).seq == lease.seq  # lapsed just after
        conn = libsql.connect(str(tmp_path / "q.db"), isolation_level=None)
        conn.execute("DELETE FROM harel_transport_messages")
        conn.execute("DELETE FROM harel_transport_groups")
        conn.close()
        queue.close()


def test_begin_immediate_excludes_another_libsql_connection(tmp_path):
    queue = LibsqlTransport(tmp_path / "q.db", busy_timeout=0.05)
    other = libsql.connect(str(tmp_path / "q.db"), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    assert other.in_transaction
    with pytest.raises(StorageError, match="locked"):
        queue.claim("w", 1)
    other.execute("COMMIT")
    other.close()
    assert queue.claim("w", 1) is None
    queue.close()


def test_a_lock_held_by_another_thread_is_waited_for_without_stalling_that_thread(tmp_path):
    """libsql's own busy handler holds the GIL while it waits, so the thread holding the lock
    could not reach its COMMIT and both stalled for the whole busy_timeout (found by the
    concurrent search).  The transport waits in Python instead: the holder finishes at once."""
    import time

    queue = LibsqlTransport(tmp_path / "q.db", busy_timeout=5.0)
    holder = libsql.connect(str(tmp_path / "q.db"), isolation_level=None, _check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    committed = []

    def hold_then_commit():
        time.sleep(0.3)  # needs the GIL back to wake up and commit
        holder.execute("COMMIT")
        committed.append(time.monotonic() - started)

    thread = threading.Thread(target=hold_then_commit)
    thread.start()
    queue.publish("g", "e")  # waits for the holder's lock
    waited = time.monotonic() - started
    thread.join()
    holder.close()
    assert committed[0] < 2.0 and waited < 2.0, (committed, waited)  # not the 5 s busy_timeout
    assert queue.claim("w", 1).event == "e"
    queue.close()


def test_two_threads_racing_for_one_group_never_both_win(tmp_path):
    path = tmp_path / "q.db"
    publisher = LibsqlTransport(path)
    racers = [LibsqlTransport(path, busy_timeout=10) for _ in range(2)]
    # Timeouts, and abort() on the way out, so a failure cannot leave threads waiting forever.
    start, done = threading.Barrier(3, timeout=30), threading.Barrier(3, timeout=30)
    won = [[], []]

    def race(i):
        for _ in range(100):
            start.wait()
            won[i].append(racers[i].claim(f"w{i}", 60))
            done.wait()

    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(100):
            publisher.publish("g", "only one of you")
            start.wait()
            done.wait()
            winners = [w[-1] for w in won if w[-1] is not None]
            assert len(winners) == 1, winners
            assert publisher.ack(winners[0])
    except BaseException:
        start.abort()  # release the racers, or they would wait for the next round forever
        done.abort()
        raise
    for thread in threads:
        thread.join(timeout=30)
    for transport in (publisher, *racers):
        transport.close()


def test_one_transport_shared_by_threads(tmp_path):
    queue = LibsqlTransport(tmp_path / "q.db")
    for i in range(200):
        queue.publish(f"g{i % 10}", f"e{i}")
    acked = []

    def work(name):
        while (lease := queue.claim(name, 60)) is not None:
            assert queue.ack(lease)
            acked.append(lease.event)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(acked) == sorted(f"e{i}" for i in range(200))
    queue.close()


def test_async_libsql_transport(tmp_path):
    async def scenario():
        clock = Clock()
        queue = await AsyncLibsqlTransport.create(tmp_path / "q.db", clock=clock, prefix="a")
        await asyncio.gather(*(queue.publish(f"g{i % 3}", f"e{i}") for i in range(12)))
        leases = await asyncio.gather(*(queue.claim("w", 5) for _ in range(4)))
        assert sorted(lease.group_id for lease in leases if lease) == ["g0", "g1", "g2"]
        assert all(await asyncio.gather(*(queue.ack(lease) for lease in leases if lease)))
        with pytest.raises(ValueError, match="visibility"):
            await queue.claim("w", 0)
        await queue.close()
        await queue.close()
        with pytest.raises(TransportClosedError):
            await queue.claim("w", 5)
        with pytest.raises(ValueError, match="prefix"):
            await AsyncLibsqlTransport.create(tmp_path / "q.db", prefix="no-dashes")

    asyncio.run(scenario())


def test_embedded_replica_arguments_are_passed_through(tmp_path):
    # EXPERIMENTAL: no primary here.  An unreachable sync_url must fail as StorageError
    # (naming the path), not as a panic or a hang.
    with pytest.raises(StorageError) as caught:
        LibsqlTransport(tmp_path / "replica.db", sync_url="http://127.0.0.1:9", auth_token="x")
    assert "replica.db" in str(caught.value)
