"""A lockstep search in lanes (SPEC.md C2a): its examples several at once, read in lane order."""

import collections
import json
import ctypes
import re
import threading
import time

import pytest

from broken import broken_backend
from harel_ref.certify import Profile, certify
from harel_ref.certify import _driver, _engine, _search_lanes
from harel_ref.certify._target import Target
from harel_ref.stateful import Capabilities
from harel_ref.stateful._async import TransportHung, limit_calls
from harel_ref.transport import InMemoryStore, InMemoryTransport
from hypothesis.errors import FlakyStrategyDefinition
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
    assert search.wanted == 16  # what was asked of the lanes counted

    passed = _driver.Search(deadline=0.0, grace=0.0)
    _search_lanes._read_lanes(passed, [_searched(10, 10), _searched(9, 9)])
    assert passed.outcome() is None and (passed.examples, passed.clean) == (19, 19)


def test_a_lane_where_hypothesis_gave_up_does_not_hide_a_failure_after_it_and_a_hang_anywhere_breaks_the_search():
    gave_up = _searched(4, 4)
    gave_up.error = FlakyStrategyDefinition("draws inconsistent on a wall clock")
    hung = _searched(2, 2)
    hung.limits.declare(TransportHung("hung: claim did not return within 30 s"))
    lanes = [_searched(10, 10), gave_up, _searched(6, 4, failed=True), hung]
    search = _driver.Search(deadline=0.0, grace=0.0)
    _search_lanes._read_lanes(search, lanes)
    assert search.first is lanes[2].first and search.error is None
    assert (search.examples, search.clean, search.wanted) == (20, 18, 20)  # the lanes counted, asked and ran
    assert search.limits.broken is hung.limits.broken  # the passes after it do not call a hung transport

    alone = _driver.Search(deadline=0.0, grace=0.0)
    _search_lanes._read_lanes(alone, [_searched(10, 10), gave_up, _searched(9, 9)])
    assert alone.outcome() is gave_up.error and alone.examples == 14  # unknown, as a serial search would be


def test_a_lane_that_found_a_failure_halts_only_the_lanes_after_it_and_only_the_first_is_told():
    told = []
    search = _driver.Search(deadline=float("inf"), grace=0.0, on_found=lambda seen: told.append(seen))
    lanes = _search_lanes._Lanes(search, 4).searches
    assert not any(lane.halted() for lane in lanes)
    lanes[1].on_found(lanes[1])
    assert [lane.halted() for lane in lanes] == [False, False, True, True]
    lanes[3].on_found(lanes[3])  # its example ended after lane 1's failure: never shown
    lanes[0].on_found(lanes[0])
    assert told == [lanes[1], lanes[0]]  # a stopped run shows lane 0's, as the whole run would
    with pytest.raises(_driver.StopSearch):
        lanes[2].next_example()
    assert lanes[2].cut_short


# A stop raised in a thread may land inside a weakref callback, which swallows it (and pytest
# warns of it): that lane then stops at its next example, halted like the others.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_while_the_lanes_run_stops_every_lane(tmp_path):
    from harel_ref.certify._focus import focus_machine

    class Slow(InMemoryTransport):
        def claim(self, *args, **kwargs):
            calls.append(1)
            time.sleep(0.01)
            return super().claim(*args, **kwargs)

    calls, stores = [], {}

    def factory(clock, namespace):
        return Slow(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    search = _driver.Search(deadline=time.monotonic() + 600, grace=0.0)
    main = threading.main_thread()
    threading.Timer(2.0, lambda: ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(main.ident), ctypes.py_object(KeyboardInterrupt))).start()
    with _driver.hypothesis_apart(str(tmp_path)), limit_calls(30.0) as limits, pytest.raises(KeyboardInterrupt):
        search.limits = limits
        _search_lanes.run_lockstep(focus_machine(factory, "fifo", Capabilities()), Profile("lanes", 400, 20), 0,
                                   search, 400, lambda fact: False, lanes=4)
    assert calls, "the lanes never called the transport"
    assert not [t for t in threading.enumerate() if t.name.startswith("harel-ref-search-lane-")]
    made = len(calls)
    time.sleep(0.5)
    assert len(calls) == made  # nothing runs on after the stop


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


def _fifo_search(seed, examples, lanes, home):
    """The fifo machine of ``nack(0) to the back of its group`` searched at ``seed``: its steps."""
    from harel_ref.certify._focus import focus_machine

    backend = broken_backend("nack(0) to the back of its group")
    search = _driver.Search(deadline=time.monotonic() + 600, grace=0.0)
    with _driver.hypothesis_apart(str(home)), limit_calls(30.0) as limits:
        search.limits = limits
        _search_lanes.run_lockstep(focus_machine(backend.factory, "fifo", backend.capabilities),
                                   Profile("lanes", examples, 8), seed, search, examples, lambda fact: False, lanes)
    assert search.outcome() is not None
    return _driver.shrunk_steps(search.outcome())


def test_the_first_lane_that_failed_is_the_searchs_failure_whichever_lane_ended_first(tmp_path):
    lane_zero, lane_one = _fifo_search(0, 10, 1, tmp_path), _fifo_search("0/lane1", 10, 1, tmp_path)
    assert lane_zero != lane_one, "lanes 0 and 1 shrink to the same steps: this test cannot tell them apart"
    for _ in range(3):  # every lane fails, each at its own pace: lane 0's failure is the one shown
        assert _fifo_search(0, 40, 4, tmp_path) == lane_zero


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


def test_lanes_asked_for_are_checked_run_and_asked_for_again_by_the_replay(tmp_path, capsys):
    from harel_ref._cli import main

    backend = load("memory")(tmp_path)
    for bad in (0, 33, 2.0, True):
        with pytest.raises(ValueError, match="lanes must be a whole number from 1 to 32"):
            certify(backend.factory, backend.capabilities, lanes=bad)
    code = main(["certify", "--bundled", "memory", "--profile", "quick/2", "--only", "fifo", "--lanes", "3",
                 "--jobs", "1", "--report-dir", str(tmp_path / "reports")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "each lockstep search runs up to 3 examples at once, in lanes" in out.split("\n\n", 1)[0]
    data = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert "in 2 lanes, none diverged" in data["properties"][0]["reason"]  # quick/2: 25 examples, 2 of 10 or more
    assert data["replay"].endswith("--lanes 3"), data["replay"]
    with pytest.raises(SystemExit) as refused:
        main(["certify", "--bundled", "memory", "--lanes", "0"])
    assert refused.value.code == 2 and "--lanes: expected a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["rqlite", "rqlite-async", "harel-rqlite", "harel-rqlite-async"])
def test_the_bundled_rqlite_transports_run_in_four_lanes_unless_told_otherwise(name, tmp_path):
    """Their examples wait on HTTP round trips and Raft commits (docs/certify-speed.md), so their
    searches take lanes by default, and the replay asks for them again.  (Making the target
    reaches no node: the cluster is not needed.)"""
    from harel_ref.stateful.backends.rqlite import LANES

    target = Target.from_bundled(name, tmp_path)
    assert target.lanes == LANES == 4 and target.command("standard", 0).endswith("--lanes 4")
    assert Target.from_bundled("sqlite", tmp_path).lanes is None
