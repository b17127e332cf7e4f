"""Shared by the Postgres, Redis and Mongo test modules: is a server there, and the concurrent
properties with branches in processes."""

from __future__ import annotations

import os

import pytest

from harel_ref.certify import certify
from harel_ref.certify._profiles import Profile
from harel_ref.certify._target import Target

CONCURRENT = ["single-in-flight", "fencing", "no-loss", "contention"]
RACING = ["fencing", "contention"]
"""Enough for the concurrent search to judge refusals and every history (a lockstep property
it covers chosen); the lockstep searches of the other two add nothing about processes (on
Postgres they were half of this test's 79 s)."""
SMALL = Profile("small", max_examples=10, step_count=10, programs=12, repeats=12)
RACES = Profile("races", max_examples=10, step_count=10, programs=8, repeats=8)
"""The concurrent searches of a transport that passes, with branches in processes: 64 runs of
programs, not SMALL's 144 (two twins of a server took up to 120 s of the suite's wall time)."""


def require_server(variable: str, binary: str, package: str) -> None:
    """Call at the top of a module: skip it (saying why) when neither ``$variable`` names a
    server nor ``binary`` can start one; in CI, where nothing may be skipped, fail instead."""
    if os.environ.get(variable):
        return
    from harel_ref.testing.servers import ServerUnavailable, _binary

    try:
        _binary(binary, package)
    except ServerUnavailable as exc:
        why = f"{exc}, or set {variable}"
        if os.environ.get("CI"):
            raise RuntimeError(f"these tests cannot run in CI: {why}") from exc
        pytest.skip(why, allow_module_level=True)


def require_mongo(*, motor: bool = True) -> None:
    """Skip the calling test (saying why) when the Mongo server cannot start here, or PyMongo
    (and Motor, for harel's async transport) is missing; in CI, fail."""
    for module in ("pymongo", "motor") if motor else ("pymongo",):
        pytest.importorskip(module, reason="the mongo extra is not installed: pip install 'harel-ref[mongo]'")
    require_server("HAREL_MONGO_URL", "java", "default-jre-headless")
    require_server("HAREL_MONGO_URL", "mvn", "maven")


def assert_concurrent_properties_pass_in_processes(names: list[str], directory, profile: Profile = RACES) -> None:
    """The concurrent searches of each bundled transport in ``names``, with the branches of
    every program in separate processes racing on one server: no call refused, every history
    linearizable."""
    for name in names:
        target = Target.from_bundled(name, directory, None)
        report = certify(target.factory, profile=profile, properties=RACING, processes=True, _target=target)
        assert {v.property: v.verdict for v in report.verdicts} == dict.fromkeys(RACING, "passed"), report.to_markdown()
        assert "no call refused, every history linearizable" in report.verdict("contention").reason
        assert report.branches == "processes"


def stale_after_a_reclaim(machine) -> object:
    """On a wall clock in whole seconds: a lease of 1 s on ``g1``'s only message lapses (a
    sleep of 2 s, a lower bound: it has surely lapsed on the server) and another worker claims
    the message.  Returns the first lease, now stale."""
    machine.prefill(messages=[("g1", "", 0, None)])
    stale = machine.claim_any(via=0, visibility=1.0, worker="w1")
    machine.advance(seconds=2.0)
    machine.claim_any(via=0, visibility=3.0, worker="w2")
    return stale


def close_machine(machine) -> None:
    """Close a machine's transports (and its event loop) without its teardown's checks."""
    for transport in machine.instances:
        transport.close()
    if machine.loop is not None:
        machine.loop.close()
