"""harel 0.9.0's SQS transports, unchanged, certified by ``--bundled harel-sqs`` and
``harel-sqs-async`` on a real ElasticMQ the kit starts itself (SPEC.md R15, SQS).

SQS keeps leases in whole seconds on its own clock and takes ids of printable ASCII: the
transports declare that (``resolution=1``, ``group_ids``), and the checkers give them only
whole seconds and such ids, on the wall clock.  Each remaining failure is replayed here on
the real server:

- a stale receipt handle raises ``ReceiptHandleIsInvalid`` instead of answering (fencing);
- ``int(visibility)`` turns a lease of 0.999 s into none at all (lease-expiry, when a caller
  asks for less than a second, as harel's worker may);
- an event whose text holds U+FFFE cannot be published: the body is the Event's JSON as it is,
  and SQS refuses that character in a body (no-loss: a publish that raises).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facts_support import property_of, blamed
from harel_ref.certify import Profile, certify, focus_machine
from harel_ref.certify._target import Target
from harel_ref.stateful import Divergence
from server_support import close_machine, require_server, stale_after_a_reclaim

pytest.importorskip("harel", reason="the harel extra is not installed: pip install 'harel-ref[harel]'")
pytest.importorskip("boto3", reason="the sqs extra is not installed: pip install 'harel-ref[sqs]'")
pytest.importorskip("aiobotocore", reason="the sqs extra is not installed: pip install 'harel-ref[sqs]'")
require_server("HAREL_SQS_URL", "java", "default-jre-headless")
require_server("HAREL_SQS_URL", "mvn", "maven")

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["harel-sqs", "harel-sqs-async"]


@pytest.mark.parametrize("name", NAMES)
def test_harels_sqs_transports_open_on_the_kits_elasticmq_as_declared(name, tmp_path):
    """Each class opens, and round-trips messages in order, through the certifier's factory."""
    target = Target.from_bundled(name, tmp_path)
    caps = target.capabilities
    assert (caps.protocol, caps.acks, caps.clock, caps.resolution, caps.priority) == (
        "harel", "until-reclaimed", "wall", 1.0, False)
    assert caps.accepts_group_id("g-4.~") and not caps.accepts_group_id("grüppe-✓")
    machine = focus_machine(target.factory, "fifo", caps, is_async=target.is_async)()
    machine.prefill(messages=[("g1", "a", 0, None), ("g1", "b", 0, None), ("g2", "c", 0, None)])
    lease = machine.claim_any(via=0, visibility=3.0, worker="w1")
    machine.ack(lease=lease, via=0)
    machine.teardown()  # drains the rest in order, or raises Divergence


@pytest.mark.parametrize("name", NAMES)
def test_a_stale_receipt_handle_raises_and_that_is_fencings(name, tmp_path):
    """As the fencing search shrank it: a lease lapses, the message is claimed again, and the
    old lease's nack raises instead of doing nothing (R10)."""
    target = Target.from_bundled(name, tmp_path)
    machine = focus_machine(target.factory, "fencing", target.capabilities, is_async=target.is_async)()
    try:
        stale = stale_after_a_reclaim(machine)
        with pytest.raises(Divergence) as caught:
            machine.nack_later(delay=1.0, lease=stale, via=0)
        assert property_of(caught.value) == "fencing" and property_of(caught.value) == "fencing"
        assert "ReceiptHandleIsInvalid" in repr(caught.value.__cause__)
    finally:
        close_machine(machine)


@pytest.mark.parametrize("name", NAMES)
def test_a_park_keeps_the_receipt_handle_as_sqs_does_and_as_declared(name, tmp_path):
    """The lease that parked its message still deletes it: SQS's receipt handle stays good
    until the message is received again (R10a, ``acks="until-reclaimed"``), and the model
    follows.  Judged fenced (R10), the same steps fail: the drain finds the message gone."""
    from harel_ref.stateful._properties import SHARED

    target = Target.from_bundled(name, tmp_path)
    for acks in ("until-reclaimed", "fenced"):
        caps = dataclasses.replace(target.capabilities, acks=acks)
        machine = focus_machine(target.factory, SHARED, caps, is_async=target.is_async)()
        machine.prefill(messages=[("g1", "", 0, None)])
        lease = machine.claim_any(via=0, visibility=3.0, worker="w1")
        machine.nack_later(delay=1.0, lease=lease, via=0)
        machine.ack(lease=lease, via=0)  # the nack gave the message up, but the handle is good
        if acks == "until-reclaimed":
            try:
                machine._drain_and_compare()  # the drain finds nothing, as the model has it
            finally:
                close_machine(machine)  # not teardown: its close check fails harel's (the table above)
            continue
        with pytest.raises(Divergence) as failed:
            machine.teardown()
        assert failed.value.answered == "None" and "the head of 'g1'" in failed.value.expected
        assert blamed(failed.value, SHARED) == "fencing"


def test_int_visibility_turns_a_lease_under_a_second_into_none():
    """harel's claim sends ``int(visibility)``: asked for 0.999 s, the lease is 0 s, and the
    message is handed out again at once.  Shown only when the second claim answered within
    0.999 s of the first one's start (it takes milliseconds; a slower try is tried again)."""
    from harel_ref.stateful.backends.harel import harel_sqs

    factory = harel_sqs().factory
    for attempt in range(3):
        transport = factory(time.time, f"ns_int_visibility_{attempt}_{os.getpid()}")
        try:
            transport.publish("g1", _event("only"))
            started = time.time()
            first = transport.claim("w1", 0.999)
            second = transport.claim("w2", 0.999)
            answered = time.time()
            assert first is not None and first.event == _event("only")
            if answered - started < 0.999:
                assert second is not None and second.event == first.event, "the lease of 0.999 s held"
                return
        finally:
            transport.close()
    pytest.fail("three tries each took 0.999 s or more: the machine is too slow to show it")


def test_an_event_holding_a_noncharacter_cannot_be_published():
    """SQS allows in a body only XML's characters; pydantic's JSON escapes the control
    characters but not U+FFFE or U+FFFF, so harel's publish raises for such an event, which
    every other transport carries.  (Escaping the JSON to ASCII would fix it.)"""
    from botocore.exceptions import ClientError

    from harel_ref.stateful.backends.harel import harel_sqs

    transport = harel_sqs().factory(time.time, f"ns_noncharacter_{os.getpid()}")
    try:
        transport.publish("g1", _event("\x00 and \U0010ffff travel"))
        with pytest.raises(ClientError, match="InvalidMessageContents"):
            transport.publish("g1", _event("\ufffe does not"))
        lease = transport.claim("w1", 5.0)
        assert lease.event == _event("\x00 and \U0010ffff travel")
        transport.ack(lease)
        assert transport.claim("w1", 5.0) is None  # nothing else was stored
    finally:
        transport.close()


def _event(text: str):
    from harel_ref.stateful._harel import to_event

    return to_event(text)


@pytest.mark.parametrize("name", NAMES)
def test_harels_sqs_passes_single_in_flight_and_lease_expiry_on_the_wall_clock(name, tmp_path):
    """Searched, in whole seconds, judged in windows (R18): a verdict that does not depend on
    how long the calls take."""
    target = Target.from_bundled(name, tmp_path)
    report = certify(target.factory, profile=Profile("small", max_examples=4, step_count=6, programs=2, repeats=2),
                     properties=["single-in-flight", "lease-expiry"], _target=target)
    assert {v.property: v.verdict for v in report.verdicts} == {
        "single-in-flight": "passed", "lease-expiry": "passed"}, report.to_markdown()


def _left_on_sqs(url: str) -> list[str]:
    from harel_ref.stateful.backends.sqs import client

    sqs = client(url)
    try:
        return sorted(sqs.list_queues().get("QueueUrls", []))
    finally:
        sqs.close()


def test_a_certification_on_the_users_sqs_leaves_no_queue_there(tmp_path):
    """``HAREL_SQS_URL`` names a server of the user's: harel's SQS transports certified there,
    sync and async, with searches in two processes, leave no queue."""
    from harel_ref.testing.servers import SqsServer

    with SqsServer() as server:
        assert _left_on_sqs(server.url) == []
        env = {**os.environ, "HAREL_SQS_URL": server.url}
        for name in NAMES:
            run = subprocess.run(
                [sys.executable, "-m", "harel_ref._cli", "certify", "--bundled", name, "--profile", "quick/8",
                 "--only", "durability", "--jobs", "2", "--time-budget", "10",
                 "--report-dir", str(tmp_path / name), "--quiet"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
            )
            assert run.returncode in (0, 1, 3), run.stdout + run.stderr[-3000:]
            verdicts = json.loads((tmp_path / name / "report.json").read_text())["properties"]
            assert any(verdict["examples"] > 0 for verdict in verdicts)  # queues were made there
            assert _left_on_sqs(server.url) == [], name


def test_the_async_factory_releases_its_client_on_close(tmp_path):
    """The aiobotocore client is entered on the transport's exit stack, as harel's create()
    does: after close() the stack is gone and a call fails."""
    target = Target.from_bundled("harel-sqs-async", tmp_path)

    async def opened_and_closed():
        transport = await target.factory(time.time, "ns_async_close")
        await transport.publish("g1", _event("x"))
        assert transport._stack is not None
        await transport.close()
        assert transport._stack is None
        with pytest.raises(Exception):
            await transport.publish("g1", _event("y"))

    asyncio.run(opened_and_closed())
