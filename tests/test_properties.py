"""The property table (stateful/_properties.py): consistent with the machine, the spec and
itself, and the one place that says whom a failed check counts against."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harel_ref.certify import CONTRACT
from harel_ref.stateful import FOCUS_RULES, RULES
from harel_ref.stateful._properties import (
    AFTER_REOPEN,
    AFTER_STALE,
    MACHINE_RULES,
    PROPERTIES,
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
