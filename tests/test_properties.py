"""The property table (stateful/_properties.py): consistent with the machine, the spec and
itself, and the one place that says whom a failed check counts against."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harel_ref.certify import CONTRACT
from harel_ref.stateful import FOCUS_RULES, RULES
from harel_ref.stateful._properties import (
    AFTER_REFUSED,
    AFTER_REOPEN,
    AFTER_STALE,
    MACHINE_RULES,
    PROPERTIES,
    SHARED,
    attribute,
    owner,
    problems,
)

SPEC = (Path(__file__).resolve().parent.parent / "SPEC.md").read_text()


def test_the_table_knows_the_machines_rules_and_the_specs():
    assert MACHINE_RULES == set(RULES + FOCUS_RULES)
    rules_in_spec = set(re.findall(r"^\*\*(R\d+)\.", SPEC, re.MULTILINE))
    for row in PROPERTIES.values():
        assert set(row.spec) <= rules_in_spec, row.name
        assert all(rule in row.what for rule in row.spec), row.name  # the line names its rules
    assert problems(PROPERTIES) == []
    assert CONTRACT == {"single-in-flight", "fifo", "lease-expiry", "parking", "fairness", "priority-floor",
                        "durability", "no-loss", "contention"}


def test_a_table_that_would_blame_a_check_on_two_properties_is_refused():
    broken = dict(PROPERTIES)
    broken["fifo"] = dataclasses.replace(PROPERTIES["fifo"], checks=frozenset({"fifo", "publish"}), level="core")
    assert problems(broken) == [
        "check 'publish' is claimed by both 'fifo' and 'no-loss'",
        "'fifo': level 'core' is neither 'contract' nor 'strict'",
    ]


def test_whom_a_failed_check_counts_against():
    assert owner("publish") == "no-loss" and owner("ack") == "fencing" and owner("fifo") == "fifo"
    assert attribute("fifo", (), "fifo") == ("fifo", "fifo", "")
    # in durability's own search, a failure after a reopen is durability's; elsewhere it is not
    assert attribute("fifo", {AFTER_REOPEN}, "durability") == (
        "durability", "fifo", "  (after a reopen; the check that failed: fifo)")
    assert attribute("fifo", {AFTER_REOPEN}, "fifo") == ("fifo", "fifo", "")
    assert attribute("no-loss", {AFTER_STALE}, "fencing")[0] == "fencing"
    # the tie-break's search judges the order of groups with the tie-break
    assert attribute("fairness", (), "tie-break") == ("tie-break", "tie-break", "")
    assert attribute("fairness", (), "fairness") == ("fairness", "fairness", "")


def test_whom_a_failure_of_the_shared_search_counts_against():
    # the shared search runs every rule: each fact is blamed as the search of the property that
    # blames it would, the earliest kind of cause first (SPEC.md C5)
    assert attribute("fifo", (), SHARED) == ("fifo", "fifo", "")
    assert attribute("priority-floor", {AFTER_REOPEN}, SHARED) == (
        "durability", "priority-floor", "  (after a reopen; the check that failed: priority-floor)")
    assert attribute("fifo", {AFTER_REFUSED, AFTER_REOPEN}, SHARED)[0] == "durability"
    assert attribute("fifo", {AFTER_REFUSED}, SHARED)[0] == "bad-input"
    assert attribute("no-loss", {AFTER_STALE}, SHARED)[0] == "fencing"
    assert attribute("durability", {AFTER_REOPEN}, SHARED) == ("durability", "durability", "")
    assert attribute("fairness", (), SHARED) == ("tie-break", "tie-break", "")  # it judges the tie-break


def test_the_machine_counts_the_situations_it_reaches():
    from harel_ref.stateful import Backend, Capabilities, make_machine
    from harel_ref.stateful._properties import HELD, LEASE_END, LEASE_LAPSED, PARK_ENDED, REOPEN_HELD, STALE_AFTER_RECLAIM, TIE
    from harel_ref.stateful.backends import load

    backend = load("memory")(None)
    machine = make_machine(Backend("memory", backend.factory, Capabilities(durable=True)))()
    try:
        machine.publish("g1", "a", 0, None, 0)
        machine.publish("g2", "b", 0, None, 0)
        first = machine.claim_any("w1", 1.0, 0)  # g1 and g2 never claimed: a tie
        assert machine.reached == {TIE: 1}
        machine.reopen()  # with g1 leased
        machine.advance_to_deadline(0, False)  # the lease's exact end
        machine.claim_any("w2", 1.0, 0)  # takes g2; g1 is still leased, to the tick
        assert machine.reached == {TIE: 1, REOPEN_HELD: 1, HELD: 1, LEASE_END: 1}
        machine.advance(4.0)
        again = machine.claim_any("w2", 1.0, 0)  # both leases lapsed: g1, claimed longest ago, again
        assert again.group_id == first.group_id and machine.reached[LEASE_LAPSED] == 2
        machine.ack(first, 0)  # stale: its message was claimed again
        assert machine.reached[STALE_AFTER_RECLAIM] == 1
        machine.nack_later(again, 0.5, 0)
        machine.advance(1.0)
        machine.claim_any("w1", 1.0, 0)
        assert machine.reached[PARK_ENDED] == 1
    finally:
        machine.teardown()


def test_a_pass_that_never_reached_a_situation_says_so(monkeypatch):
    from harel_ref.certify import certify
    from harel_ref.stateful._properties import LEASE_END, REOPEN_HELD
    from harel_ref.stateful.backends import load

    backend = load("memory")(None)
    report = certify(backend.factory, backend.capabilities, profile="quick/10", properties=["lease-expiry", "fifo"])
    reached = report.verdict("lease-expiry").evidence
    assert reached[LEASE_END] > 0 and "never reached" not in report.verdict("lease-expiry").reason
    monkeypatch.setitem(PROPERTIES, "fifo", dataclasses.replace(PROPERTIES["fifo"], evidence=(REOPEN_HELD,)))
    report = certify(backend.factory, backend.capabilities, profile="quick/10", properties=["fifo"])
    fifo = report.verdict("fifo")  # fifo's search never reopens
    assert fifo.verdict == "passed" and fifo.evidence == {REOPEN_HELD: 0}
    assert fifo.reason.endswith(f"; never reached: {REOPEN_HELD}")
    assert f"- **fifo**: {REOPEN_HELD}: 0" in report.to_markdown()
