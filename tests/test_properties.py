"""The property table (stateful/_properties.py): consistent with the machine, the spec, the
facts and itself, and the one place that says which property a fact breaks; and the verdict
function (certify/_verdicts.py) that decides, once, whom each fact counts against."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harel_ref.certify import CONTRACT
from harel_ref.certify._report import Failure
from harel_ref.certify._verdicts import (
    Searched, anothers, blame, consequences, fault_owners, left_undecided, sets_aside, shared_sets_aside, unexplained,
    verdicts,
)
from harel_ref.stateful import FOCUS_RULES, RULES, Capabilities
import harel_ref.stateful._facts as facts
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._properties import DRAIN_CHECKED, MACHINE_RULES, PROPERTIES, SHARED, explained, owner, problems

SPEC = (Path(__file__).resolve().parent.parent / "SPEC.md").read_text()
LOCKSTEP = tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep")


def test_the_table_knows_the_machines_rules_and_the_specs():
    assert MACHINE_RULES == set(RULES + FOCUS_RULES)
    rules_in_spec = set(re.findall(r"^\*\*(R\d+)\.", SPEC, re.MULTILINE))
    for row in PROPERTIES.values():
        assert set(row.spec) <= rules_in_spec, row.name
        assert all(rule in row.what for rule in row.spec), row.name  # the line names its rules
    assert problems(PROPERTIES) == []
    assert CONTRACT == {"single-in-flight", "fifo", "lease-expiry", "parking", "fairness", "priority-floor",
                        "durability", "no-loss", "event-integrity", "contention"}


def test_a_table_that_would_give_a_kind_of_fact_to_two_properties_or_none_is_refused():
    broken = dict(PROPERTIES)
    broken["fifo"] = dataclasses.replace(PROPERTIES["fifo"], owns=PROPERTIES["fifo"].owns | {facts.LOST},
                                         level="core")
    broken["close"] = dataclasses.replace(PROPERTIES["close"], owns=frozenset({facts.CLOSED_CALL_ANSWERED}))
    assert problems(broken) == [
        "the kind 'lost' is owned by both 'fifo' and 'no-loss'",
        "no row owns the kinds ['closed-another', 'closed-without-saying']",
        "'fifo': level 'core' is neither 'contract' nor 'strict'",
    ]


def _searched(search: str, *found: Fact, ended: str = "failed", covers: tuple[str, ...] | None = None) -> Searched:
    failures = tuple(Failure(fact, found_by=search, steps=(), reproduction="", replay=None) for fact in found)
    return Searched(search, covers if covers is not None else (search,), ended, failures=failures)


def test_whom_a_fact_counts_against():
    assert owner(facts.PUBLISH_ANSWERED) == "no-loss" and owner(facts.STALE_RAISED) == "fencing"
    assert owner(facts.TIE_ORDER) == "tie-break" and owner(facts.PASSED_OVER) == "fairness"
    not_head = Fact(facts.NOT_HEAD, "claim(...)")
    after_reopen = dataclasses.replace(not_head, after=(facts.REOPENED,))
    assert blame(not_head, _searched("fifo")) == "fifo"
    # in durability's own search, a fact after a reopen is durability's; elsewhere it is not
    assert blame(after_reopen, _searched("durability")) == "durability"
    assert blame(after_reopen, _searched("fifo")) == "fifo"
    stale = Fact(facts.DRAIN_DIFFERS, "drain", after=(facts.RELEASED_STALE,))
    assert blame(stale, _searched("fencing")) == "fencing"
    assert blame(stale, _searched("no-loss")) == "no-loss"  # what a stale release by seq breaks (R20)
    assert after_reopen.note() == "  (after a reopen)"


def test_whom_a_fact_of_the_shared_search_counts_against():
    # the shared search runs every rule: each fact is blamed as the search of the property that
    # blames it would, the earliest kind of cause first (SPEC.md C5)
    shared = _searched(SHARED, covers=LOCKSTEP)
    assert blame(Fact(facts.NOT_HEAD, "s"), shared) == "fifo"
    assert blame(Fact(facts.BELOW_FLOOR, "s", after=(facts.REOPENED,)), shared) == "durability"
    assert blame(Fact(facts.NOT_HEAD, "s", after=(facts.REFUSED, facts.REOPENED)), shared) == "durability"
    assert blame(Fact(facts.NOT_HEAD, "s", after=(facts.REFUSED,)), shared) == "bad-input"
    assert blame(Fact(facts.DRAIN_DIFFERS, "s", after=(facts.RELEASED_STALE,)), shared) == "fencing"
    # a fault counts against the first property whose own search makes the step that raised
    assert blame(Fact(facts.RAISED, "s", rule="reopen"), shared) == "durability"
    assert blame(Fact(facts.RAISED, "s", rule="nack_later"), shared) == "fifo"
    assert blame(Fact(facts.HUNG, "s"), _searched("concurrent", covers=("fencing",))) == "contention"


def test_an_error_many_searches_met_counts_against_one_property():
    """One error, whatever the values in its message, is one bug wherever it shows: the shared
    search's owner of it, else the first property in the table's order whose search met it.
    A hang or a panic stays its own search's (it may have broken what ran it); so does what the
    concurrent search met."""
    nul = Fact(facts.RAISED, "state.begin(...) raised", answered="DataError: cannot hold 'g\x00' in column 3",
               call="publish")
    other_nul = Fact(facts.RAISED, "state.publish(...) raised", answered="DataError: cannot hold 'h\x00' in column 4",
                     call="publish")
    assert facts.raised_error(nul) == facts.raised_error(other_nul) == "publish: DataError: cannot hold … in column …"
    # the same error at another method is another bug; an apostrophe is no quote; an address is a value
    assert facts.raised_error(dataclasses.replace(nul, call="claim")) != facts.raised_error(nul)
    cannot = [Fact(facts.RAISED, "s", answered=f"ValueError: an id can't hold a NUL: {text!r}") for text in "gh"]
    assert facts.raised_error(cannot[0]) == facts.raised_error(cannot[1]) == ": ValueError: an id can't hold a NUL: …"
    assert facts.raised_error(Fact(facts.RAISED, "s", answered="TypeError: <Lease at 0x7f3a2b1c>")) \
        == ": TypeError: <Lease at …>"
    duplicate = [Fact(facts.RAISED, "s", answered=f"Http2Error: E11000 in harel.ns_{ns}_messages: b'g\\x00{ns}'")
                 for ns in ("cfb3bc1d", "0a4e9b2a")]  # a namespace, bytes; the class keeps its digit
    assert facts.raised_error(duplicate[0]) == facts.raised_error(duplicate[1]) == ": Http2Error: … in harel.…: …"
    assert facts.raised_error(Fact(facts.HUNG, "s", answered="hung: nack")) is None
    focused = [_searched("no-loss", other_nul), _searched("fifo", nul), _searched("contention", nul)]
    assert fault_owners(focused) == {facts.raised_error(nul): "fifo"}
    shared = _searched(SHARED, dataclasses.replace(nul, rule="reopen"), covers=LOCKSTEP)
    assert fault_owners([*focused, shared]) == {facts.raised_error(nul): "durability"}
    made = verdicts(["fifo", "no-loss", "close"], Capabilities(), [*focused[:2], _searched("close", ended="passed")])
    assert made["fifo"].verdict == "failed" and made["no-loss"].verdict == "unknown", made  # no-loss stopped at it
    assert made["no-loss"].reason.startswith("a consequence of fifo's failure")
    hung = Fact(facts.HUNG, "s", answered="hung: nack did not return within 5 s")
    made = verdicts(["fifo", "no-loss"], Capabilities(), [_searched("no-loss", hung), _searched("fifo", hung)])
    assert made["fifo"].verdict == made["no-loss"].verdict == "failed"


def test_a_failure_another_failure_explains_is_its_consequence():
    """One bug, many searches: a queue that drops an event equal to one it holds loses a
    message, and the fairness, fifo and routing searches each see a later claim go wrong."""
    lost = Fact(facts.DRAIN_DIFFERS, "drain")
    failed = {"no-loss": [lost], "fairness": [Fact(facts.PASSED_OVER, "claim")],
              "fifo": [Fact(facts.NOT_HEAD, "claim")], "routing": [Fact(facts.OUTSIDE_KEYS, "claim")]}
    assert consequences(failed) == {"fairness": "no-loss", "fifo": "no-loss", "routing": "no-loss"}
    # two bugs neither explains: both stand
    assert consequences({"fifo": [Fact(facts.NOT_HEAD, "c")], "close": [Fact(facts.CLOSED_CALL_ANSWERED, "c")]}) == {}
    # a fault is nobody's consequence
    assert consequences({"fifo": [Fact(facts.RAISED, "c")], "no-loss": [lost]}) == {}
    # fairness explains a tie taken out of order, not the other way round
    assert consequences({"fairness": [Fact(facts.PASSED_OVER, "c")], "tie-break": [Fact(facts.TIE_ORDER, "c")]}) \
        == {"tie-break": "fairness"}
    # explained both ways (every fact of each is one the other's bug shows as): neither follows
    both = {"fairness": [Fact(facts.TIE_ORDER, "c", after=(facts.REOPENED,))], "tie-break": [Fact(facts.TIE_ORDER, "c")]}
    assert consequences({"fairness": both["fairness"], "tie-break": both["tie-break"]}) == {}


def test_a_claim_the_queue_as_modelled_answered_is_no_consequence_of_a_lost_message():
    """harel's Redis transports (finding 10) ignore the ack of a lapsed lease: no-loss fails,
    and the parking, fairness and tie-break searches each saw a claim go wrong.  Where a drain
    right after that claim found the queue holding the very messages the model holds, no
    lost, duplicated or changed message explains it (SPEC.md C12): the property fails on its
    own.  Where the drain was not made (None), no-loss still explains it, as before.  And no
    bug of leases, parks or stamps explains a fact met before the example's first lease."""
    lost = Fact(facts.QUEUE_DIFFERS, "claim", queue_as_modelled=False)
    parked = Fact(facts.CLAIMED_PARKED, "claim", queue_as_modelled=True)
    tied = Fact(facts.TIE_ORDER, "claim", queue_as_modelled=True)
    assert consequences({"no-loss": [lost], "parking": [parked]}) == {}
    assert consequences({"no-loss": [lost], "tie-break": [tied]}) == {}
    unchecked = dataclasses.replace(parked, queue_as_modelled=None)
    assert consequences({"no-loss": [lost], "parking": [unchecked]}) == {"parking": "no-loss"}
    # a bug of another kind than what the queue holds still explains it: a lease that ends late
    late = Fact(facts.MISSED_LAPSED_LEASE, "claim", queue_as_modelled=True)
    assert consequences({"lease-expiry": [late], "fairness": [Fact(facts.PASSED_OVER, "c", queue_as_modelled=True)]}) \
        == {"fairness": "lease-expiry"}
    # before the example's first lease no lease exists: groups never claimed taken out of
    # arrival order (finding 21) are not a consequence of a lease's bug
    first = Fact(facts.TIE_ORDER, "claim", queue_as_modelled=True, claimed_before=False)
    stamped = Fact(facts.PASSED_OVER, "claim", queue_as_modelled=True, claimed_before=True)
    assert consequences({"lease-expiry": [late], "tie-break": [first]}) == {}
    assert consequences({"lease-expiry": [late], "tie-break": [dataclasses.replace(first, claimed_before=True)]}) \
        == {"tie-break": "lease-expiry"}
    # fairness's stamps may be set by a publish too (an updated_at column): it acts before any lease
    assert consequences({"fairness": [stamped], "tie-break": [first]}) == {"tie-break": "fairness"}
    # nor a bug of parks one before the example's first park (harel's Redis: the fairness
    # search, which never parks, was told as parking's consequence once finding 10 failed it)
    parked = Fact(facts.CLAIMED_PARKED, "claim", queue_as_modelled=True, claimed_before=True, parked_before=True)
    unparked = dataclasses.replace(stamped, parked_before=False)
    assert consequences({"parking": [parked], "fairness": [unparked]}) == {}
    assert consequences({"parking": [parked], "fairness": [stamped]}) == {"fairness": "parking"}
    # what no-loss's own search meets, the queue as modelled, is another's: it goes on past it
    assert anothers(Fact(facts.CLAIMED_LEASED, "claim", queue_as_modelled=True), "no-loss")
    assert not anothers(Fact(facts.CLAIMED_LEASED, "claim"), "no-loss")
    assert anothers(Fact(facts.NOT_HEAD, "claim", queue_as_modelled=True), "event-integrity")
    assert unexplained(Fact(facts.OUTSIDE_KEYS, "claim", queue_as_modelled=True), ("routing", "no-loss"))
    assert not unexplained(Fact(facts.OUTSIDE_KEYS, "claim"), ("routing", "no-loss"))
    assert not shared_sets_aside(parked, frozenset({"no-loss"}), ("parking", "no-loss"))
    assert shared_sets_aside(unchecked, frozenset({"no-loss"}), ("parking", "no-loss"))
    assert facts.CLAIMED_PARKED in DRAIN_CHECKED and facts.SEQ_ORDER not in DRAIN_CHECKED  # a seq's claim took the right message
    # a root whose failure is a group missed (a lock table that collides) left the messages as
    # they were: the queue as modelled clears nothing of it
    missed = Fact(facts.MISSED_CLAIMABLE, "claim")
    assert consequences({"no-loss": [missed], "tie-break": [tied]}) == {"tie-break": "no-loss"}


def test_a_race_explains_no_failure_found_one_call_at_a_time():
    """harel's Postgres transports at standard: no-loss failed only in the concurrent search (a
    drain that differed after a race), and the fairness search's group passed over, found one
    call at a time, was told as its consequence, which hid finding 11.  A bug that shows only
    when calls race cannot have made a lockstep example go wrong."""
    raced = Fact(facts.DRAIN_DIFFERS, "drain")
    passed_over = Fact(facts.PASSED_OVER, "claim")
    failed = {"no-loss": [raced], "fairness": [passed_over]}
    assert consequences(failed, {"no-loss": [], "fairness": [passed_over]}) == {}
    assert consequences(failed, {"no-loss": [raced], "fairness": [passed_over]}) == {"fairness": "no-loss"}
    assert consequences(failed, {"no-loss": [], "fairness": []}) == {"fairness": "no-loss"}  # both raced
    made = verdicts(["fairness", "no-loss"], Capabilities(), [
        _searched("fairness", passed_over), _searched("no-loss", ended="passed"),
        _searched("concurrent", raced, covers=("no-loss",))])
    assert (made["fairness"].verdict, made["no-loss"].verdict) == ("failed", "failed"), made


def test_a_search_sets_aside_only_what_cannot_count_against_its_own_property():
    """After no-loss's bug is found, a focused search sets aside the examples that meet a fact
    of that bug (SPEC.md C5), but never one its own property owns or explains: fairness's
    search still judges groups passed over, which no-loss's bug also shows as."""
    lost = frozenset([facts.MISSED_CLAIMABLE])
    assert facts.MISSED_CLAIMABLE in explained(lost, "fifo") and facts.PASSED_OVER in explained(lost, "fifo")
    assert facts.PASSED_OVER not in explained(lost, "fairness")
    # lease-expiry explains it: never set aside
    assert not sets_aside(Fact(facts.PASSED_OVER, "c"), explained(lost, "lease-expiry"), "lease-expiry")
    assert not explained(lost, "no-loss")  # its own bug is shrunk, never set aside
    assert anothers(Fact(facts.MISSED_CLAIMABLE, "c"), "fifo")
    assert not anothers(Fact(facts.PASSED_OVER, "c"), "lease-expiry")
    assert not anothers(Fact(facts.RAISED, "c"), "fifo")  # a fault is the search's own
    assert not anothers(Fact(facts.NOT_HEAD, "c", after=(facts.REOPENED,)), "durability")
    # durability owns no kind: after a reopen, a fact of no-loss's kinds is its own, never set aside
    known = explained(lost, "durability")
    assert facts.MISSED_CLAIMABLE in known and sets_aside(Fact(facts.MISSED_CLAIMABLE, "c"), known, "durability")
    assert not sets_aside(Fact(facts.MISSED_CLAIMABLE, "c", after=(facts.REOPENED,)), known, "durability")


def test_the_shared_searchs_second_pass_stands_only_for_what_it_set_aside_cannot_count_against():
    """With fencing taken as broken the shared search sets aside its facts, whatever came
    before them, and a fact of a kind its bug explains (none: fencing explains nothing) or of
    another's, never; it stands for no property one of them could count against (SPEC.md C5)."""
    covers = LOCKSTEP
    fencing = frozenset(["fencing"])
    stale = Fact(facts.STALE_ACTED, "ack(lease)")
    stepped = Fact(facts.STALE_ACTED, "ack(lease)", after=(facts.STEPPED_BACK,))
    assert shared_sets_aside(stale, fencing, covers) and shared_sets_aside(stepped, fencing, covers)
    assert not shared_sets_aside(Fact(facts.PASSED_OVER, "claim"), fencing, covers)
    assert not shared_sets_aside(Fact(facts.RAISED, "ack(lease)"), fencing, covers)  # a fault never
    assert not shared_sets_aside(stale, frozenset(), covers)  # the first pass sets nothing aside
    assert left_undecided([stale], fencing, covers) == ()
    assert left_undecided([stale, stepped], fencing, covers) == ("lease-expiry",)  # it blames what follows a step back
    # no-loss's bug explains a group passed over: fairness, lease-expiry and parking (which
    # explain or own it) are left to their own searches
    lost = frozenset(["no-loss"])
    passed_over = Fact(facts.PASSED_OVER, "claim")
    assert shared_sets_aside(passed_over, lost, covers)
    assert left_undecided([passed_over], lost, covers) == ("lease-expiry", "parking", "fairness")
    # the second pass follows only a first failure that counts against its owner whatever else is
    # found: a tie broken wrongly may be no-loss's echo (a store matching group ids with LIKE)
    assert unexplained(stale, covers) and unexplained(Fact(facts.MISSED_CLAIMABLE, "claim"), covers)
    assert not unexplained(Fact(facts.TIE_ORDER, "claim"), covers) and not unexplained(passed_over, covers)
    assert not unexplained(stepped, covers) and not unexplained(Fact(facts.RAISED, "ack(lease)"), covers)


def test_the_verdicts_name_one_root_and_list_its_consequences():
    caps = Capabilities(durable=True, shared=True)
    searched = [
        _searched("fifo", Fact(facts.NOT_HEAD, "claim")),
        _searched("fairness", ended="passed"),
        _searched("durability", Fact(facts.MISSED_CLAIMABLE, "claim", after=(facts.REOPENED,))),
        _searched("no-loss", Fact(facts.DRAIN_DIFFERS, "drain", "['a', 'a']", "['a']")),
        _searched("close", Fact(facts.BAD_INPUT_ACCEPTED, "publish('', 'e')")),  # stopped at bad-input's
    ]
    made = verdicts(["fifo", "fairness", "durability", "no-loss", "close"], caps, searched)
    assert {p: v.verdict for p, v in made.items()} == {
        "fifo": "unknown", "fairness": "passed", "durability": "unknown", "no-loss": "failed", "close": "unknown",
        "bad-input": "failed"}
    assert made["no-loss"].consequences == ("fifo", "durability")
    assert made["fifo"].reason.startswith("a consequence of no-loss's failure: its search saw not-head")
    # close's own search stopped at bad-input's fact: its counterexample is shown under its reason
    assert made["close"].reason.startswith(
        "a consequence of bad-input's failure: its search saw bad-input-accepted, a fact of bad-input's (see bad-input)")
    assert made["close"].failure.kind == facts.BAD_INPUT_ACCEPTED
    assert made["bad-input"].consequences == ("close",)


def test_the_machine_counts_the_situations_it_reaches():
    from harel_ref.stateful import Backend, Capabilities, make_machine
    from harel_ref.stateful._properties import (
        DRAWN, GROUPS_AT_A_CLAIM, HELD, LEASE_END, LEASE_LAPSED, PARK_ENDED, REOPEN_HELD, SIZES, STALE_AFTER_RECLAIM,
        TIE, WORKERS_IN_AN_EXAMPLE,
    )
    from harel_ref.stateful.backends import load

    backend = load("memory")(None)
    machine = make_machine(Backend("memory", backend.factory, Capabilities(durable=True)))()
    try:
        machine.publish("g1", "a", 0, None, 0)
        machine.publish("g2", "b", 0, None, 0)
        first = machine.claim_any("w1", 1.0, 0)  # g1 and g2 never claimed: a tie
        situations = lambda: {k: n for k, n in machine.reached.items()  # noqa: E731
                              if k not in SIZES and not k.startswith(DRAWN)}  # the families drawn: tests/test_values.py
        assert situations() == {TIE: 1}
        assert machine.reached[GROUPS_AT_A_CLAIM] == 2 and machine.reached[WORKERS_IN_AN_EXAMPLE] == 1
        machine.reopen()  # with g1 leased
        machine.advance_to_deadline(0, False)  # the lease's exact end
        machine.claim_any("w2", 1.0, 0)  # takes g2; g1 is still leased, to the tick
        assert situations() == {TIE: 1, REOPEN_HELD: 1, HELD: 1, LEASE_END: 1}
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
    # quick, not quick/10: an example of lease-expiry's search draws its clock's start and
    # durations across magnitudes (SPEC.md C13), and few of quick/10's reach an exact end
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["lease-expiry", "fifo"])
    reached = report.verdict("lease-expiry").evidence
    assert reached[LEASE_END] > 0 and "never reached" not in report.verdict("lease-expiry").reason
    monkeypatch.setitem(PROPERTIES, "fifo", dataclasses.replace(PROPERTIES["fifo"], evidence=(REOPEN_HELD,)))
    report = certify(backend.factory, backend.capabilities, profile="quick/10", properties=["fifo"])
    fifo = report.verdict("fifo")  # fifo's search never reopens
    assert fifo.verdict == "passed" and fifo.evidence == {REOPEN_HELD: 0}
    assert fifo.reason.endswith(f"; never reached: {REOPEN_HELD}")
    assert f"- **fifo**: {REOPEN_HELD}: 0" in report.to_markdown()


ROOT = Path(__file__).resolve().parent.parent
OTHER_MEANINGS = {field.name for field in dataclasses.fields(Capabilities)} | {
    "publish", "claim", "ack", "nack", "close"}
"""Words that are property names and something else too: a capability (``parking``,
``routing``, ``fairness``) or a method of the Protocol (``close``)."""


def _property_names_held(path: Path) -> list[str]:
    """Where the module at ``path`` holds a property name as a string of its own."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in PROPERTIES and node.value not in OTHER_MEANINGS]


def test_no_module_but_the_table_holds_a_property_name():
    """Checkers report facts, and the table alone names properties (issue 41): a property name
    as a string anywhere else would be a checker, or the engine, deciding whom a fact counts
    against.  (The report writer prints the names the verdicts carry; it holds none itself.)"""
    modules = [p for folder in ("harel_ref", "stateful", "model") for p in (ROOT / folder).rglob("*.py")]
    held = [hit for path in modules if path != ROOT / "stateful" / "_properties.py"
            for hit in _property_names_held(path)]
    assert held == []
    assert len(_property_names_held(ROOT / "stateful" / "_properties.py")) == len(set(PROPERTIES) - OTHER_MEANINGS)


def test_no_checker_output_names_a_property():
    from harel_ref.stateful import Divergence, Linearizability
    from harel_ref.stateful.history import Violation
    from harel_ref.stateful.parallel import ConcurrencyFailure

    for output in (Fact, Failure, Linearizability, Violation):
        assert "property" not in {field.name for field in dataclasses.fields(output)}, output
    for output in (Divergence, ConcurrencyFailure):
        assert not hasattr(output, "property"), output


def test_a_fault_explains_nothing():
    """A property whose only failure is a crash or a hang cannot be the root of another's real
    failure: a root needs a fact of a kind it owns."""
    made = verdicts(["fifo", "no-loss"], Capabilities(),
                    [_searched("no-loss", Fact(facts.RAISED, "state.ack(...) raised", rule="ack")),
                     _searched("fifo", Fact(facts.NOT_HEAD, "claim"))])
    assert (made["fifo"].verdict, made["no-loss"].verdict) == ("failed", "failed")
    assert consequences({"no-loss": [Fact(facts.HUNG, "c")], "single-in-flight": [Fact(facts.CLAIMED_LEASED, "c")]}) == {}


def test_a_search_that_went_on_stands_for_what_it_covers_but_what_it_stopped_at():
    """The concurrent search found claimed-leased, went on, and stopped at a hang in its next
    pass: fencing and no-loss are undecided because of the hang (contention's), not because of
    single-in-flight's failure, which it went on after."""
    concurrent = ("single-in-flight", "fencing", "no-loss", "contention")
    leased = Failure(Fact(facts.CLAIMED_LEASED, "b0: claim()"), "concurrent", (), "", None)
    hung = Failure(Fact(facts.HUNG, "running a program"), "concurrent", (), "", None)
    search = Searched("concurrent", concurrent, "failed", failures=(leased, hung), stopped_at=(hung,))
    made = verdicts(list(concurrent), Capabilities(), [search])
    assert made["single-in-flight"].verdict == made["contention"].verdict == "failed"
    assert made["fencing"].reason == "a consequence of contention's failure: its search stopped at it (see contention)"
    assert made["contention"].consequences == ("fencing", "no-loss")


def test_a_soak_judges_errors_and_breaches_in_full():
    """A soak whose model check passed but whose history shows a lost message: no-loss fails, and
    what it found nothing against passed (the soak ran its whole time)."""
    lost = Failure(Fact(facts.LOST, "[lost] group 'g1': ..."), "soak", (), "", None)
    soak = Searched("soak", ("single-in-flight", "no-loss", "contention"), "passed", "900 calls in 5 s, linearizable",
                    failures=(lost,))
    made = verdicts(["single-in-flight", "no-loss", "contention"], Capabilities(), [soak])
    assert {p: v.verdict for p, v in made.items()} == {
        "single-in-flight": "passed", "no-loss": "failed", "contention": "passed"}


def test_a_fact_its_owners_own_search_cleared_counts_against_the_search_that_explains_it():
    """A floor misapplied passes over a group whose lease lapsed: the priority-floor search sees
    missed-lapsed-lease, the lease-expiry search, which looks for exactly that, passes; so it is
    priority-floor's, also when the shared search found it, and lease-expiry passed."""
    lapsed = Fact(facts.MISSED_LAPSED_LEASE, "claim('w1', visibility=0.25, min_priority=3)")
    caps = Capabilities()
    searched = [_searched(SHARED, lapsed, covers=LOCKSTEP), _searched("lease-expiry", ended="passed"),
                _searched("priority-floor", lapsed)]
    made = verdicts(["lease-expiry", "priority-floor"], caps, searched)
    assert (made["lease-expiry"].verdict, made["priority-floor"].verdict) == ("passed", "failed")
    # where lease-expiry's own search failed too, it is lease-expiry's, and the floor search stopped at it
    searched[1] = _searched("lease-expiry", lapsed)
    made = verdicts(["lease-expiry", "priority-floor"], caps, searched)
    assert (made["lease-expiry"].verdict, made["priority-floor"].verdict) == ("failed", "unknown")


def test_an_echo_of_the_shared_search_counts_against_its_owner_and_a_shrunk_failure_is_shown():
    """A store that keeps 8 leases: the shared search finds a current lease refused (fencing's)
    and shrinks it; fencing's own search, without claims in a row, passes; the no-loss search
    meets the refusal again and stops, unshrunk (SPEC.md C5).  That echo is fencing's, not
    no-loss's (which explains the kind), and fencing shows the shrunk counterexample."""
    from harel_ref.certify._report import ECHO

    refused = Fact(facts.CURRENT_REFUSED, "ack(lease of 'g1')", "True", "False")
    shrunk = Failure(refused, found_by=SHARED, steps=("state.claim_many(count=16)",), reproduction="...", replay=None)
    echo = Failure(refused, found_by="no-loss", steps=(), reproduction="", replay=None, unshrunk=ECHO)
    searched = [Searched(SHARED, LOCKSTEP, "failed", failures=(shrunk,)),
                Searched("no-loss", ("no-loss",), "failed", failures=(echo,)),
                _searched("fencing", ended="passed")]
    assert facts.CURRENT_REFUSED in PROPERTIES["no-loss"].explains  # else this tests nothing
    made = verdicts(["fencing", "no-loss"], Capabilities(), searched)
    assert (made["fencing"].verdict, made["no-loss"].verdict) == ("failed", "unknown")
    assert made["fencing"].failure is shrunk and made["fencing"].consequences == ("no-loss",)
    # a failure the no-loss search shrank itself is its own, as before
    searched[1] = Searched("no-loss", ("no-loss",), "failed", failures=(dataclasses.replace(echo, unshrunk=""),))
    assert verdicts(["fencing", "no-loss"], Capabilities(), searched)["no-loss"].verdict == "failed"


def test_a_consequence_keeps_its_counterexample_in_the_report():
    from harel_ref.certify._report import Report
    from harel_ref.certify._profiles import PROFILES as ENGINE_PROFILES

    searched = [_searched("fairness", Fact(facts.PASSED_OVER, "claim(...)", "g1", "g2")),
                _searched("no-loss", Fact(facts.DRAIN_DIFFERS, "drain", "['a']", "[]"))]
    made = verdicts(["fairness", "no-loss"], Capabilities(), searched)
    assert made["fairness"].failure.kind == facts.PASSED_OVER and made["fairness"].verdict == "unknown"
    report = Report("t", Capabilities(), False, ENGINE_PROFILES["quick"], 0, tuple(made.values()), 1.0, None)
    markdown = report.to_markdown()
    assert "## fairness: a consequence of no-loss's failure" in markdown and "Consequences: `fairness`" in markdown
    assert [f.kind for f in report.failures] == [facts.DRAIN_DIFFERS]  # the failures of failed properties


def test_the_replay_of_a_concurrent_failure_selects_what_judged_it():
    from harel_ref.stateful._properties import running

    assert running("concurrent", facts.RAISED_UNDER_CONTENTION) == "contention"  # errors are judged for it
    assert running("concurrent", facts.STALE_ACTED) == "fencing"
    assert running("concurrent", facts.NOT_HEAD) == "single-in-flight"  # fifo has no concurrent search
    assert running("fifo") == "fifo"


def test_the_time_column_shares_each_search_among_the_verdicts_it_stands_for():
    """Issue 44: each verdict's time is its share of the searches that stand for it, so the
    column sums to the searches' time: a shared search that passed is split among its
    properties, one that failed among all it covers (the focused searches decided), a focused
    search is its property's own, and the concurrent search is split among the four it judges."""
    caps = Capabilities()
    lockstep = tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep" and row.needs(caps) is None)
    concurrent = tuple(p for p, row in PROPERTIES.items() if row.concurrent)
    lost = Failure(Fact(facts.STALE_ACTED, "ack(lease)", "False", "True"), SHARED, ("state = M()",), "", None)
    runs = {
        "passed": [Searched(SHARED, lockstep, "passed", seconds=30.0),
                   *(Searched(p, (p,), "covered") for p in lockstep)],
        "passed, fencing left to its own": [
            Searched(SHARED, lockstep, "passed", seconds=30.0, undecided=("fencing",)),
            *(Searched(p, (p,), "passed" if p == "fencing" else "covered", seconds=4.0 if p == "fencing" else 0.0)
              for p in lockstep)],
        "failed": [Searched(SHARED, lockstep, "failed", seconds=20.0, failures=(lost,)),
                   *(Searched(p, (p,), "passed", seconds=3.0) for p in lockstep)],
    }
    for name, searched in runs.items():
        searched = [*searched, Searched("concurrent", concurrent, "passed", seconds=10.0)]
        made = verdicts(list(PROPERTIES), caps, searched)
        column = {prop: verdict.seconds for prop, verdict in made.items()}
        assert abs(sum(column.values()) - sum(s.seconds for s in searched)) < 1e-9, (name, column)
        assert column["contention"] == 10.0 / len(concurrent), name
        assert len({column[p] for p in lockstep if p not in concurrent and p != "fencing"}) == 1, (name, column)


def test_an_event_changed_into_another_groups_text_is_a_consequence_of_event_integrity():
    """A store that trims events turns '\\r' into '', which another group holds: the no-loss
    search sees a claim answer a message of another group (unknown-message), the event-integrity
    search a text no message has.  One bug: no-loss is event-integrity's consequence."""
    other_groups = Fact(facts.UNKNOWN_MESSAGE, "claim('w2', visibility=0.25, min_priority=0, routing_keys=None)")
    changed = Fact(facts.EVENT_CHANGED, "claim('drain', visibility=60.0, min_priority=0, routing_keys=None)")
    made = verdicts(["no-loss", "event-integrity"], Capabilities(),
                    [_searched("no-loss", other_groups), _searched("event-integrity", changed)])
    assert made["event-integrity"].verdict == "failed" and made["event-integrity"].consequences == ("no-loss",)
    assert made["no-loss"].verdict == "unknown", made["no-loss"].reason
    # a lost message is no changed event: event-integrity is no root of what no-loss owns alone
    lost = Fact(facts.DRAIN_DIFFERS, "drain: claim until None")
    made = verdicts(["no-loss", "event-integrity"], Capabilities(),
                    [_searched("no-loss", lost), _searched("event-integrity", changed)])
    assert made["no-loss"].verdict == made["event-integrity"].verdict == "failed"


def test_a_claim_answer_with_a_text_no_publish_was_given_is_an_event_changed():
    """claim_fact tells a changed event (R1: a text no publish was given) from the other wrong
    messages of a claimable group: another of its messages, one acked or stored twice, one
    another group holds (a text changed into a published one looks like these: the row explains
    them)."""
    from harel_ref.model import QueueModel, When
    from harel_ref.stateful._machine import claim_fact
    from harel_ref.transport import Lease

    model = QueueModel()
    model.publish("g1", " e")
    model.publish("g1", "f")
    model.publish("g2", "")
    now = When.of(1000.0)
    allowed = model.claim_outcomes(now)

    def kind(event, acked=False):
        return claim_fact(allowed, Lease("g1", event, 1, "w:1"), model, now, 0, None, acked=acked)

    assert kind("e") == facts.EVENT_CHANGED  # trimmed: no publish was given it
    assert kind(b" e") == facts.EVENT_CHANGED  # given back as bytes
    assert kind("f") == facts.NOT_HEAD
    assert kind("") == facts.UNKNOWN_MESSAGE  # g2's text: a message of another group, or one changed into it
    assert kind("f", acked=True) == facts.UNKNOWN_MESSAGE  # a message acked, handed out again
    # a message acked, or stored twice, comes back with its own text: no changed event
    model.publish("g4", "gone")
    model.take(model.head("g4"), "w:2", now, 5.0)
    assert model.ack("w:2", now)
    assert kind("gone") == facts.UNKNOWN_MESSAGE
    model.publish("g3", "e")
    assert kind("e") == facts.UNKNOWN_MESSAGE


def test_a_situation_the_shared_search_never_reached_is_left_to_the_propertys_own_search():
    """SPEC.md C5: after a shared search that passed, a property with a situation of its
    evidence the shared search never reached has its own search run; runs of programs, which
    only the concurrent search makes, do not count, nor what a wall clock cannot reach."""
    from harel_ref.stateful._properties import LEASE_END, LONG_EVENT, OVERLAP, PARK_ENDED, evidence, unreached
    from harel_ref.stateful._values import LONG

    caps = Capabilities(durable=True, shared=True)
    reached = dict.fromkeys(evidence("parking", caps), 3)
    assert unreached("parking", caps, reached) == ()
    assert unreached("parking", caps, {**reached, PARK_ENDED: 0}) == (PARK_ENDED,)
    assert OVERLAP in evidence("single-in-flight", caps)
    assert OVERLAP not in unreached("single-in-flight", caps, {})
    assert LEASE_END in unreached("lease-expiry", caps, {})
    assert LEASE_END not in unreached("lease-expiry", dataclasses.replace(caps, clock="wall"), {})
    assert LONG_EVENT in unreached("no-loss", caps, {})  # a transport that takes no long event never reaches one
    assert LONG_EVENT not in unreached("no-loss", dataclasses.replace(caps, event_bytes=LONG - 1), {})
