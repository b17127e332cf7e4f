"""A lockstep search in lanes (SPEC.md C2a): its examples several at once, read in lane order."""

import collections
import re

import pytest

from broken import broken_backend
from harel_ref.certify import Profile, certify
from harel_ref.certify import _driver, _engine, _search_lanes
from harel_ref.stateful import Capabilities
from harel_ref.stateful.backends import load


def _searched(examples, clean, failed=False, reached=None):
    search = _driver.Search(deadline=0.0, grace=0.0)
    search.examples, search.clean, search.wanted = examples, clean, examples
    search.reached = collections.Counter(reached or {})
    search.first = AssertionError(f"failed after {clean}") if failed else None
    return search


def test_the_lanes_are_read_in_lane_order_up_to_the_first_that_failed():
    lanes = [_searched(10, 10, reached={"a": 1}), _searched(6, 4, failed=True, reached={"b": 2}),
             _searched(3, 1, failed=True, reached={"c": 5}), _searched(9, 9)]
    search = _driver.Search(deadline=0.0, grace=0.0)
    _search_lanes._read_lanes(search, lanes)
    assert search.first is lanes[1].first  # not lane 2's, even if lane 2 failed first in time
    assert (search.examples, search.clean, search.lanes) == (16, 14, 4)  # lanes 0 and 1 only
    assert dict(search.reached) == {"a": 1, "b": 2}
    assert search.wanted == 28  # what was asked of all of them

    passed = _driver.Search(deadline=0.0, grace=0.0)
    _search_lanes._read_lanes(passed, [_searched(10, 10), _searched(9, 9)])
    assert passed.outcome() is None and (passed.examples, passed.clean) == (19, 19)


def test_a_lane_that_found_a_failure_halts_only_the_lanes_after_it():
    search = _driver.Search(deadline=float("inf"), grace=0.0)
    lanes = _search_lanes._lane_searches(search, 3)
    assert not any(lane.halted() for lane in lanes)
    lanes[1].on_found(lanes[1])
    assert [lane.halted() for lane in lanes] == [False, False, True]
    with pytest.raises(_driver.StopSearch):
        lanes[2].next_example()
    assert lanes[2].cut_short
    lanes[0].next_example()  # the lanes before it go on
    assert lanes[0].examples == 1


def test_only_a_wall_clock_search_runs_in_lanes_each_of_ten_examples_or_more():
    assert _search_lanes.lanes_for(Capabilities(clock="wall")) == _search_lanes.WALL_CLOCK_LANES
    assert _search_lanes.lanes_for(Capabilities()) == 1
    assert _search_lanes.lanes_of(8, 480) == 8
    assert _search_lanes.lanes_of(8, 40) == 4
    assert _search_lanes.lanes_of(8, 19) == 1


@pytest.fixture
def four_lanes(monkeypatch):
    """Lanes for any transport, so that an in-memory one (whose verdicts do not hang on the
    wall clock) shows what lanes do to a report."""
    monkeypatch.setattr(_engine, "lanes_for", lambda caps: 4)


def _seen(report):
    """The verdicts, reasons and steps, but the lease tokens (random)."""
    return [(v.property, v.verdict, re.sub(r"token='[^']*'", "token=…", v.reason), v.failure.steps if v.failure else None)
            for v in report.verdicts]


def test_a_bug_is_found_in_lanes_and_the_same_seed_gives_the_same_report(four_lanes):
    backend = broken_backend("nack(0) to the back of its group")
    profile = Profile("lanes", max_examples=60, step_count=12)
    first = certify(backend.factory, backend.capabilities, profile=profile, properties=["fifo"], jobs=1)
    again = certify(backend.factory, backend.capabilities, profile=profile, properties=["fifo"], jobs=1)
    assert first.verdict("fifo").verdict == "failed", first.to_markdown()
    assert _seen(first) == _seen(again)


def test_a_search_in_lanes_says_so(four_lanes, tmp_path):
    backend = load("memory")(tmp_path)
    report = certify(backend.factory, backend.capabilities, profile=Profile("lanes", 40, 10),
                     properties=["fifo", "parking"], jobs=1)
    assert {v.verdict for v in report.verdicts} == {"passed"}, report.to_markdown()
    assert "in 4 lanes, none diverged" in report.verdict("fifo").reason
