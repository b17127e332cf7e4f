"""Faults on the live rqlite cluster, under load through all three nodes (issue 12, part 4).

Three client threads work one queue at once, each through its own RqliteTransport whose first
node is a different one of the three: they publish, claim with short leases (0.3 to 2 s of
wall clock) and ack, and each call is recorded (harel_ref.stateful.history: History, RecordingTransport).
While they work, one fault per test:

- ``kill-leader``: SIGKILL the leader; the other two elect a new one; the old one is started
  again and rejoins.
- ``pause-leader``: freeze the leader (cgroup freezer) for 5 s, then thaw it.
- ``partition-follower``: take a follower off the compose network for 4 s, then put it back.
- ``partition-leader``: take the leader off the network, wait until the other two have elected
  a new leader, then put it back.
- ``latency``: every packet every node sends leaves 100 to 300 ms late, for 4 s
  (Cluster.add_latency: ``tc netem`` where the kernel has it, else an NFQUEUE).

Then the cluster is healed, the load goes on for a moment (the cluster serves again), every
lease lapses (the clock the transports and the history share is moved an hour on), a final
drain empties the queue, and the history checker judges it all (``check``): no message whose
publish returned is lost, none acked twice or given out again after an ack that returned True,
no two leases of one group overlap beyond what the lapse windows allow, FIFO per group, and the
whole history linearizable against the model.  A call that raised OutcomeUnknownError (an ack
whose answer was lost, say) may or may not have acted: the checker allows either.  (Publishes of
unknown outcome whose message nobody ever saw are left out before the model's search, which
would otherwise spend up to minutes proving they need not have happened: see ``judge``.)

Each test's counts (faults, operations, lost, duplicated, unknown outcomes...) are printed, put
in ``user_properties`` ``fault_counts`` (a line) and ``fault_counts_json`` of the test's report,
written to ``$HAREL_FAULT_COUNTS/<test>.txt`` (the line, then the JSON) when that variable names
a directory, and repeated in any assertion message.

The judging is not vacuous: the same history, with one acked message's ack struck out, must be
reported lost; with a forged second lease inside a real one, an overlap; and with every ack whose
outcome was unknown counted as acked (a client that assumes its acks worked), a redelivery
wherever such a message came back.

These tests break the shared cluster, so each one holds the cluster lock *exclusively* (see
rqlite_support.py): it starts once the other rqlite tests of every xdist worker are done, and
they wait until the cluster is healed.  Each test heals the cluster in ``finally``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import re
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from rqlite_support import cluster_lock, require_cluster

from harel_ref.transport import OutcomeUnknownError, RqliteTransport, StorageError
from harel_ref.stateful.backends.rqlite import our_tables
from harel_ref.stateful.history import History, Record, RecordingTransport, check, drain
from harel_ref.stateful.soak import UNCERTAIN_STEPS

pytestmark = pytest.mark.slow

WORKERS = 3  # one per node: worker n sends to node n first
GROUPS = 6
VISIBILITIES = (0.3, 1.0, 2.0)  # seconds of wall clock
TIMEOUT = 2.0  # seconds per HTTP request: a frozen or cut-off node costs a worker this much
WARMUP = 1.0  # seconds of load before the fault
RECOVERY = 1.5  # seconds of load once the cluster is healed
LAPSE = 3600.0  # the clock's jump before the drain: longer than any lease
FAULTS = ("kill-leader", "pause-leader", "partition-follower", "partition-leader", "latency")


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
        handle.heal()  # whatever an earlier, interrupted run left behind
        handle.wait_ready()
        try:
            yield handle
        finally:
            handle.heal()
            handle.wait_settled()  # before the rqlite tests waiting for the lock go on


# --- The load -------------------------------------------------------------------------------


class Load:
    """``WORKERS`` threads publishing, claiming and acking through their own transports."""

    def __init__(self, cluster, clock: ShiftedClock, history: History, prefix: str) -> None:
        urls = cluster.urls()
        self.queues = []
        for n in range(WORKERS):
            first = n % len(urls)
            transport = RqliteTransport.from_url(urls[first:] + urls[:first], clock=clock, prefix=prefix,
                                                 timeout=TIMEOUT)
            self.queues.append(RecordingTransport(transport, history, f"w{n}"))
        self.crashes: list[str] = []  # anything but StorageError / OutcomeUnknownError
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(n,), name=f"load-w{n}", daemon=True)
                         for n in range(WORKERS)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=4 * TIMEOUT + 5)
        hung = [thread.name for thread in self._threads if thread.is_alive()]
        for queue in self.queues:
            queue.close()
        assert not hung, f"workers still in a call long after every timeout: {hung}"

    def _work(self, n: int) -> None:
        queue, rng, made = self.queues[n], random.Random(n), 0
        while not self._stop.is_set():
            try:
                # A little more in than out, so a backlog is there for the drain.
                for _ in range(2 if rng.random() < 0.2 else 1):
                    made += 1  # before the call: an event is never published twice, even after an error
                    queue.publish(f"g{rng.randrange(GROUPS)}", f"w{n}-{made}")
                visibility = rng.choice(VISIBILITIES)
                lease = queue.claim(f"w{n}", visibility)
                if lease is not None:
                    # The work: a moment, now and then longer than the lease (its ack must then
                    # be refused if another worker has claimed the message meanwhile).
                    time.sleep(visibility + 0.1 if rng.random() < 0.03 else rng.uniform(0.002, 0.02))
                    queue.ack(lease)
            except (StorageError, OutcomeUnknownError):
                time.sleep(0.05)  # recorded by RecordingTransport; the cluster is busy: do not spin
            except Exception as exc:  # noqa: BLE001 - a crash of the transport fails the test
                self.crashes.append(f"w{n}: {exc!r}")
                return


# --- The faults -----------------------------------------------------------------------------


def inject(cluster, fault: str, notes: dict[str, Any]) -> int:
    """Do ``fault`` to the cluster and undo it; the number of faults injected."""
    leader = notes["leader_before"] = cluster.wait_for_leader(30)
    if fault == "kill-leader":
        cluster.kill(leader)
        notes["new_leader"] = cluster.wait_for_leader(30, exclude=[leader])
        time.sleep(1.0)
        cluster.start(leader)
        return 1
    if fault == "pause-leader":
        cluster.pause(leader)
        time.sleep(5.0)
        cluster.unpause(leader)
        return 1
    if fault == "partition-follower":
        follower = notes["follower"] = next(n for n in cluster.nodes if n != leader)
        cluster.disconnect(follower)
        time.sleep(4.0)
        # Cut off: its port no longer answers (the workers that started there fail over).
        notes["follower_answered"] = cluster.is_reachable(follower)
        cluster.reconnect(follower)
        return 1
    if fault == "partition-leader":
        cluster.disconnect(leader)
        notes["new_leader"] = cluster.wait_for_leader(30, exclude=[leader])
        time.sleep(1.0)
        cluster.reconnect(leader)
        return 1
    if fault == "latency":
        notes["latency_method"] = "/".join(sorted({cluster.add_latency(node, 0.2, 0.1) for node in cluster.nodes}))
        time.sleep(4.0)
        delayed = [cluster.remove_latency(node) for node in cluster.nodes]
        if None not in delayed:  # counted by the NFQUEUE (netem does not say)
            notes["packets_delayed"] = sum(delayed)
        return len(cluster.nodes)
    raise ValueError(f"unknown fault {fault!r}")


def settled_and_lapsed(cluster, clock: ShiftedClock) -> None:
    """What the drain does after a call whose outcome is unknown (a leader lost again after the
    heal): wait for a settled leader, and let any lease that call took lapse."""
    cluster.wait_settled()
    clock.offset += LAPSE


def run_under_fault(cluster, fault: str, directory: Path) -> dict[str, Any]:
    """Load, fault, heal, more load, lapse, drain: the records, the drained messages, notes.
    The history is also written to ``directory`` (``history.jsonl``, ``drained.json``)."""
    prefix = f"fault_{uuid.uuid4().hex[:12]}"
    clock = ShiftedClock()
    # The transports' clock: the checker compares the history's times with the leases'.
    history = History(directory / "history.jsonl", clock=clock)
    notes: dict[str, Any] = {"fault": fault, "prefix": prefix}
    phases = notes["phases"] = {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 1)
        mark = now

    try:
        load = Load(cluster, clock, history, prefix)
        try:
            load.start()
            lap("open")
            time.sleep(WARMUP)
            notes["faults"] = inject(cluster, fault, notes)
            lap("fault")
            cluster.heal()
            notes["leader_after"] = cluster.wait_ready()
            lap("heal")
            time.sleep(RECOVERY)
        finally:
            load.stop()
        lap("stop")
        cluster.wait_settled()  # a node that rejoined may call one more election
        clock.offset += LAPSE  # every lease taken so far has lapsed
        leader = cluster.leader() or cluster.nodes[0]
        drainer = RecordingTransport(
            RqliteTransport.from_url(cluster.url(leader), clock=clock, prefix=prefix, timeout=30), history, "drain")
        try:
            notes["drained"] = drain(drainer, lapse=lambda: settled_and_lapsed(cluster, clock))
        finally:
            drainer.close()
        (directory / "drained.json").write_text(json.dumps(notes["drained"]))
        lap("drain")
    finally:
        history.close()
        cluster.heal()  # before the drop: a node cut off would not take it
        _drop(cluster, prefix)
    notes["records"] = list(history.records)
    notes["crashes"] = load.crashes
    return notes


def _drop(cluster, prefix: str) -> None:
    """Drop the test's tables (the first node that takes the request; it forwards to the leader)."""
    statements = json.dumps([[f"DROP TABLE IF EXISTS {name}"] for name in our_tables(prefix)]).encode()
    for url in cluster.urls():
        request = urllib.request.Request(f"{url}/db/execute?transaction", data=statements,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if response.status == 200 and b'"error"' not in response.read():
                    return
        except OSError:
            continue  # try the next node


# --- Judging -------------------------------------------------------------------------------


def _unknown(record: Record) -> bool:
    return _error_kind(record) in ("OutcomeUnknownError", "no answer")


def unseen_unknown_publishes(records: list[Record], drained: list[tuple[str, str]]) -> list[Record]:
    """The publishes whose outcome is unknown and whose message nobody ever saw: no claim
    answered it and the final drain did not find it.

    The checker may leave such a publish out or place it anywhere after its invocation; its
    search tries the placements first, and each is refuted only by the final drain, so a few of
    them cost seconds to minutes (17 s for 6 of them in one kill-leader history, 0.02 s
    without).  Leaving them out changes no verdict here: every publish has priority 0 and no
    routing key, and fairness is not judged (the search is partitioned by group), so such a
    message, had it been there, could only have made a claim's None or a later message's
    delivery wrong, never allowed anything; and its loss is allowed (its publish may not have
    happened), as ``check`` knows anyway."""
    seen = {_message(r) for r in records if r.op == "claim" and r.ok and r.result} | set(map(tuple, drained))
    return [r for r in records if r.op == "publish" and _unknown(r)
            and (r.args["group_id"], r.args["event"]) not in seen]


def judge(records: list[Record], drained: list[tuple[str, str]]):
    """``check`` the history, without the unseen publishes of unknown outcome (see above)."""
    assert all(r.args.get("priority", 0) == 0 and r.args.get("routing_key") is None
               for r in records if r.op == "publish"), "unseen_unknown_publishes assumes no priority or routing"
    unseen = {r.id for r in unseen_unknown_publishes(records, drained)}
    return check([r for r in records if r.id not in unseen], drained, uncertain_steps=UNCERTAIN_STEPS)


def undecided_only(report) -> bool:
    """Whether the history's only violation is the model's check giving up (SPEC.md R19): a
    group holding calls of unknown outcome (a claim and an ack lost to a killed leader) may
    allow more orders than the checker tries.  Every other check still judged the whole."""
    return bool(report.violations) and all(v.kind == "undecided" for v in report.violations)


# --- Counting and reporting -----------------------------------------------------------------


def _message(record: Record) -> tuple[str, str]:
    lease = record.args["lease"] if record.op in ("ack", "nack") else record.result
    return (lease["group_id"], lease["event"])


def _error_kind(record: Record) -> str | None:
    if record.complete is None:
        return "no answer"
    return record.error.split("(", 1)[0] if record.error else None


def counts_of(notes: dict[str, Any], report) -> dict[str, Any]:
    work = [r for r in notes["records"] if r.worker != "drain"]
    ops = collections.Counter(r.op for r in work)
    errors = collections.Counter(f"{r.op}: {_error_kind(r)}" for r in work if _error_kind(r))
    unknown = collections.Counter(r.op for r in work if _unknown(r))
    deliveries = collections.Counter(_message(r) for r in work if r.op == "claim" and r.ok and r.result)
    fate = _unknown_ack_fates(notes)
    counts = {
        "fault": notes["fault"],
        "faults": notes["faults"],
        "workers": WORKERS,
        "operations": len(work),
        "operations_by_op": dict(sorted(ops.items())),
        "published": sum(1 for r in work if r.op == "publish" and r.ok),
        "acked": sum(1 for r in work if r.op == "ack" and r.ok and r.result is True),
        "stale_acks_refused": sum(1 for r in work if r.op == "ack" and r.ok and r.result is False),
        "slow_calls": sum(1 for r in work if r.complete is not None and r.complete - r.invoke > 0.2),
        "unknown_outcomes": sum(unknown.values()),
        "unknown_by_op": dict(sorted(unknown.items())),
        "unknown_acks_that_acted": fate["acted"],
        "unknown_acks_that_did_not": fate["did_not"],
        "unknown_publishes_never_seen": len(unseen_unknown_publishes(notes["records"], notes["drained"])),
        "errors": dict(sorted(errors.items())),
        "lost": len(report.lost),
        "duplicated": len(report.duplicates),
        "redelivered_after_ack": len(report.redelivered),
        "delivered_again_after_lapse": sum(n - 1 for n in deliveries.values() if n > 1),
        "overlaps": len(report.overlaps),
        "fifo_breaks": len(report.fifo_breaks),
        "model": len(report.model),
        "drained": len(notes["drained"]),
        "crashes": len(notes["crashes"]),
        "leaders": [notes.get("leader_before"), notes.get("new_leader"), notes.get("leader_after")],
        "seconds": notes["seconds"],
        "check_seconds": notes["check_seconds"],
        "phases": notes["phases"],
    }
    for key in ("follower", "follower_answered", "latency_method", "packets_delayed"):
        if key in notes:
            counts[key] = notes[key]
    return counts


def _unknown_ack_fates(notes: dict[str, Any]) -> dict[str, Any]:
    """Of the acks whose outcome was unknown: how many seem to have acted (their message was
    not claimed again after the ack gave up, nor drained) and how many surely did not (it was:
    ``came_back`` lists those messages)."""
    records, drained = notes["records"], set(map(tuple, notes["drained"]))
    claims = collections.defaultdict(list)
    for r in records:
        if r.op == "claim" and r.ok and r.result:
            claims[_message(r)].append(r)
    fate: dict[str, Any] = {"acted": 0, "did_not": 0, "came_back": []}
    for r in records:
        if r.op == "ack" and r.worker != "drain" and _unknown(r):
            message = _message(r)
            back = message in drained or any(c.invoke > (r.complete or r.invoke) for c in claims[message])
            fate["did_not" if back else "acted"] += 1
            if back:
                fate["came_back"].append(message)
    return fate


def line_of(counts: dict[str, Any]) -> str:
    c = counts
    ops = ", ".join(f"{op} {n}" for op, n in c["operations_by_op"].items())
    unknown = ", ".join(f"{op} {n}" for op, n in c["unknown_by_op"].items()) or "none"
    extra = "".join(f"; {key.replace('_', ' ')} {c[key]}" for key in ("follower", "follower_answered", "latency_method",
                                                                      "packets_delayed") if key in c)
    leaders = " -> ".join(str(leader) for leader in c["leaders"])
    phases = ", ".join(f"{phase} {seconds}" for phase, seconds in c["phases"].items())
    return (
        f"rqlite fault [{c['fault']}]: faults {c['faults']}; workers {c['workers']}; operations "
        f"{c['operations']} ({ops}); lost {c['lost']}; duplicated {c['duplicated']} (redelivered after "
        f"ack {c['redelivered_after_ack']}; delivered again after a lapse {c['delivered_again_after_lapse']}); "
        f"unknown outcomes {c['unknown_outcomes']} ({unknown}; of the acks: {c['unknown_acks_that_acted']} "
        f"seem to have acted, {c['unknown_acks_that_did_not']} did not; publishes never seen "
        f"{c['unknown_publishes_never_seen']}); overlaps {c['overlaps']}; "
        f"published {c['published']}, acked {c['acked']}, stale acks refused {c['stale_acks_refused']}, drained "
        f"{c['drained']}; calls over 200 ms {c['slow_calls']}; errors {c['errors'] or 'none'}; leaders {leaders}"
        f"{extra}; elapsed {c['seconds']} s ({phases}, check {c['check_seconds']} s)"
    )


def publish_counts(request: pytest.FixtureRequest, counts: dict[str, Any]) -> str:
    """Print the counts and leave them where CI can show them (see the module docstring)."""
    line = line_of(counts)
    request.node.user_properties.append(("fault_counts", line))
    request.node.user_properties.append(("fault_counts_json", json.dumps(counts)))
    print("\n" + line)
    directory = os.environ.get("HAREL_FAULT_COUNTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        (Path(directory) / f"{name}.txt").write_text(line + "\n" + json.dumps(counts) + "\n")
    return line


# --- Broken variants of the same history: the checker must object --------------------------


def _of_group(records: list[Record], drained: list[tuple[str, str]], group: str):
    """The records and drained messages of one group (a sub-history: quick to judge)."""
    mine = [r for r in records if (r.args.get("group_id") if r.op == "publish"
                                   else (_message(r)[0] if (r.op != "claim" or r.result) else None)) == group]
    return mine, [m for m in drained if m[0] == group]


def assert_not_vacuous(notes: dict[str, Any]) -> list[str]:
    """Break the recorded history three ways; each must be reported.  Returns what was tried."""
    records, drained = notes["records"], [tuple(m) for m in notes["drained"]]
    work = [r for r in records if r.worker != "drain"]
    tried = []
    acks = {r.args["lease"]["token"]: r for r in work if r.op == "ack" and r.ok and r.result is True}
    # A lease surely held for more than 2 ms: acked later than that, and its claim answered
    # more than 2 ms before its visibility ran out (under the latency fault a claim can take
    # longer than its lease, and such a lease was surely held for no time at all).  Its message
    # published with an answer and released by that ack alone: another ack or nack of it whose
    # outcome is unknown may have removed it, and with the ack struck out the checker rightly
    # does not call it lost (seen once under the latency fault); nor a message whose publish's
    # outcome is unknown.
    released = collections.Counter(_message(r) for r in work if r.op in ("ack", "nack"))
    published = {(r.args["group_id"], r.args["event"]) for r in work if r.op == "publish" and r.ok}
    held = [(c, acks[c.result["token"]]) for c in work
            if c.op == "claim" and c.ok and c.result and c.result["token"] in acks
            and released[_message(c)] == 1 and _message(c) in published
            and min(acks[c.result["token"]].invoke, c.invoke + c.args["visibility"]) - c.complete > 0.002]
    assert held, "no lease was held and acked: the load did nothing"
    claim, ack = held[len(held) // 2]
    group = claim.result["group_id"]

    # 1. An ack that returned True struck out: its message was neither acked nor drained.  The
    #    checker says so as the message lost, or (what it found first: at load 9 its search cut
    #    at 200,000 steps) as the message still held under its lease when the group was
    #    claimed again, an overlap on the group.
    mine, left = _of_group(records, drained, group)
    report = judge([r for r in mine if r is not ack], left)
    lost = {(v.group_id, v.records[0].args["event"]) for v in report.lost}
    assert (group, claim.result["event"]) in lost or any(v.group_id == group for v in report.overlaps), report
    tried.append("ack struck out: lost")

    # 2. A second lease on the same message, forged inside the real one's surely-held window.
    forged = dataclasses.replace(claim, worker="forger", invoke=claim.complete, complete=claim.complete + 0.001,
                                 result={**claim.result, "token": "forged"}, id="forged")
    report = judge([*mine, forged], left)
    assert any(v.group_id == group for v in report.overlaps), report
    tried.append("forged lease: overlap")

    # 3. A client that counts an ack whose outcome was unknown as done.  Wherever such a
    #    message came back (claimed again later, or drained), that is a redelivery after ack.
    came_back = _unknown_ack_fates(notes)["came_back"]
    if came_back:
        optimistic = [dataclasses.replace(r, error=None, result=True, complete=r.complete or r.invoke)
                      if r.op == "ack" and r.worker != "drain" and _unknown(r)
                      else r for r in records]
        report = judge(optimistic, drained)
        redelivered = {_message(v.records[0]) for v in report.redelivered}
        assert set(came_back) <= redelivered, report
        tried.append(f"unknown acks counted as acked ({len(came_back)} came back): redelivered")
    return tried


# --- The tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
def test_no_acknowledged_message_is_lost_under_faults(cluster, fault, request, tmp_path):
    started = time.monotonic()
    notes = run_under_fault(cluster, fault, tmp_path)
    checked = time.monotonic()
    report = judge(notes["records"], notes["drained"])
    notes["check_seconds"] = round(time.monotonic() - checked, 1)
    notes["seconds"] = round(time.monotonic() - started, 1)
    counts = counts_of(notes, report)
    line = publish_counts(request, counts)

    assert not notes["crashes"], f"{line}\n{notes['crashes']}"
    # At load 5, kill-leader lost the answers of a claim and an ack, and the model's check gave up
    # after 2,000,000 steps: undecided, which is no violation when calls of unknown outcome are why.
    assert report.ok or (undecided_only(report) and counts["unknown_outcomes"] > 0), f"{line}\n{report}"
    assert counts["lost"] == 0 and counts["duplicated"] == 0 and counts["overlaps"] == 0, line
    assert counts["acked"] > 0 and counts["drained"] > 0, f"the load did too little: {line}"
    # The fault did disturb the load: errors, or (latency) packets held.
    # The fault took effect: it disturbed the load, or cut the node off, or held packets back.
    if fault == "partition-follower":
        assert notes["follower_answered"] is False, f"the follower was not cut off: {line}"
    elif fault == "latency":
        assert counts["slow_calls"] > 0 and counts.get("packets_delayed", 1) > 0, f"nothing was delayed: {line}"
    else:
        assert counts["errors"], f"the fault disturbed no call: {line}"
    tried = assert_not_vacuous(notes)
    print("broken variants caught: " + "; ".join(tried))
