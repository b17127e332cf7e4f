"""The certifier's engine and Python API: a verdict per property, the right property failing,
counterexamples that replay, capabilities that gate, budgets that cut short."""

import dataclasses
import json
import os
import re
from pathlib import Path
import sys
import threading
import time

import pytest

from broken import (
    ALSO_BREAKS, BROKEN, FAULT_DEADLINE, FAULTS, FOUND_BY, HUNG_NACKS, OF_VALUES, PAST_SEARCHED_SIZES, broken_backend,
    fault_backend,
)
from facts_support import blamed, property_of
from harel_ref.certify import PROFILES, PROPERTIES, Profile, certify
from harel_ref.certify._probes import PROBE_SIZE
from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.stateful import Capabilities, Divergence
import harel_ref.stateful._facts as facts
from harel_ref.stateful._properties import (
    BRANCHES_IN_A_PROGRAM, GROUPS_AT_A_CLAIM, GROUPS_IN_FLIGHT, LEASE_LAPSED,
    MESSAGES_IN_A_GROUP, NACKS_OF_A_MESSAGE,
)
from harel_ref.stateful.backends import load

SMALL = Profile("small", max_examples=25, step_count=15)


def _verdicts(report):
    return {v.property: v.verdict for v in report.verdicts}


@pytest.mark.parametrize("name", ["memory", "memory-async", "sqlite", "sqlite-async", "libsql", "libsql-async"])
def test_bundled_transport_passes_every_property(name, tmp_path):
    backend = load(name)(tmp_path)
    report = certify(backend.factory, backend.capabilities, is_async=backend.is_async, profile=SMALL)
    assert _verdicts(report) == dict.fromkeys(PROPERTIES, "passed"), report.to_markdown()
    assert report.exit_code == 0


LUCKY = {"a re-created group keeps its place": range(3), "a bad delay frees the lease": range(3),
         "a later publish sets the priority": range(3), "nack reads the clock twice": range(3, 6)}
"""Variants the quick search finds at some seeds only; each gets several, and one must do.
Measured at seeds 0-7 once the searches drew the values of SPEC.md C13 (half the examples
with plain ids, everyday durations three to one): a re-created group keeping its place (claim
two groups at different times, empty and re-create the later one, claim again) at 5 of 8; a
later publish setting the priority and a bad delay that frees the lease at 6 of 8; a nack that
reads the clock twice at 6, a parked group claimable early and a priority floor ignored at 7;
the other twelve at 8 of 8 (135 of 144 runs).  Drawn with the far values as often as the
everyday ones, 111 of 144, and a re-created group at none of 8.  Once ids came from 1 or 2
families at once, a re-created group at 2 of 24 (3 of 24 before, seeds 0-23): it is searched at
the standard profile (:data:`STANDARD`), where it was found at 5 of 6.  Once a delay of 1.3 ms
and a step back to a lapsed lease's end were drawn too, a nack that reads the clock twice was
still found at 6 of 8, but no longer at seed 0; once half the meetings of near-collisions began
with a message in each id, at 9 of seeds 0-19 (3 to 6 and 9 to 12, 19), where it was 13 of 20."""

STANDARD = {"a re-created group keeps its place"}


LONGER = {"a re-created group keeps its place": 9}
"""Variants whose shortest counterexample of the form their search finds at some seed is longer
than 8 steps.  A re-created group keeping its place, with both of prefill's messages in one
group: prefill, publish to another group, claim and ack, claim it, advance, claim and ack the
second message, publish again (9; no one step of it can go, as tried at seed 0 once the
example's ids drew from every family alike).  With prefill's messages in two groups: 5 to 6."""


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_variant_fails_the_property_it_breaks(name):
    _, broken = BROKEN[name]
    backend = broken_backend(name)
    searched = [broken, *([FOUND_BY[name]] if name in FOUND_BY else [])]
    for run_seed in LUCKY.get(name, [0]):
        profile = "standard" if name in STANDARD else "quick"
        report = certify(backend.factory, backend.capabilities, profile=profile, properties=searched, seed=run_seed)
        verdict = report.verdict(broken)
        if verdict.verdict == "failed":
            break
    assert verdict.verdict == "failed", report.to_markdown()
    steps = [  # between `state = ...Machine()` and `state.teardown()`, but for the values chosen (C13)
        step for step in verdict.failure.steps[1:-1] if "state.begin(" not in step and "state.choose_keys(" not in step]
    assert len(steps) <= LONGER.get(name, 8), verdict.failure.reproduction  # none: found by the close checks at the end
    assert report.exit_code == 1


@pytest.mark.parametrize("name", ["events cut at 64 KiB"])
def test_a_variant_of_values_the_focused_search_catches_the_default_run_catches(name):
    """SPEC.md C5 and C13, on a sample of one, at a small profile (benchmarks/kill_times.py
    runs every variant both ways at standard): a bug of data that ``--only`` its property
    finds, the run of every property at once finds too, within 8 steps.  The sample is the
    cheapest of five tried (quick, quiet machine, focused and default): events cut at 64 KiB
    6.6 s and 9.3 s; a closed nack with a delay parks 0.2 s and 5.6 s but a close bug, no data;
    routing keys read twice 1.3 s and 17 s; group ids fold case 5.8 s and 29 s; routing keys
    split at commas 4 s and 24 s (69 s in the suite; tests/test_broken_variants.py keeps its
    machine test).  At the small profile both runs take 14.5 s of CPU (46 s at quick)."""
    _, prop = OF_VALUES[name]
    backend = broken_backend(name)
    focused = certify(backend.factory, backend.capabilities, profile=SMALL,
                      properties=[prop, *ALSO_BREAKS.get(name, ())])
    default = certify(backend.factory, backend.capabilities, profile=SMALL)
    for report in (focused, default):
        verdict = report.verdict(prop)
        assert verdict.verdict == "failed", report.to_markdown()
        steps = [step for step in verdict.failure.steps[1:-1]
                 if "state.begin(" not in step and "state.choose_keys(" not in step]
        assert len(steps) <= 8, verdict.failure.reproduction
    # one bug, one failure: the searches its changed events disturbed are its consequences
    assert {v.property for v in default.verdicts if v.verdict == "failed"} == {prop}, default.to_markdown()


PROBED = dataclasses.replace(SMALL, name="small, probed", probe=PROBE_SIZE)
"""SMALL with the probes of standard (SPEC.md C13a): a search that fails at a probe runs none of
Hypothesis's examples."""


@pytest.mark.parametrize("name", sorted(PAST_SEARCHED_SIZES))
def test_a_limit_past_the_sizes_searched_passes_the_searches_and_fails_at_a_probe(name):
    """SPEC.md C13a: a limit at about a thousand (999 groups listed as in flight, a page of
    1,000 groups, a group of 1,024 messages, a retry counter that gives up at the 1,000th nack)
    passes the property's search without the probes, and fails it at a probe, in a few steps
    that say the sizes; the verdict's evidence has the probe's sizes.  Its regression test makes
    the probe's thousand calls in loops (SPEC.md C14): a few dozen lines, not thousands, and it
    fails on the variant and passes on the reference."""
    from test_regression import run_test

    _, prop = PAST_SEARCHED_SIZES[name]
    backend = broken_backend(name)
    unprobed = certify(backend.factory, backend.capabilities, profile=SMALL, properties=[prop])
    assert unprobed.verdict(prop).verdict == "passed", unprobed.to_markdown()
    probed = certify(backend.factory, backend.capabilities, profile=PROBED, properties=[prop])
    verdict = probed.verdict(prop)
    assert verdict.verdict == "failed" and len(verdict.failure.steps) <= 8, probed.to_markdown()
    assert any(f"{PROBE_SIZE}" in step for step in verdict.failure.steps), verdict.failure.steps
    assert verdict.largest[GROUPS_AT_A_CLAIM] > PROBE_SIZE or verdict.largest[MESSAGES_IN_A_GROUP] >= PROBE_SIZE
    code = verdict.failure.regression
    assert code and len(code.splitlines()) < 150 and "for n in range(" in code, verdict.failure.no_regression or code
    assert run_test(code, backend.factory) is not None
    assert run_test(code, load("memory")(None).factory) is None


def test_the_probes_pass_a_correct_transport_and_reach_past_a_thousand():
    """The probes of standard on the in-memory reference: both pass, after Hypothesis's examples,
    which are the ones drawn without them; the evidence's sizes are the probes' (more than
    PROBE_SIZE groups at a claim, as many in flight at once, in one group, and nacks of one
    message), its counts of situations the examples' alone."""
    backend = load("memory")(None)
    probed = certify(backend.factory, backend.capabilities, profile=PROBED, properties=["fifo"])
    unprobed = certify(backend.factory, backend.capabilities, profile=SMALL, properties=["fifo"])
    for report, reached in ((probed, True), (unprobed, False)):
        largest = report.verdict("fifo").largest
        assert report.outcome == "passed", report.to_markdown()
        assert (largest[GROUPS_IN_FLIGHT] > PROBE_SIZE and largest[MESSAGES_IN_A_GROUP] >= PROBE_SIZE
                and largest[NACKS_OF_A_MESSAGE] >= PROBE_SIZE) is reached, largest
    assert probed.verdict("fifo").evidence == unprobed.verdict("fifo").evidence, (probed.verdict("fifo").evidence,
                                                                                 unprobed.verdict("fifo").evidence)


def test_a_bug_a_small_example_shows_is_shrunk_not_shown_at_a_probe():
    """The probes run after Hypothesis's examples (SPEC.md C13a): a nack that sends its message
    to the back is found and shrunk to a few steps, as without them.  (Run first, a probe showed
    it as a drain of 1,100 messages, and the verdict went to no-loss.)"""
    _, prop = BROKEN["nack(0) to the back of its group"]
    backend = broken_backend("nack(0) to the back of its group")
    report = certify(backend.factory, backend.capabilities, profile=dataclasses.replace(PROFILES["quick"], probe=PROBE_SIZE),
                     properties=[prop])
    failure = report.verdict(prop).failure
    assert failure is not None and len(failure.steps) <= 8, report.to_markdown()
    assert not any(str(PROBE_SIZE) in step for step in failure.steps), failure.steps


class _TwoLimitsPastTheSizesSearched(InMemoryTransport):
    """The groups in flight listed at 999 (single-in-flight) and a retry counter at the 1,000th
    nack (fifo): the first probe meets the first bug, the second probe the second."""

    class Core(PAST_SEARCHED_SIZES["gives up after 1,000 nacks"][0].Core,
               PAST_SEARCHED_SIZES["in-flight list cut at 999"][0].Core):
        pass


def test_a_probe_that_meets_a_bug_already_found_is_set_aside_and_the_next_probe_runs():
    """fifo's search fails first at the many-in-flight probe, on single-in-flight's bug; its next
    pass, with that bug taken as known, sets that probe aside and fails at the long group's
    (SPEC.md C5, C13a): fifo fails with its own probe.  (Probed once per search, it passed.)"""
    stores = {}
    factory = lambda clock, namespace: _TwoLimitsPastTheSizesSearched(  # noqa: E731
        clock=clock, store=stores.setdefault(namespace, InMemoryStore()))
    report = certify(factory, Capabilities(durable=True, shared=True), profile=PROBED, properties=["fifo"])
    verdict = report.verdict("fifo")
    assert verdict.verdict == "failed" and verdict.failure.kind == facts.NOT_HEAD, report.to_markdown()
    assert f"state.backlog(shape=(1, {PROBE_SIZE})" in "\n".join(verdict.failure.steps), verdict.failure.steps


def test_a_failure_whose_shrinking_reaches_the_shrink_limit_is_shown_as_found_and_says_so():
    """SPEC.md C10: a transport whose every call takes 20 ms once its bug has acted makes
    shrinking its failure take many seconds; with a limit of 0.5 s the search stops shrinking,
    and the report shows the failure as far as it got and why."""
    from broken import slow_nack_to_back

    report = certify(slow_nack_to_back, profile="quick", properties=["fifo"], shrink_limit=0.5, jobs=1)
    verdict = report.verdict("fifo")
    assert verdict.verdict == "failed", report.to_markdown()
    assert verdict.failure.unshrunk == "the shrink limit (0.5 s)"
    assert "Shrinking stopped at the shrink limit (0.5 s)" in report.to_markdown()
    with pytest.raises(ValueError, match="shrink_limit must be a positive number"):
        certify(slow_nack_to_back, properties=["fifo"], shrink_limit=0)


def test_one_broken_property_leaves_the_others_passed():
    from harel_ref.certify._profiles import standby_examples

    backend = broken_backend("unfenced ack")
    report = certify(backend.factory, backend.capabilities, profile="quick")
    assert _verdicts(report) == {**dict.fromkeys(PROPERTIES, "passed"), "fencing": "failed"}
    # the shared search found fencing's bug, searched again with fencing taken as broken, and
    # stands for what the examples it set aside could not count against (SPEC.md C5)
    stood = [v.reason for v in report.verdicts if v.reason.startswith("shared search: ")]
    assert stood and all("(searched again with fencing taken as broken, after " in reason for reason in stood), stood
    # those they could (a stale ack after the clock stepped back is lease-expiry's to blame)
    # were left to their own searches, which count the shared search's clean examples
    own = [v for v in report.verdicts if v.verdict == "passed" and not v.reason.startswith("shared search: ")
           and v.property != "contention"]
    assert own and all(re.search(r"beside the shared search's \d+ before its failure", v.reason) for v in own), \
        report.to_markdown()
    quick = Profile.named("quick")  # 50 examples: less one for every four of the shared search's, 13 at least
    assert [standby_examples(quick, before) for before in (0, 3, 8, 400)] == [50, 50, 48, 13]


def test_a_bug_every_drain_meets_leaves_the_calls_after_close_unjudged():
    """Every drain ends with a phantom lease (no-loss's bug) before the calls after close(),
    which raise errors that do not say so (close's).  close's search sets aside the examples
    whose drain met the phantom: they never reach their calls after close(), so close is not
    passed on them (it was, when any known fact in the teardown ended its example as judged)."""
    backend = broken_backend("a phantom on empty, closed without saying")
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["close"])
    assert report.verdict("close").verdict != "passed", report.to_markdown()


def test_one_bug_fails_one_property_and_the_searches_it_disturbed_go_on_without_it():
    """A queue that drops an event equal to one its group holds: no-loss fails, and the
    fairness, routing and close searches, which each met that lost message at some later step
    (a group passed over, or the drain), do not fail.  Each goes on with no-loss taken as broken
    (setting aside the examples that meet its facts) and decides its own property, or, where
    nearly every example met it, names it as the cause (SPEC.md C5).  Before, that default run
    failed eight properties, and then left them unknown."""
    backend = broken_backend("an event equal to one held is dropped")
    report = certify(backend.factory, backend.capabilities, profile=SMALL,
                     properties=["fairness", "routing", "no-loss", "close"])
    made = {v.property: v for v in report.verdicts}
    assert [p for p, v in made.items() if v.verdict == "failed"] == ["no-loss"], report.to_markdown()
    decided = [p for p in ("fairness", "routing", "close") if made[p].verdict == "passed"]
    for prop in ("fairness", "routing", "close"):
        if prop in decided:
            assert "more set aside: they met" in made[prop].reason and "taken as broken" in made[prop].reason
        else:
            assert made[prop].verdict == "unknown" and made[prop].reason.startswith("a consequence of no-loss's failure")
            assert prop in made["no-loss"].consequences
    # all three at seed 0 (and 1) of the small profile, 12 s of CPU (55 s at quick); at quick,
    # routing at its third pass (a change that cut that pass, reverted in da80a2d, left routing
    # unknown and passed this test while it asked for two)
    assert decided == ["fairness", "routing", "close"], report.to_markdown()
    assert report.exit_code == 1


def test_a_second_bug_is_not_set_aside_with_the_first():
    """The same queue, also trying groups in arrival order: fairness's search sets aside no
    example at a fact fairness could be blamed for, so it does not pass (its failure may be told
    as a consequence of no-loss's, whose bug also passes over groups: fix that first)."""
    backend = broken_backend("equal events dropped, fairness ignored")
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["fairness", "no-loss"])
    assert report.verdict("no-loss").verdict == "failed", report.to_markdown()
    fairness = report.verdict("fairness")
    assert fairness.verdict == "failed" or fairness.reason.startswith("a consequence of no-loss's failure: its search saw"), \
        report.to_markdown()
    assert fairness.failure is not None and fairness.failure.kind == facts.PASSED_OVER


def test_an_error_every_search_meets_fails_one_property_and_the_others_decide_their_own():
    """A store that raises at a group id with a NUL (harel's Postgres transports: psycopg's
    ``DataError``) raises in every search that draws one.  That is one bug: it fails one
    property (where the shared search met it, the first whose own search makes the step that
    raised), and every other search sets aside the examples that raise it and decides its own
    property (SPEC.md C5).  Before, the default run failed eight properties with the same
    counterexample."""
    backend = broken_backend("a group id with a NUL raises")
    report = certify(backend.factory, backend.capabilities, profile=SMALL)
    made = {v.property: v for v in report.verdicts}
    assert [p for p, v in made.items() if v.verdict == "failed"] == ["single-in-flight"], report.to_markdown()
    assert made["single-in-flight"].failure.kind == facts.RAISED
    assert "cannot contain NUL" in made["single-in-flight"].failure.answered
    assert made["single-in-flight"].failure.fact.call == "publish"
    assert {v.verdict for p, v in made.items() if p != "single-in-flight"} == {"passed"}, report.to_markdown()
    assert sum("already found" in v.reason for v in made.values()) >= 3, report.to_markdown()


def test_an_error_many_chosen_searches_meet_fails_the_first_and_the_others_search_again():
    """A run of chosen properties has no shared search: each focused search meets the error on
    its own.  It counts against the first of them in the table's order, and each search that
    stopped at it searches again with the examples that raise it set aside, so that every
    other property is decided (SPEC.md C5)."""
    backend = broken_backend("a group id with a NUL raises")
    chosen = ["fifo", "fairness", "no-loss", "event-integrity", "close"]
    report = certify(backend.factory, backend.capabilities, profile=SMALL, properties=chosen)
    made = {v.property: v for v in report.verdicts}
    assert [p for p, v in made.items() if v.verdict == "failed"] == ["fifo"], report.to_markdown()
    assert made["fifo"].failure.kind == facts.RAISED
    assert {v.verdict for p, v in made.items() if p != "fifo"} == {"passed"}, report.to_markdown()
    again = [p for p, v in made.items() if "searched again with the examples that raised RuntimeError" in v.reason]
    assert len(again) >= 2, report.to_markdown()


def test_an_error_only_a_probe_meets_is_set_aside_at_the_probe_too():
    """A claim that raises with more than 999 groups in flight: only the probes reach it, in
    every search that runs them.  It counts against the first chosen property; the other
    search sets its probe aside when it searches again, and passes.  (The probe's error failed
    that search again before, and its property was told as the first one's consequence.)"""
    backend = broken_backend("a claim past 999 groups in flight raises")
    report = certify(backend.factory, backend.capabilities, profile=PROBED, properties=["fifo", "no-loss"])
    made = {v.property: v for v in report.verdicts}
    assert made["fifo"].verdict == "failed" and "too many SQL variables" in made["fifo"].failure.answered, \
        report.to_markdown()
    assert made["no-loss"].verdict == "passed", report.to_markdown()
    assert "the examples that raised RuntimeError: too many SQL variables" in made["no-loss"].reason


def test_an_error_at_opening_a_second_instance_is_set_aside_as_a_steps_error():
    """Opening a second instance raises (a table created without IF NOT EXISTS).  The step
    that opens it lets the drain and the calls after close() run, and setting its example
    aside there ended the example as judged, with an error of the driver's own (a reviewer's
    finding).  Now it fails one property, at ``open``, and the lockstep searches that open a
    second instance set it aside and pass.  (The concurrent search opens one per branch: that
    is contention's, as any error it meets.)"""
    backend = broken_backend("a second open raises")
    report = certify(backend.factory, backend.capabilities, profile=SMALL)
    made = {v.property: v for v in report.verdicts}
    assert made["single-in-flight"].verdict == "failed" and made["single-in-flight"].failure.fact.call == "open", \
        report.to_markdown()
    for prop in ("priority-floor", "routing", "durability", "close"):
        assert made[prop].verdict == "passed" and "already found" in made[prop].reason, report.to_markdown()


def test_setting_an_error_aside_does_not_hide_a_second_bug():
    """The same store, also trying groups in arrival order: fairness still fails, with a group
    passed over, beside the error's one property."""
    backend = broken_backend("a group id with a NUL raises, fairness ignored")
    report = certify(backend.factory, backend.capabilities, profile=SMALL)
    made = {v.property: v for v in report.verdicts}
    assert made["fairness"].verdict == "failed" and made["fairness"].failure.kind == facts.PASSED_OVER, \
        report.to_markdown()
    assert made["single-in-flight"].verdict == "failed" and made["single-in-flight"].failure.kind == facts.RAISED
    assert "unknown" not in _verdicts(report).values(), report.to_markdown()


def test_after_the_shared_search_a_focused_search_sets_another_bug_aside_unshrunk_once():
    """The default run (SPEC.md C5): once the shared search has failed, each focused search sets
    aside, from its first example, every example that meets another property's bug, unshrunk,
    and tells the first of each as an echo; no focused search searches again.  (Before, each
    search shrank it first: the focused searches of "group ids fold case" spent 80 % of their
    time so.)  A fact the shrinker meets while a search shrinks its own failure is rejected and
    not told: told, tie-break's shrinking made fairness, whose own search passed, a consequence
    of no-loss's bug with no steps to show.  A consequence shows its own search's shrunk
    counterexample, or where the shared search stood for it, the one another search met, shrunk.
    (A kind a search's own property owns or explains is never set aside:
    ``anothers``, tests/test_properties.py.)  The small profile shows all this at seeds 0 and 1
    (25 s of CPU, 72 s at quick)."""
    backend = broken_backend("an event equal to one held is dropped")
    report = certify(backend.factory, backend.capabilities, profile=SMALL)
    no_loss = report.verdict("no-loss")
    assert no_loss.verdict == "failed" and not no_loss.failure.unshrunk, report.to_markdown()
    assert report.verdict("fairness").verdict == "passed", report.to_markdown()
    aside = [v for v in report.verdicts if v.verdict == "passed" and "more set aside: they met" in v.reason]
    assert any("a fact of no-loss's" in v.reason for v in aside), report.to_markdown()
    # one pass each (the shared search's second pass, a fact of no-loss's own kind found first, is its own)
    assert not any("searched again" in v.reason.split("shared search: ")[0] for v in report.verdicts), report.to_markdown()
    assert not [v.property for v in report.verdicts if v.failure is not None and v.failure.echo], report.to_markdown()
    consequences = [v for v in report.verdicts if v.reason.startswith("a consequence of")]
    assert consequences, report.to_markdown()
    for verdict in consequences:  # its own search's, or, where the shared search stood for it, the search's that met it
        assert verdict.failure.steps and not verdict.failure.echo, report.to_markdown()
    assert any(verdict.failure.found_by == verdict.property for verdict in consequences), report.to_markdown()


def test_a_bug_only_other_searches_met_is_shrunk_once_every_search_has_ended():
    """Where no search shrank a counterexample for a property that failed only by echoes (at
    seed 0 of a small profile, no-loss's own search misses a store that folds the case of group
    ids, and another search sets it aside), the search whose echo the verdict shows runs again,
    alone, to shrink it (SPEC.md C5): the verdict has steps and a regression test, not an echo.
    (Without the rerun: the echo, 0 steps.)  Which seed shows it moves whenever the searches
    draw other values (5, then 4, then 0 once publish_anew claimed after its publish, then 2
    once half the meetings of near-collisions began with a message in each id: no-loss's own
    search now finds it at 6 of seeds 0-9): the test takes the first of ten seeds at which
    no-loss's own search misses it, trying the last one known first."""
    backend = broken_backend("group ids fold case")
    for seed in (2, 0, 1, *range(3, 10)):
        report = certify(backend.factory, backend.capabilities, profile=SMALL, seed=seed)
        failure = report.verdict("no-loss").failure
        if failure is not None and failure.found_by != "no-loss":  # its own search passed: another shrank it
            break
    else:
        pytest.fail("no seed of 10 left the fold-case store to a search other than no-loss's")
    assert report.verdict("no-loss").verdict == "failed", report.to_markdown()
    assert not failure.echo and not failure.unshrunk and 3 <= len(failure.steps) <= 10, report.to_markdown()
    assert failure.regression, report.to_markdown()


def test_the_property_the_shared_search_blames_searches_all_its_examples():
    """The shared search's clean examples count for each focused search's, but for the
    property its failure counts against: that one's own search runs all its examples, for a
    counterexample in its own machine (SPEC.md C5; "leases in 32-bit milliseconds" shrank to 9
    steps in the shared machine, to 4 in lease-expiry's).  At seed 9 of a small profile the
    shared search finds routing broken on a store that splits routing keys at commas (at others
    it passes, and routing's own search runs as its top-up, C5): the test takes the first of
    ten seeds at which routing failed and the shared search stopped early: some other search
    ran and each that ran counted fewer than its examples (where the shared search's second
    pass, with routing taken as broken, passes, no other runs, which shows nothing), trying the
    last one known first.  Which seeds do moves whenever the
    searches draw other values (1, 2, then 9 once publish_anew always claimed)."""
    from harel_ref.certify._progress import Progress

    class Totals(Progress):
        def __init__(self):
            self.totals = {}

        def searching(self, prop, search, done, total):
            self.totals[prop, search] = total

    backend = broken_backend("routing keys split at commas")

    def others(progress) -> list[int]:  # the examples each other lockstep search counted
        return [total for (prop, search), total in progress.totals.items() if search == "lockstep" and prop != "routing"]

    for seed in (9, *range(9)):
        progress = Totals()
        report = certify(backend.factory, backend.capabilities, profile=SMALL, seed=seed, progress=progress)
        if report.verdict("routing").verdict == "failed" and others(progress) and \
                max(others(progress)) < SMALL.max_examples:
            break
    else:
        pytest.fail("at no seed of 10 did the shared search stop at the store that splits keys at commas")
    assert report.verdict("routing").verdict == "failed", report.to_markdown()
    assert progress.totals["routing", "lockstep"] == SMALL.max_examples, progress.totals
    # at least one other search ran, each counting the shared search's clean examples: never
    # true of no search at all (at seed 9: six searches of 19 examples)
    assert others(progress) and all(total < SMALL.max_examples for total in others(progress)), progress.totals


def test_a_fact_another_search_would_have_seen_is_the_bug_of_the_search_that_saw_it():
    """A floor of 3 or more that finds nothing: when every group above the floor had a lapsed
    lease it looks like lease-expiry's fact, but lease-expiry's own search passes; the fact is
    priority-floor's, and lease-expiry stands passed."""
    backend = broken_backend("a floor of 3 or more finds nothing")
    for run_seed in range(4):  # the quick priority-floor search finds it at 19 seeds of 30 (0-29)
        report = certify(backend.factory, backend.capabilities, profile="quick", properties=["lease-expiry", "priority-floor"],
                         seed=run_seed)
        if report.verdict("priority-floor").verdict == "failed":
            break
    assert _verdicts(report) == {"lease-expiry": "passed", "priority-floor": "failed"}, report.to_markdown()


def test_a_stale_release_that_raises_fails_fencing_alone():
    """An error from the ack or nack of a lease that is not current is fencing's (R10), whichever
    search made the call: before, the shared search gave it to the first property whose rules
    nack (fifo), as it found harel's SQS stale receipt handle."""
    backend = broken_backend("a stale ack or nack raises")
    # without priorities, routing keys and parking, whose searches nack no stale lease: the
    # shared search still covers every property that applies (SPEC.md C5), at two thirds the
    # cost; the small profile shows it at seeds 0 and 1 (10 s of CPU, 32 s at quick)
    caps = dataclasses.replace(backend.capabilities, priority=False, routing=False, parking=False)
    report = certify(backend.factory, caps, profile=SMALL)
    assert [v.property for v in report.verdicts if v.verdict == "failed"] == ["fencing"], report.to_markdown()
    assert report.verdict("fencing").failure.kind == facts.STALE_RAISED
    # a search that met the bug too (durability's, which nacks stale leases after a reopen) is
    # unknown as its consequence, never failed; the others passed
    applicable = [v for v in report.verdicts if v.verdict != "not applicable"]
    for v in applicable:
        if v.property != "fencing":
            assert v.verdict == "passed" or (v.verdict == "unknown" and v.reason.startswith(
                "a consequence of fencing's failure")), report.to_markdown()
    assert sum(v.verdict == "passed" for v in applicable) >= len(applicable) - 3, report.to_markdown()


# --- the shared lockstep search (SPEC.md C5) ---------------------------------------------------


def _replays(failure, factory) -> Divergence:
    code = failure.reproduction.replace("factory = ...", "factory = the_factory  #")
    with pytest.raises(Divergence) as caught:
        exec(compile(code, "<reproduction>", "exec"), {"the_factory": factory})
    return caught.value


def test_a_passing_shared_search_stands_for_the_focused_ones_and_reaches_what_they_reach(tmp_path):
    from harel_ref.certify._profiles import PROFILES as ENGINE_PROFILES
    from harel_ref.certify._driver import hypothesis_apart, run_search, Search
    from harel_ref.certify._focus import focus_machine

    backend = load("memory")(None)
    report = certify(backend.factory, backend.capabilities, profile="quick")
    lockstep = tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep")
    assert report.shared == lockstep and report.outcome == "passed"
    quick = ENGINE_PROFILES["quick"]
    assert f"a shared lockstep search of {quick.shared_examples} examples" in report.to_markdown()
    # each verdict lists the largest sizes its searches reached (SPEC.md C13), in both reports
    assert all(report.verdict(p).largest[GROUPS_AT_A_CLAIM] >= 2 for p in lockstep)
    assert "largest: groups at a claim " in report.to_markdown()
    shown = {v["property"]: v["largest"] for v in json.loads(report.to_json())["properties"]}
    assert shown["fifo"] == report.verdict("fifo").largest and shown["contention"][BRANCHES_IN_A_PROGRAM] >= 2
    topped_up = set()
    for prop in lockstep:
        verdict = report.verdict(prop)
        if "run since the shared search never reached" in verdict.reason:
            topped_up.add(prop)  # its own search ran too, and stands beside the shared one
            assert "; shared search: " in verdict.reason, verdict.reason
        else:
            assert verdict.reason.startswith("shared search: "), verdict.reason
        own = Search(deadline=time.monotonic() + 600, grace=0.0)  # what its focused search reaches
        with hypothesis_apart(str(tmp_path)):
            run_search(focus_machine(backend.factory, prop, backend.capabilities), quick, 0, own)
        assert own.outcome() is None
        for situation in PROPERTIES[prop].evidence:
            # Reached, if not as often: a situation the shared search never reached has the
            # property's own search run (at seed 0, quick: a claim after a park ended, which
            # parking's own search reaches 23 times, and a claim among 100 messages of one group)
            assert verdict.evidence[situation] > 0 or not own.reached[situation], (prop, situation)
    assert topped_up, "the quick shared search reaches every situation at seed 0: this test no longer shows the top-up"





def test_a_bug_only_the_shared_search_sees_fails_its_property():
    """A reopen that forgets priorities: durability's own search publishes at priority 0 only,
    and priority-floor's never reopens, so neither sees it; the shared search does, and the
    priority-floor check that trips after a reopen is durability's (quick finds it at 2 of seeds
    0-2, standard at 3 of 3; the small profile at 4 of seeds 1-16, 6 and 9 among them, once
    near-collisions started with a message each, 3 of 16 before; 10 s of CPU a seed, quick 46)."""
    backend = broken_backend("a reopen forgets priorities")
    alone = certify(backend.factory, backend.capabilities, profile=SMALL, seed=1,
                    properties=["durability", "priority-floor"])
    assert _verdicts(alone) == {"durability": "passed", "priority-floor": "passed"}
    assert alone.shared == ()  # not every lockstep property was chosen
    for run_seed in range(5, 10):  # one must do: the small profile finds it at some seeds only
        report = certify(backend.factory, backend.capabilities, profile=SMALL, seed=run_seed)
        if report.verdict("durability").verdict == "failed":
            break
    assert _verdicts(report) == {**dict.fromkeys(PROPERTIES, "passed"), "durability": "failed"}, report.to_markdown()
    failure = report.verdict("durability").failure
    # a forgotten priority shows at a claim with a floor: a group passed over (priority-floor),
    # or, where the group it did take had a lease that lapsed, that lapse not seen (lease-expiry)
    assert failure.found_by == "shared" and property_of(failure) in ("priority-floor", "lease-expiry")
    assert failure.step.endswith("  (after a reopen)")
    assert "focus_machine(factory, 'shared', " in failure.reproduction
    assert property_of(_replays(failure, backend.factory)) == property_of(failure)


def test_a_fault_in_the_shared_search_counts_against_the_first_property_that_makes_its_step():
    from harel_ref.certify._profiles import PROFILES as ENGINE_PROFILES
    from harel_ref.certify._entries import how_ended
    from harel_ref.certify._driver import Search
    from harel_ref.certify._target import Target
    from harel_ref.stateful._properties import SHARED

    backend = load("memory")(None)
    target = Target.from_factory(backend.factory, backend.capabilities, False)

    class Machine:
        def reopen(self):
            raise RuntimeError("the storage is gone")

    try:
        Machine().reopen()
    except RuntimeError as exc:
        error = exc
    ended, _, (failure,) = how_ended(SHARED, Search(deadline=0.0, grace=0.0, error=error), target,
                                  ENGINE_PROFILES["quick"], 0)
    assert ended == "failed"
    assert (failure.found_by, failure.kind, failure.fact.rule) == ("shared", facts.RAISED, "reopen")
    assert blamed(failure, SHARED) == "durability"
    assert failure.step == "state.reopen(...) raised"


def test_a_transport_that_acks_by_seq_has_no_shared_search():
    from harel_ref.certify import focus_machine
    from harel_ref.certify._focus import shared_properties

    by_seq = Capabilities(acks="by-seq")
    assert shared_properties(by_seq) == ()
    assert "fencing" in shared_properties(Capabilities()) and "durability" not in shared_properties(Capabilities())
    with pytest.raises(ValueError, match="acks by seq has no shared search"):
        focus_machine(load("memory")(None).factory, "shared", by_seq)


def test_counterexample_replays_as_printed():
    backend = broken_backend("nack(0) to the back of its group")
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["fifo"])
    failure = report.verdict("fifo").failure
    # the model's expectation beside the answer (which fifo check shows it depends on the shrink)
    assert failure.expected and failure.answered and failure.expected != failure.answered
    code = failure.reproduction.replace("factory = ...", "factory = the_factory  #")
    with pytest.raises(Divergence) as caught:
        exec(compile(code, "<reproduction>", "exec"), {"the_factory": backend.factory})
    assert property_of(caught.value) == "fifo"


def test_the_same_seed_finds_the_same_counterexample():
    backend = broken_backend("routing keys ignored")
    runs = [certify(backend.factory, backend.capabilities, profile="quick", properties=["routing"], seed=7)
            for _ in range(2)]
    assert runs[0].verdict("routing").failure.steps == runs[1].verdict("routing").failure.steps
    assert runs[0].seed == 7


def test_absent_capabilities_are_not_applicable_and_not_exercised():
    # This variant ignores min_priority: declared without priorities, no search may notice.
    backend = broken_backend("priority floor ignored")
    caps = Capabilities(priority=False, routing=False, parking=False, durable=False, fairness="unspecified")
    report = certify(backend.factory, caps, profile=SMALL)
    verdicts = _verdicts(report)
    for prop in ("priority-floor", "routing", "parking", "durability", "fairness", "tie-break"):
        assert verdicts.pop(prop) == "not applicable"
    assert set(verdicts.values()) == {"passed"}
    assert report.exit_code == 0


WALL = Capabilities(durable=True, shared=True, clock="wall")


def _on_the_wall_clock(cls):
    """A factory of ``cls`` that ignores the clock it is given (its server keeps time)."""
    stores = {}

    def factory(clock, namespace):
        return cls(clock=time.time, store=stores.setdefault(namespace, InMemoryStore()))

    return factory


def test_wall_clock_transport_is_certified_with_time_windows():
    report = certify(_on_the_wall_clock(InMemoryTransport), WALL, profile=Profile("tiny", 8, 10),
                     properties=["single-in-flight", "lease-expiry", "parking", "fencing"])
    assert _verdicts(report) == {
        "single-in-flight": "passed",
        "lease-expiry": "passed",  # judged in windows: no exact boundary, no step back
        "parking": "passed",
        "fencing": "passed",
    }, report.to_markdown()
    assert list(report.verdict("lease-expiry").evidence) == [LEASE_LAPSED]  # a lease's exact end: never on a wall clock


def test_wall_clock_certification_catches_a_lease_that_lasts_too_long():
    from broken import LeaseASecondTooLong

    report = certify(_on_the_wall_clock(LeaseASecondTooLong), WALL, profile=Profile("tiny", 40, 12),
                     properties=["lease-expiry"], time_budget=60)
    assert report.verdict("lease-expiry").verdict == "failed", report.to_markdown()


@pytest.mark.waits
def test_wall_clock_certification_still_catches_a_parking_bug():
    from broken import ParkedClaimableEarly

    # 40 examples: 15 stopped finding it once the examples drew their group ids (SPEC.md C13)
    report = certify(_on_the_wall_clock(ParkedClaimableEarly), WALL, profile=Profile("tiny", 40, 12),
                     properties=["parking"], time_budget=60)
    assert report.verdict("parking").verdict == "failed", report.to_markdown()


def test_time_budget_leaves_unknown_verdicts(tmp_path):
    backend = load("sqlite")(tmp_path)
    report = certify(backend.factory, backend.capabilities, profile="thorough", time_budget=0.5)
    verdicts = set(_verdicts(report).values())
    assert "unknown" in verdicts and "failed" not in verdicts
    assert report.exit_code == 3


def test_declared_capabilities_are_used_unless_given():
    stores = {}

    def factory(clock, namespace):
        return InMemoryTransport(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    factory.capabilities = Capabilities(priority=False, durable=True)
    report = certify(factory, profile=SMALL, properties=["priority-floor", "durability"])
    assert _verdicts(report) == {"priority-floor": "not applicable", "durability": "passed"}
    report = certify(factory, Capabilities(), profile=SMALL, properties=["priority-floor", "durability"])
    assert _verdicts(report) == {"priority-floor": "passed", "durability": "not applicable"}


def test_report_json_and_markdown(tmp_path):
    backend = broken_backend("unfenced ack")
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["fencing", "close"])
    json_path, md_path = report.write(tmp_path)
    data = json.loads(json_path.read_text())
    assert data["outcome"] == "failed" and data["exit_code"] == 1 and data["seed"] == 0
    by_property = {p["property"]: p for p in data["properties"]}
    assert by_property["fencing"]["failure"]["expected"] == "False"
    assert by_property["fencing"]["failure"]["answered"] == "True"
    markdown = md_path.read_text()
    assert "| fencing | strict | **failed**" in markdown and "```python" in markdown


def test_bad_arguments_say_how_to_fix_them():
    backend = load("memory")()
    with pytest.raises(ValueError, match="choose from"):
        certify(backend.factory, profile="fast")
    with pytest.raises(ValueError, match="choose from"):
        certify(backend.factory, properties=["speed"])
    with pytest.raises(TypeError, match="factory"):
        certify("not a factory")


def test_a_failure_after_a_reopen_is_not_blamed_on_durability_when_its_check_failed_alone():
    """A fact after a reopen is durability's (what a reopen broke shows later), unless the
    property that owns its kind failed in its own search without one: then durability's failure
    is a consequence of that one (SPEC.md C5)."""
    from harel_ref.certify._report import Failure
    from harel_ref.certify._verdicts import Searched, verdicts

    def searched(search, *found):
        return Searched(search, (search,), "failed" if found else "passed", "10 examples, none diverged",
                        failures=tuple(Failure(fact, search, (), "", None) for fact in found))

    not_head = facts.Fact(facts.NOT_HEAD, "claim(...)", "a", "b")
    after_reopen = facts.Fact(facts.NOT_HEAD, "claim(...)", "a", "b", after=(facts.REOPENED,))
    caps = Capabilities(durable=True)
    alone = verdicts(["fifo", "durability"], caps, [searched("fifo"), searched("durability", after_reopen)])
    assert (alone["fifo"].verdict, alone["durability"].verdict) == ("passed", "failed")  # fifo holds alone
    assert alone["durability"].reason == "claim(...) (after a reopen): the model allows a; the transport answered b"
    both = verdicts(["fifo", "durability"], caps, [searched("fifo", not_head), searched("durability", after_reopen)])
    assert (both["fifo"].verdict, both["durability"].verdict) == ("failed", "unknown")  # now it is fifo's bug
    assert both["fifo"].consequences == ("durability",)


@pytest.mark.waits
def test_a_crash_found_before_the_time_budget_runs_out_is_reported():
    crashed = threading.Event()

    class SlowThenCrashes(InMemoryTransport):
        """Fast until nack first crashes; then each open takes a second (the factory): the
        budget runs out while Hypothesis shrinks.

        Being fast until the crash leaves the budget to find it, however loaded the machine
        (the first example of a process also pays for imports and strategies: at load 5 a
        budget of 4 s ran out before the first example ended).  Each example the shrinker
        replays opens the transport, and it tries more than fifteen, so it cannot end within
        the budget; a slow call instead would make one replay of a backlog take minutes (the
        budget is checked between examples).
        """

        def nack(self, lease, delay=0):
            crashed.set()
            raise RuntimeError("nack is not implemented")

    stores = {}

    def factory(clock, namespace):
        if crashed.is_set():
            time.sleep(1.0)
        return SlowThenCrashes(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    report = certify(factory, Capabilities(durable=True, shared=True), profile="quick",
                     properties=["fifo"], time_budget=15.0)
    verdict = report.verdict("fifo")
    assert verdict.verdict == "failed", report.to_markdown()
    assert "RuntimeError: nack is not implemented" in verdict.failure.answered
    assert "Shrinking was cut short by the time budget" in report.to_markdown()


# --- the certifier survives anything a transport does (issue 12) ------------------------------


@pytest.fixture
def hung_calls_released():
    """Calls that hang in this test end when it is over (their threads were abandoned)."""
    from broken import RELEASE_HUNG

    RELEASE_HUNG.clear()
    yield
    RELEASE_HUNG.set()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # _thread.exit()
@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_transport_that_panics_hangs_or_kills_its_thread_fails_the_property_searched(name, hung_calls_released):
    """Each variant breaks only nack: fifo fails, named by what happened, and priority-floor
    (whose search never nacks) still gets its verdict."""
    cls, message = FAULTS[name]
    backend = fault_backend(name)
    HUNG_NACKS.clear()
    report = certify(backend.factory, backend.capabilities, is_async=backend.is_async, profile=SMALL,
                     properties=["fifo", "priority-floor"], call_deadline=FAULT_DEADLINE)
    fifo = report.verdict("fifo")
    assert fifo.verdict == "failed", report.to_markdown()
    assert fifo.failure.answered == message
    # the first hung call ends the search unshrunk: a nack at once, one with a delay, or one of
    # claims in a row that nack each lease at once
    assert fifo.reason in (f"state.{step}(...): {message}" for step in ("nack_now", "nack_later", "claim_many")), \
        fifo.reason
    assert report.verdict("priority-floor").verdict == "passed", report.to_markdown()
    if message.startswith("hung"):  # one hang per search, not one per shrink step, and one in
        # the replay of its example that writes its regression test (SPEC.md C14)
        assert HUNG_NACKS == {cls.__name__: 2}, HUNG_NACKS
        assert f"did not return within {FAULT_DEADLINE:g} s" in fifo.failure.regression, fifo.failure.no_regression


def test_a_fault_the_shared_search_stops_at_leaves_every_property_to_its_own_search():
    """A panic is no property's fact: the shared search that stops at it makes no second pass
    (it raised KeyError looking for the panic's owner, and the run ended with every verdict
    unknown), and the focused searches decide (SPEC.md C5)."""
    from broken import PanicsOnNackWhileOpen, _memory_factory

    caps = Capabilities(priority=False, routing=False, parking=False)
    # every search that nacks fails: what is asserted is which, not how short their examples
    # shrink (the test took 30 s of CPU with their shrinking, 8 s with it cut at half a second)
    report = certify(_memory_factory(PanicsOnNackWhileOpen), caps, profile=SMALL, shrink_limit=0.5)
    assert report.verdict("fifo").verdict == "failed", report.to_markdown()
    assert report.verdict("fifo").failure.kind == facts.PANICKED
    assert "unknown" not in _verdicts(report).values(), report.to_markdown()


@pytest.mark.skipif(sys.platform != "linux", reason="the worker processes are spawned and signalled the Linux way")
def test_a_branch_process_that_segfaults_fails_the_search_and_the_run_goes_on(tmp_path, monkeypatch):
    from broken import segfaults_in_a_branch_process

    monkeypatch.setenv("HAREL_BROKEN_DIR", str(tmp_path))
    report = certify(segfaults_in_a_branch_process, Capabilities(durable=True, shared=True),
                     profile=Profile("tiny", 10, 10, programs=5, repeats=3), properties=["contention", "fifo"],
                     processes=True)
    failure = report.verdict("contention").failure
    assert failure is not None, report.to_markdown()
    assert failure.kind == facts.CRASHED
    assert failure.answered.startswith("crashed: worker process died with SIGSEGV (branch process ")
    assert any("Claim()" in line for line in failure.steps)  # the program that crashed it, as found
    assert "not called again" not in report.to_markdown()  # the program is shown instead
    assert report.verdict("fifo").verdict == "passed"  # in this process: unharmed


def test_a_stopped_certification_raises_with_the_verdicts_so_far():
    from broken import interrupted_on_nack

    with pytest.raises(KeyboardInterrupt) as stopped:
        certify(interrupted_on_nack, profile=SMALL, properties=["priority-floor", "fifo", "close"])
    verdicts = {v.property: (v.verdict, v.reason) for v in stopped.value.report.verdicts}
    assert verdicts["priority-floor"][0] == "passed"
    assert verdicts["fifo"] == ("unknown", "interrupted: the certification was stopped by KeyboardInterrupt")
    assert verdicts["close"] == ("unknown", "not reached: the certification was stopped by KeyboardInterrupt")
    assert stopped.value.report.exit_code == 3


def test_a_failure_of_the_certifier_itself_raises_with_the_verdicts_so_far(monkeypatch):
    from harel_ref.certify import _passes

    ended = _passes.how_ended

    def ended_fails_for_close(search, *args, **kwargs):
        if search == "close":
            raise RuntimeError("a bug in the certifier")
        return ended(search, *args, **kwargs)

    monkeypatch.setattr(_passes, "how_ended", ended_fails_for_close)
    backend = load("memory")()
    with pytest.raises(RuntimeError, match="a bug in the certifier") as failed:
        certify(backend.factory, backend.capabilities, profile=SMALL, properties=["fifo", "close"])
    verdicts = {v.property: (v.verdict, v.reason) for v in failed.value.report.verdicts}
    assert verdicts["fifo"][0] == "passed"
    assert verdicts["close"] == ("unknown", "interrupted: the certifier failed: RuntimeError: a bug in the certifier")


def test_call_deadline_must_be_positive_seconds_or_none():
    backend = load("memory")()
    for bad in (0, -1.0, float("inf"), "30"):
        with pytest.raises(ValueError, match="call_deadline must be a positive number of seconds"):
            certify(backend.factory, properties=["close"], call_deadline=bad)
    report = certify(backend.factory, backend.capabilities, profile=SMALL, properties=["close"], call_deadline=None)
    assert report.verdict("close").verdict == "passed"  # calls made in-line, on this thread


# --- quick fits a slow transport (issue 12: rqlite at quick in under 120 s) --------------------


def test_quick_is_fitted_to_a_transport_too_slow_for_its_target():
    quick = PROFILES["quick"]

    def taking(times):  # a run of quick takes ``times`` its target, a smaller one less in proportion
        return lambda profile: times * quick.target * profile.max_examples / quick.max_examples

    assert quick.fitted(taking(2)) is quick  # within the margin: as it is
    fitted = quick.fitted(taking(2.9))
    assert fitted == Profile("quick/3", max_examples=17, step_count=20, programs=20, repeats=7)
    assert quick.fitted(taking(100)).name == "quick/8"  # no smaller than that
    assert PROFILES["standard"].fitted(lambda profile: 1e6) is PROFILES["standard"]  # no target: as asked
    assert Profile.named("quick/3") == fitted and Profile.named("thorough") is PROFILES["thorough"]
    assert Profile.named("quick/1").fitted(lambda profile: 1e6).name == "quick/1"  # asked for as it is: never fitted
    for bad in ("quick/0", "quick/x", "fast/2"):
        with pytest.raises(ValueError, match="unknown profile"):
            Profile.named(bad)


def test_quick_is_fitted_by_each_divided_profiles_own_estimate_where_searches_run_in_lanes():
    """harel's rqlite classes (acks by seq: no shared search) at 7 ms a call, in the 4 lanes of
    the bundled rqlite transports: quick's 50 examples run in 4 lanes, quick/3's 17 in one
    (each lane runs 10 or more, SPEC.md C2a).  Dividing quick's estimate by 3 took quick/3 to be
    under the target when its own estimate was 2.5 times it."""
    from harel_ref.certify._progress import Speed, estimate_seconds

    quick, caps = PROFILES["quick"], Capabilities.harel(durable=True, shared=True)

    def estimate(profile):
        return estimate_seconds(profile, caps, Speed(open=0.05, call=0.007), lockstep=12, parallel=1, jobs=2, lanes=4)

    fitted = quick.fitted(estimate)
    assert estimate(quick) / 3 <= quick.target < estimate(quick.divided(3))  # what the old division took for quick/3
    assert estimate(fitted) <= quick.target or fitted.name == "quick/8", (fitted.name, estimate(fitted))
    assert fitted.name != "quick/3"


def test_the_estimate_counts_the_calls_a_lockstep_search_makes():
    """The time estimate (and quick's fitting, which rests on it) counts a backlog's messages
    and a run of claims, not one call a step: on a transport whose every call is a round trip
    it was 6 times short (3 min 43 s estimated for rqlite at standard, which took 20 min)."""
    from harel_ref.certify._progress import Speed, estimate_seconds

    calls, stores = [0], {}

    class Counted:
        def __init__(self, transport):
            self.transport = transport

        def __getattr__(self, name):
            method = getattr(self.transport, name)
            if name not in ("publish", "claim", "ack", "nack"):
                return method

            def counted(*args, **kwargs):
                calls[0] += 1
                return method(*args, **kwargs)
            return counted

    def factory(clock, namespace):
        return Counted(InMemoryTransport(clock=clock, store=stores.setdefault(namespace, InMemoryStore())))

    caps = Capabilities(durable=True, shared=True)
    certify(factory, caps, profile="quick/1", properties=["fifo"])
    quick = PROFILES["quick"]
    expected = (estimate_seconds(quick, caps, Speed(open=0.0, call=1.0), lockstep=1, parallel=0)
                - estimate_seconds(quick, caps, Speed(open=0.0, call=0.0), lockstep=1, parallel=0))
    assert 0.67 < calls[0] / expected < 1.5, (calls[0], expected)  # 9,800 against 9,968 at seed 0


def test_the_preflight_times_the_fastest_of_its_tries():
    """The search processes start while the preflight times the transport, and on two cores
    their imports slowed a try of an in-memory transport 18 times: each figure is the fastest
    of its tries.  Here one open and one round of calls take a second more than the rest."""
    from harel_ref.certify._certify import preflight
    from harel_ref.certify._target import Target

    stores, opens, publishes = {}, [0], [0]

    class SlowOnce(InMemoryTransport):
        def publish(self, *args, **kwargs):
            publishes[0] += 1
            if publishes[0] == 3:  # the third timed round (the untimed open publishes nothing)
                time.sleep(1.0)
            return super().publish(*args, **kwargs)

    def factory(clock, namespace):
        opens[0] += 1
        if opens[0] == 3:  # the second timed open (the first open is not timed)
            time.sleep(1.0)
        return SlowOnce(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    factory.capabilities = Capabilities(durable=True, shared=True)
    speed = preflight(Target.from_factory(factory, None, False))
    assert opens[0] == 4 and publishes[0] >= 3
    assert speed.open < 0.3 and speed.call < 0.02, speed  # counted, the slow ones make 0.33 s and 0.04 s or more


def test_a_slow_transport_runs_quick_fitted_and_the_report_and_replay_say_so(monkeypatch, tmp_path):
    from harel_ref.certify import Progress, _certify, _progress
    from harel_ref.certify._target import Target

    monkeypatch.setattr(_certify, "preflight", lambda target: _progress.Speed(open=1.0, call=0.01))  # as if remote
    plans = []

    class Plans(Progress):
        def planned(self, plan):
            plans.append(plan)

    target = Target.from_bundled("memory", tmp_path)
    report = certify(target.factory, profile="quick", properties=["fifo"], progress=Plans(), _target=target)
    fitted = plans[0].profile
    assert plans[0].fitted_from is PROFILES["quick"] and fitted.name in ("quick/3", "quick/4")
    assert report.profile == fitted and report.verdict("fifo").verdict == "passed"
    assert report.verdict("fifo").examples < 35  # of 13 or 17 asked (quick: 50 asked, 52 run)
    assert f"--profile {fitted.name}" in report.replay  # the same searches again, however fast then
    report = certify(target.factory, profile="quick", properties=["fifo"], time_budget=60, _target=target)
    assert report.profile.name == "quick"  # a time budget is the caller's way to say how long


def test_shrinking_rejects_an_example_that_fails_another_property_than_the_first():
    """SPEC C7: once a search has found a failure, an example that fails with a fact another
    property owns is rejected (Hypothesis counts it invalid; called here by hand, outside
    Hypothesis, it is discarded), so shrinking cannot slip to it; a fact the same property owns
    is the failure, and may be the smaller one."""
    from harel_ref.certify._driver import Search, _Discarded, watched_machine

    from harel_ref.certify._focus import focus_machine
    from harel_ref.stateful._properties import owner

    backend = load("memory")(None)
    search = Search(deadline=time.monotonic() + 600, grace=0.0)
    state = watched_machine(focus_machine(backend.factory, "shared", backend.capabilities), search)()
    try:
        with pytest.raises(Divergence):
            state._fail(facts.CLAIMED_LEASED, "claim(...)", "None", "a lease")
        first = search.first
        assert owner(first.kind) == "single-in-flight" != owner(facts.NOT_HEAD)
        with pytest.raises(_Discarded):
            state._fail(facts.NOT_HEAD, "claim(...)", "the head", "another message")
        with pytest.raises(Divergence):  # single-in-flight's own kind: the failure itself
            state._fail(facts.CLAIMED_LEASED, "claim(...)", "None", "a lease")
        assert search.first is first
    finally:
        state.teardown()


def test_a_property_is_shrunk_once_per_search(monkeypatch):
    """SPEC C7: the clock that is not checked makes the transport raise from three lines, and
    make a claim answer wrongly: four kinds of failure to Hypothesis, each shrunk on its own,
    before every divergence was raised from one line with a type per property (seed 5: four
    shrinks).  Now one.  Counted through Hypothesis's internal ``ConjectureRunner.shrink``, with
    Hypothesis told to shrink every distinct bug (the certifier shrinks one per search since):
    one type per kind keeps them one bug even so."""
    from hypothesis import settings
    from hypothesis.internal.conjecture import engine

    from harel_ref.certify import _driver

    every_bug = _driver.search_settings
    monkeypatch.setattr(_driver, "search_settings", lambda *args: settings(every_bug(*args), report_multiple_bugs=True))

    shrunk = []
    original = engine.ConjectureRunner.shrink

    def counted(self, example, *args, **kwargs):
        shrunk.append(str(example.interesting_origin))
        return original(self, example, *args, **kwargs)

    monkeypatch.setattr(engine.ConjectureRunner, "shrink", counted)
    backend = broken_backend("the clock is not checked")
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=["bad-input"], seed=5)
    assert report.verdict("bad-input").verdict == "failed"
    assert len(shrunk) == 1, shrunk


def test_a_kind_of_fact_is_one_kind_of_failure_whatever_came_before_it():
    """C7: Hypothesis shrinks each type of exception apart.  One type per kind of fact, and
    none for what came before it (a reopen, a refused bad input): a failure that shows without
    those steps is the same failure, and shrinking drops them."""
    from harel_ref.stateful._machine import Divergence, divergence_class

    fifo, loss = divergence_class(facts.NOT_HEAD), divergence_class(facts.DRAIN_DIFFERS)
    assert fifo is divergence_class(facts.NOT_HEAD) and fifo is not loss
    assert issubclass(fifo, Divergence) and fifo.__name__ == loss.__name__ == "Divergence"
    after = fifo(facts.Fact(facts.NOT_HEAD, "claim(...)", after=(facts.REOPENED,)))
    assert type(after) is fifo and "[not-head] claim(...)  (after a reopen)" in str(after)


def test_an_error_that_says_the_transport_or_its_client_is_closed_is_what_close_asks_for():
    """R14 asks for TransportClosedError or an error saying it is closed: PyMongo's
    InvalidOperation('Cannot use MongoClient after close') says so (harel's Mongo transport)."""
    from harel_ref.stateful._machine import _says_closed

    class InvalidOperation(Exception):
        pass

    assert _says_closed(InvalidOperation("Cannot use MongoClient after close"))
    assert _says_closed(RuntimeError("the connection is closed"))
    assert _says_closed(type("ClosedResourceError", (Exception,), {})())  # the type says it (anyio)
    assert not _says_closed(RuntimeError("connection refused"))
    assert not _says_closed(ValueError("the closest group was chosen"))


def test_a_lockstep_search_whose_rules_change_between_runs_starts_afresh_and_is_judged(tmp_path, monkeypatch,
                                                                                        capsys):
    """On the wall clock the rules a step may take depend on timing, and Hypothesis stops a
    search whose draws it finds inconsistent (``FlakyStrategyDefinition``): the search starts
    afresh, with a seed of its own, for the examples left.  Played here by a rule that is
    offered on every other evaluation of its precondition: without fresh starts the search ends
    early and its verdict is unknown; with them it runs every example and passes.  The steps
    Hypothesis reports with it are kept in the error's notes, not printed on the certifier's
    output (where they came between the progress lines, 3 of 9 SQS runs)."""
    import itertools

    from hypothesis.stateful import precondition, rule

    from harel_ref.certify import _driver
    from harel_ref.certify._entries import how_ended
    from harel_ref.certify._driver import hypothesis_apart, run_search, Search
    from harel_ref.certify._focus import focus_machine
    from harel_ref.certify._target import Target

    backend = load("memory")(None)
    flips = itertools.count()

    class Inconsistent(focus_machine(backend.factory, "fifo", backend.capabilities)):
        @precondition(lambda self: next(flips) % 3 == 0)
        @rule()
        def now_and_then(self):
            pass

    target = Target.from_factory(backend.factory, backend.capabilities, False)
    quick = PROFILES["quick"]
    verdicts, errors = {}, {}
    for starts in (0, _driver.FRESH_STARTS):
        monkeypatch.setattr(_driver, "FRESH_STARTS", starts)
        search = Search(deadline=time.monotonic() + 600, grace=0.0)
        with hypothesis_apart(str(tmp_path)):
            run_search(Inconsistent, quick, 0, search)
        verdicts[starts], errors[starts] = (how_ended("fifo", search, target, quick, 0)[:2], search.examples), search.error
    (without, examples), (with_starts, all_examples) = verdicts[0], verdicts[_driver.FRESH_STARTS]
    assert without[0] == "unknown" and "FlakyStrategyDefinition" in without[1] and examples < quick.max_examples
    assert "Steps leading up to this error" in "\n".join(getattr(errors[0], "__notes__", []))
    assert "Steps leading up to" not in capsys.readouterr().out
    assert with_starts == ("passed", f"{all_examples} examples, none diverged"), with_starts
    assert all_examples >= quick.max_examples  # the examples that found the draws inconsistent count too


def test_a_stale_release_that_raises_is_shown_as_fencing_also_when_shrinking_is_cut_short(tmp_path):
    """The search keeps the first failure it sees, in case time runs out while it shrinks.  A
    stale release's error is filed by the machine as a divergence, ``stale-raised`` (R10): that
    is the failure kept, with the step that made it, not the transport's error it was filed
    from (which the report showed as "a step raised", as harel's SQS transports met it)."""
    from harel_ref.certify._entries import how_ended
    from harel_ref.certify._driver import hypothesis_apart, run_search, Search
    from harel_ref.certify._focus import focus_machine
    from harel_ref.certify._target import Target

    backend = broken_backend("a stale ack or nack raises")
    target = Target.from_factory(backend.factory, backend.capabilities, False)
    quick = PROFILES["quick"]
    search = Search(deadline=time.monotonic() + 600, grace=0.0)

    def cut_short_once_found(_):
        if search.first is not None:
            search.deadline = 0.0  # no shrinking: the failure kept is the one shown
    search.on_example = cut_short_once_found
    with hypothesis_apart(str(tmp_path)):
        run_search(focus_machine(backend.factory, "fencing", backend.capabilities), quick, 0, search)
    ended, _, failures = how_ended("fencing", search, target, quick, 0)
    assert ended == "failed" and search.cut_short
    (failure,) = failures
    assert failure.kind == facts.STALE_RAISED, failure
    assert failure.step.startswith(("ack(", "nack(")) and "StaleRelease" not in failure.step, failure.step


class ClaimsNothing(InMemoryTransport):
    """Every claim answers None: the teardown's drain of any example with a message diverges."""

    def claim(self, *args, **kwargs):
        return None


def test_a_failure_hypothesis_discarded_with_its_invalid_example_is_shown_with_its_steps(tmp_path):
    """A step can make an example invalid after its calls were made (the rule drawn refused by
    its filter, the data run out); the teardown's drain runs all the same, and Hypothesis
    discards what it raised with the example.  The search kept it as its first failure, and
    the report showed it with no steps and no regression test ("never-claimed groups first" at
    quick, seed 1, where the rule drawn was refused).  Played here by an invariant that marks
    every example invalid once a message is published, as a refused draw does: every drain
    diverges, and Hypothesis gives up.  The failure is run again from its choices, with its
    steps, fewest first (SPEC.md C7)."""
    from hypothesis.control import current_build_context
    from hypothesis.stateful import invariant

    from harel_ref.certify._entries import how_ended
    from harel_ref.certify._driver import hypothesis_apart, run_search, Search
    from harel_ref.certify._focus import focus_machine
    from harel_ref.certify._target import Target

    caps = Capabilities(priority=False, routing=False, parking=False, durable=False, shared=False)
    factory = lambda clock, namespace: ClaimsNothing(clock=clock)  # noqa: E731

    class RefusedOnceFilled(focus_machine(factory, "no-loss", caps)):
        @invariant(check_during_init=True)
        def refused_once_filled(self):
            if self.model.contents():
                current_build_context().data.mark_invalid("refused")  # frozen: what the teardown raises is discarded

    target = Target.from_factory(factory, caps, False)
    quick = PROFILES["quick"]
    search = Search(deadline=time.monotonic() + 600, grace=0.0)
    with hypothesis_apart(str(tmp_path)):
        run_search(RefusedOnceFilled, quick, 0, search)
    ended, _, (failure,) = how_ended("no-loss", search, target, quick, 0)
    assert ended == "failed" and failure.fact.step.startswith("claim('drain'"), failure.fact
    assert failure.steps[0] == "state = RefusedOnceFilled()" and failure.steps[-1] == "state.teardown()", failure.steps
    assert any("prefill" in step or "publish" in step for step in failure.steps), failure.steps
    assert len(failure.steps) <= 4, failure.steps  # fewest: the steps that publish, and no more


def test_a_failure_whose_shrinking_the_shrink_limit_stopped_is_shown_with_the_steps_it_was_found_with(tmp_path):
    """The shrink limit stops a search before Hypothesis reports the failure it is shrinking:
    the failure as found is shown, unshrunk, with the steps of the example that found it (run
    again from its choices), so that it gets its regression test."""
    from harel_ref.certify._entries import how_ended
    from harel_ref.certify._driver import hypothesis_apart, run_search, Search
    from harel_ref.certify._focus import focus_machine
    from harel_ref.certify._target import Target

    _, prop = BROKEN["nack(0) to the back of its group"]
    backend = broken_backend("nack(0) to the back of its group")
    target = Target.from_factory(backend.factory, backend.capabilities, False)
    quick = PROFILES["quick"]
    search = Search(deadline=time.monotonic() + 600, grace=600.0, shrink_limit=0.0)
    with hypothesis_apart(str(tmp_path)):
        run_search(focus_machine(backend.factory, prop, backend.capabilities), quick, 0, search)
    ended, _, (failure,) = how_ended(prop, search, target, quick, 0)
    assert ended == "failed" and search.shrink_cut and failure.unshrunk, failure
    assert failure.steps[0].startswith("state = ") and failure.steps[-1] == "state.teardown()", failure.steps
    assert any("nack" in step for step in failure.steps), failure.steps


def test_a_message_out_of_order_is_fifos_though_a_message_of_the_same_text_was_acked():
    """The machine names a claim answering a message acked before no-loss (handed out again);
    it knows the message by its seq, so a later message that only has the same text, handed
    out ahead of the head, is still a fifo failure (nack(0) sends the head to the back here)."""
    from harel_ref.certify._focus import focus_machine

    backend = broken_backend("nack(0) to the back of its group")
    machine = focus_machine(backend.factory, "fifo", backend.capabilities)()
    try:
        machine.prefill(messages=[("g1", "a", 0, None), ("g1", "x", 0, None), ("g1", "a", 0, None)])
        first = machine.claim_any(via=0, visibility=5.0, worker="w1")
        machine.ack(lease=first, via=0)  # 'a' (seq 1) is acked
        head = machine.claim_any(via=0, visibility=5.0, worker="w1")
        machine.nack_now(lease=head, via=0)  # 'x' goes to the back: the second 'a' comes first
        with pytest.raises(Divergence) as failed:
            machine.claim_any(via=0, visibility=5.0, worker="w1")
    finally:
        machine.teardown()
    assert failed.value.kind == facts.NOT_HEAD and "'a'" in failed.value.answered, failed.value


def test_a_certification_keeps_nothing_of_the_transport_once_it_returned():
    """What a certification made lives no longer than it: Hypothesis kept every machine class
    a search ran, and with it the factory and every store its transports made (an in-memory
    queue per namespace), so a pytest worker that certified many transports grew to 1.8
    million objects and spent up to a third of a test's time in the garbage collector walking them."""
    import gc
    import weakref

    backend = broken_backend("fairness ignored")
    factory = weakref.ref(backend.factory)
    report = certify(backend.factory, backend.capabilities, profile=SMALL, properties=["fifo", "fairness"])
    assert report.verdict("fairness").verdict == "failed", report.to_markdown()  # shrunk and replayed
    del backend
    gc.collect()
    assert factory() is None, [type(r).__name__ for r in gc.get_referrers(factory())]


def test_the_concurrent_searchs_passes_share_its_time_not_each_take_all_of_it(monkeypatch):
    """Each pass of the concurrent search after a failure gets what is left of the search's
    share, as the focused searches' passes do: a review found that every pass was given the
    whole share, so four passes could take four times the time the budget gave the search."""
    from harel_ref.certify import _passes
    from harel_ref.certify._report import Failure
    from harel_ref.certify._tasks import Found, Task
    from harel_ref.stateful._async import CallLimits

    now = [0.0]
    given = []

    def search_once(target, context, task, share, limits, event, pool, ignore, earlier):
        given.append(share)
        now[0] += 30.0  # each pass takes 30 s
        prop = ("single-in-flight", "fencing", None)[len(given) - 1]
        if prop is None:
            return Found("passed", "", 30.0, 10)
        fact = facts.Fact(sorted(PROPERTIES[prop].owns)[0], "b0: claim")
        return Found("failed", "", 30.0, 3, [Failure(fact, "concurrent", (), "", None)])

    monkeypatch.setattr(_passes, "_search_once", search_once)
    monkeypatch.setattr(_passes.time, "monotonic", lambda: now[0])
    task = Task("concurrent", "single-in-flight", judges=frozenset({"histories"}),
                covers=("single-in-flight", "fencing", "no-loss"))
    found = _passes._concurrent_passes(None, {}, task, 100.0, CallLimits(30.0), lambda *args: None, None, 0.0)
    assert given == [100.0, 70.0, 40.0]
    assert found.ended == "passed" and len(found.failures) == 2 and found.seconds == 90.0


def test_memory_limit_must_be_a_whole_number_of_bytes():
    from broken import slow_nack_to_back

    for bad in (0, -1, 1.5, "2G", True):
        with pytest.raises(ValueError, match="memory_limit must be a whole number of bytes"):
            certify(slow_nack_to_back, properties=["fifo"], memory_limit=bad)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the memory limit reads /proc (Linux)")
def test_the_memory_limit_counts_what_the_certification_started_not_what_was_there():
    """A process the caller started before the certification (a server a test suite runs) may
    grow during it, and start processes that grow: that is not the certification's memory
    (SPEC.md C11).  Here one grows by 250 MiB as the first search starts, and a process it
    forks by 250 MiB more; a 200 MiB limit does not stop the run."""
    import signal
    import subprocess
    from harel_ref.certify import MemoryLimitReached

    grower = subprocess.Popen([sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)

    def progress(prop, verdict):
        if verdict is None and grower.stdin is not None:  # the first search begins: they grow now
            grower.stdin.write("grow\n")
            grower.stdin.close()
            grower.stdin = None
            assert grower.stdout.readline() == "holding\n"

    backend = load("memory")(None)
    try:
        report = certify(backend.factory, backend.capabilities, profile="quick", properties=["close", "fifo"],
                         memory_limit=200 << 20, progress=progress, jobs=1)
    except MemoryLimitReached as stop:
        pytest.fail(f"stopped by the memory of processes it did not start: {stop}")
    finally:
        os.killpg(grower.pid, signal.SIGKILL)  # the grower and the process it forked
        grower.wait()
    assert report.verdict("close").verdict == report.verdict("fifo").verdict == "passed"


def test_a_certifications_processes_are_found_the_same_by_children_files_and_by_every_processs_parent():
    """The memory watch follows ``/proc/PID/task/*/children`` from the certifying process (a
    few reads); a kernel without those files gets the scan of every process's parent.  Both
    find the same processes: children and grandchildren, but none under one left out."""
    import subprocess
    from harel_ref.certify import _memory

    parents = [subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '30']);"
                                 " print('started', flush=True); sys.stdin.readline()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [parent.stdout.readline() for parent in parents] == ["started\n"] * 2
        grandchildren = [set(_memory._children(parent.pid)) for parent in parents]
        assert all(len(found) == 1 for found in grandchildren)
        everyone = _memory._children_of_all()
        for leaving in (set(), {parents[0].pid}):
            by_files = _memory.descendants(os.getpid(), leaving)
            found, pending = set(), everyone(os.getpid())
            while pending:
                if (pid := pending.pop()) not in leaving:
                    found.add(pid)
                    pending += everyone(pid)
            assert by_files == found
            assert {parents[1].pid, *grandchildren[1]} <= by_files
            assert ({parents[0].pid, *grandchildren[0]} <= by_files) == (not leaving)
            assert not ({parents[0].pid, *grandchildren[0]} & by_files) == bool(leaving)
    finally:
        for parent in parents:
            for pid in _memory._children(parent.pid):
                os.kill(pid, 9)
            parent.kill()
            parent.wait()


GROWER = """
import os, sys, time
sys.stdin.readline()
held = b"x" * (250 << 20)
if os.fork() == 0:
    held += b"y" * (250 << 20)
    print("holding", flush=True)
time.sleep(300)
"""
