"""Faults on the live rqlite cluster: the leader is killed while a client works.

These tests break the shared cluster, so each one holds the cluster lock *exclusively* (see
rqlite_support.py): it starts once the other rqlite tests of every xdist worker are done, and
they wait until the cluster is healed.  Each test heals the cluster in ``finally``.
"""

from __future__ import annotations

import collections
import time
import uuid

import pytest
import requests
from rqlite_support import cluster_lock, require_cluster

from harel_ref.transport import OutcomeUnknownError, RqliteTransport, StorageError

pytestmark = pytest.mark.slow


class ShiftedClock:
    """Wall time plus an offset the test can move forward, to let every lease lapse at once."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def cluster():
    """Exclusive use of the cluster, healed and ready again afterwards."""
    with cluster_lock(exclusive=True):
        require_cluster()
        from harel_ref.testing.cluster import Cluster

        handle = Cluster()
        handle.wait_ready()
        try:
            yield handle
        finally:
            handle.heal()
            handle.wait_ready()


def test_nothing_published_is_lost_when_the_leader_is_killed(cluster):
    """Publish, claim and ack without pause while the leader dies and a new one is elected.

    Afterwards every message whose publish returned normally is either acked (ack returned
    True) exactly once or still in the queue at the final drain; a message whose ack had an
    unknown outcome may be either.  Nothing comes out that was never published, and nothing
    acked comes back.
    """
    prefix = f"fault_{uuid.uuid4().hex[:12]}"
    clock = ShiftedClock()
    transport = RqliteTransport.from_url(cluster.urls(), clock=clock, prefix=prefix, timeout=3)
    published, maybe_published = [], set()
    acked = collections.Counter()
    ack_unknown = set()
    errors = collections.Counter()
    killed = None
    healthy_rounds = 0  # rounds without an error since the kill disturbed the client
    give_up = None

    def attempt(call, *args):
        try:
            return call(*args), None
        except (StorageError, OutcomeUnknownError) as exc:
            errors[f"{call.__name__}: {type(exc).__name__}"] += 1
            time.sleep(0.05)  # the cluster is electing: do not spin
            return None, exc

    try:
        for i in range(100_000):
            errors_before = errors.total()
            for event in (f"m{i}a", f"m{i}b"):  # two in, at most one out: a backlog builds
                _, error = attempt(transport.publish, f"g{i % 7}", event)
                if error is None:
                    published.append(event)
                elif isinstance(error, OutcomeUnknownError):
                    maybe_published.add(event)
            lease, _ = attempt(transport.claim, "worker", 2.0)
            if lease is not None:
                done, error = attempt(transport.ack, lease)
                if done:
                    acked[lease.event] += 1
                elif isinstance(error, OutcomeUnknownError):
                    ack_unknown.add(lease.event)
            if i == 40:
                killed = cluster.leader()
                cluster.kill(killed)
                give_up = time.monotonic() + 120  # a bound on the loop, not an assertion
            elif killed is not None:
                disturbed = errors.total() > 0
                healthy_rounds = healthy_rounds + 1 if disturbed and errors.total() == errors_before else 0
                if healthy_rounds >= 40 or time.monotonic() > give_up:
                    break
        new_leader = cluster.wait_for_leader()
        assert new_leader != killed

        clock.offset += 3600.0  # every lease taken so far has lapsed
        drained = collections.Counter()
        while (lease := transport.claim("drain", 60.0)) is not None:
            drained[lease.event] += 1
            assert transport.ack(lease) is True
    finally:
        transport.close()

    print(
        f"\nkilled {killed}, new leader {new_leader}; published {len(published)} "
        f"(+{len(maybe_published)} unknown), acked {sum(acked.values())}, drained "
        f"{sum(drained.values())}, ack outcome unknown {len(ack_unknown)}; errors {dict(errors)}"
    )
    assert errors.total() > 0, "the kill should have disturbed some requests"
    assert not [e for e, n in acked.items() if n > 1], "acked twice"
    assert not [e for e, n in drained.items() if n > 1], "drained twice"
    assert not (set(drained) & set(acked)), "a message came back after its ack returned True"
    unexpected = set(drained) | set(acked)
    unexpected -= set(published) | maybe_published
    assert not unexpected, f"messages nobody published: {sorted(unexpected)[:10]}"
    lost = [e for e in published if e not in acked and e not in drained and e not in ack_unknown]
    assert not lost, f"lost: {lost[:10]}"
    _drop(cluster.url(new_leader), prefix)


def _drop(url: str, prefix: str) -> None:
    names = ("messages", "groups", "meta")
    statements = [[f"DROP TABLE IF EXISTS {prefix}_harel_transport_{name}"] for name in names]
    requests.post(f"{url}/db/execute?transaction", json=statements, timeout=10)
