"""Every bad input of SPEC.md R13, sent to every bundled reference transport, one by one.

The lockstep machine sends these cases too (rules ``bad_input`` and ``bad_release``, from its
tables ``BAD_CALLS`` and ``BAD_RELEASES``), but a search picks some of them.  Here each
transport gets all of them, in one queue that holds messages and a live lease: each call must
raise the error SPEC.md R13 names, and afterwards the lease still acks and every message comes
out.  The number of
distinct bad inputs per transport goes into the test's ``counts`` (printed at the end of the
run by conftest.py).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from harel_ref.stateful._async import open_transport
from harel_ref.stateful._machine import BAD_CALLS, BAD_RELEASES, FakeClock
from harel_ref.stateful.backends import load

LOCAL = ["memory", "memory-async", "sqlite", "sqlite-async", "libsql", "libsql-async"]
NETWORKED = ["rqlite", "rqlite-async"]
CALLS = [(case, *BAD_CALLS[case]) for case in BAD_CALLS] + [(case, *BAD_RELEASES[case]) for case in BAD_RELEASES]


def refuse_every_bad_input(name: str, tmp_path) -> list[str]:
    """Send every case to a fresh queue of the bundled transport ``name``; return what went
    wrong (empty when every case was refused as R13 says and nothing changed)."""
    backend = load(name)(tmp_path)
    clock = FakeClock()
    loop = asyncio.new_event_loop() if backend.is_async else None
    transport = open_transport(backend.factory, clock, f"ns_{uuid.uuid4().hex[:12]}", loop, "harel-ref")
    wrong = []
    try:
        published = [("g1", "a"), ("g1", "b"), ("g2", "c")]
        for group, event in published:
            transport.publish(group, event)
        lease = transport.claim("w1", 60.0)
        for case, error, call in CALLS:
            try:
                answer = call(transport, lease, clock)
            except error:
                continue
            except Exception as exc:
                wrong.append(f"{case}: raised {type(exc).__name__}: {exc}, expected {error.__name__}")
            else:
                wrong.append(f"{case}: answered {answer!r}, expected {error.__name__}")
        if transport.ack(lease) is not True:
            wrong.append(f"the lease {lease} no longer acks after the bad inputs")
        clock.now += 120.0
        drained = []
        while (next_lease := transport.claim("drain", 60.0)) is not None:
            drained.append((next_lease.group_id, next_lease.event))
            transport.ack(next_lease)
        expected = [m for m in published if (m[0], m[1]) != (lease.group_id, lease.event)]
        if sorted(drained) != sorted(expected):
            wrong.append(f"after the bad inputs the queue held {drained}, expected {expected}")
    finally:
        transport.close()
        if loop is not None:
            loop.close()
    return wrong


@pytest.mark.parametrize("name", LOCAL)
def test_every_bad_input_is_refused_and_writes_nothing(name, tmp_path, request):
    wrong = refuse_every_bad_input(name, tmp_path)
    request.node.user_properties.append(("counts", f"bad inputs refused by {name}: {len(CALLS) - len(wrong)} of {len(CALLS)}"))
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", NETWORKED)
def test_every_bad_input_is_refused_by_rqlite(name, tmp_path, request):
    from rqlite_support import cluster_lock, require_cluster
    from harel_ref.stateful.backends.rqlite import drop_opened_tables

    with cluster_lock(exclusive=False):
        require_cluster()
        try:
            wrong = refuse_every_bad_input(name, tmp_path)
        finally:
            drop_opened_tables()
    request.node.user_properties.append(("counts", f"bad inputs refused by {name}: {len(CALLS) - len(wrong)} of {len(CALLS)}"))
    assert not wrong, "\n".join(wrong)


def test_there_are_forty_distinct_bad_inputs_at_least():
    """Issue 12 asks for 40 or more per backend; each case is a distinct call."""
    assert len({case for case, _, _ in CALLS}) == len(CALLS) >= 40


OPEN_CASES = {
    "prefix 'sqlite' (SQLite reserves sqlite_ names)": (ValueError, dict(prefix="sqlite")),
    "prefix 'SQLite_x'": (ValueError, dict(prefix="SQLite_x")),
    "prefix '1a'": (ValueError, dict(prefix="1a")),
    "prefix 'a-b'": (ValueError, dict(prefix="a-b")),
    "prefix 5": (TypeError, dict(prefix=5)),
    "clock 5 (not callable)": (TypeError, dict(clock=5)),
    "busy_timeout -1": (ValueError, dict(busy_timeout=-1)),
    "busy_timeout '5'": (TypeError, dict(busy_timeout="5")),
    "synchronous 'OFF' (an OS crash could corrupt the file)": (ValueError, dict(synchronous="OFF")),
    "synchronous 'fast'": (ValueError, dict(synchronous="fast")),
    "synchronous 1": (TypeError, dict(synchronous=1)),
}


@pytest.mark.parametrize("kind", ["SqliteTransport", "LibsqlTransport"])
def test_bad_options_are_refused_at_open_and_lose_nothing(kind, tmp_path, request):
    """Opening an existing queue with a bad option raises a clear error, and the queue is
    untouched: the next good open finds its message."""
    import harel_ref.transport as transports

    transport_class = getattr(transports, kind)
    path = tmp_path / "queue.db"
    with transport_class(path) as queue:
        queue.publish("g1", "kept")
    wrong = []
    for case, (error, options) in OPEN_CASES.items():
        try:
            transport_class(path, **options).close()
        except error as exc:
            if not str(exc):
                wrong.append(f"{case}: {error.__name__} without a message")
        except Exception as exc:
            wrong.append(f"{case}: raised {type(exc).__name__}: {exc}, expected {error.__name__}")
        else:
            wrong.append(f"{case}: opened, expected {error.__name__}")
    with transport_class(path) as queue:
        lease = queue.claim("w1", 1.0)
        assert (lease.group_id, lease.event) == ("g1", "kept")
    request.node.user_properties.append(("counts", f"bad options refused by {kind}: {len(OPEN_CASES) - len(wrong)} of {len(OPEN_CASES)}"))
    assert not wrong, "\n".join(wrong)


def test_memory_refuses_a_clock_that_cannot_be_called():
    from harel_ref.transport import InMemoryTransport

    with pytest.raises(TypeError, match="clock must be a function"):
        InMemoryTransport(clock=5)
