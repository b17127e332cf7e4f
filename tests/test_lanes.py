"""Runs of one program made several at once while they wait (harel_ref.stateful._lanes,
SPEC.md C9a): they come back in their order, a run that raised raises at its place, what each
lane kept is closed, no lane outlives the caller, and a store broken past three callers is
still caught when its runs overlap."""

import threading
import time

import pytest

from broken import WIDE, ClaimsMarkedInThreeSlots, _round_trip, broken_backend
from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.stateful import _lanes
from harel_ref.stateful._async import limit_calls
from harel_ref.stateful._lanes import LANES, MEASURED, SeenBeside, runs_in_order, waited
from harel_ref.stateful.parallel import Claim, ConcurrencyFailure, Program, Publish, check_program


class Ledger:
    """A ``make`` whose runs sleep (they wait, using no CPU), each on a kept object that it
    counts as opened and closed, and which threads made which runs."""

    def __init__(self, raise_at: int | None = None, seconds=lambda number: 0.01) -> None:
        self.opened = self.closed = 0
        self.made_by: dict[int, str] = {}
        self.raise_at, self.seconds = raise_at, seconds
        self.lock = threading.Lock()

    def make(self, number, kept):
        if kept is None:
            with self.lock:
                self.opened += 1
            kept = object()
        time.sleep(self.seconds(number))
        with self.lock:
            self.made_by[number] = threading.current_thread().name
        if number == self.raise_at:
            self.close(kept)
            raise ValueError(f"run {number} raised")
        return f"run {number}", kept

    def close(self, kept) -> None:
        if kept is not None:
            with self.lock:
                self.closed += 1


def lanes_alive() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("harel-ref-lane-")]


def test_runs_that_wait_are_made_in_lanes_and_come_back_in_their_order():
    # later runs sleep less, so that they end before earlier ones begun in other lanes
    ledger = Ledger(seconds=lambda number: 0.01 if number <= MEASURED else 0.04 / number)
    got = list(runs_in_order(ledger.make, ledger.close, 30, here=lambda number: True))
    assert got == [(number, f"run {number}", number <= MEASURED) for number in range(1, 31)]
    lanes = {ledger.made_by[number] for number in range(MEASURED + 1, 31)}
    assert len(lanes) > 1 and all(name.startswith("harel-ref-lane-") for name in lanes), lanes
    assert {ledger.made_by[number] for number in range(1, MEASURED + 1)} == {threading.current_thread().name}
    assert ledger.opened == ledger.closed and ledger.opened <= 1 + LANES
    assert lanes_alive() == []


def test_runs_made_elsewhere_are_not_measured_and_stay_one_at_a_time():
    # every run's branches in processes (here() False): this process's idle CPU says nothing
    ledger = Ledger()
    got = list(runs_in_order(ledger.make, ledger.close, 12, here=lambda number: False))
    assert [(number, alone) for number, _, alone in got] == [(number, True) for number in range(1, 13)]
    assert set(ledger.made_by.values()) == {threading.current_thread().name}
    assert ledger.opened == ledger.closed == 1


def test_a_run_that_raised_beside_others_raises_at_its_place_after_the_runs_before_it():
    ledger = Ledger(raise_at=9, seconds=lambda number: 0.03 if number < 9 else 0.001)
    got = []
    with pytest.raises(SeenBeside, match="run 9, made beside others") as caught:
        for number, _, _ in runs_in_order(ledger.make, ledger.close, 30, here=lambda number: True):
            got.append(number)
    assert got == list(range(1, 9))
    assert isinstance(caught.value.__cause__, ValueError) and str(caught.value.__cause__) == "run 9 raised"
    assert ledger.opened == ledger.closed
    assert lanes_alive() == []
    assert max(ledger.made_by) <= 9 + 2 * LANES  # the lanes ran no further ahead than their room


def test_a_caller_that_stops_early_ends_the_lanes_and_closes_what_they_kept():
    ledger = Ledger()
    made = runs_in_order(ledger.make, ledger.close, 200, here=lambda number: True)
    for number, _, _ in made:
        if number == 5:
            break
    made.close()
    assert lanes_alive() == []
    assert ledger.opened == ledger.closed
    assert max(ledger.made_by) <= 5 + 2 * LANES


@pytest.mark.parametrize("busy, wall, waits", [
    (0.0, 0.0, False),  # nothing measured (the second run's branches in processes)
    (0.001, 0.1, True), (0.024, 0.1, True), (0.025, 0.1, False), (0.1, 0.1, False),
    (0.0001, 0.004, False),  # a run of 4 ms (the in-memory store's take about 1 ms) is not worth lanes
])
def test_a_run_waited_when_it_took_a_while_and_kept_the_cpu_busy_under_a_quarter_of_it(busy, wall, waits):
    assert waited(busy, wall) is waits


def test_no_lanes_for_fewer_runs_than_lanes_left():
    ledger = Ledger()
    list(runs_in_order(ledger.make, ledger.close, MEASURED + LANES - 1, here=lambda number: True))
    assert set(ledger.made_by.values()) == {threading.current_thread().name}


def test_one_lane_makes_every_run_in_the_calling_thread():
    ledger = Ledger()
    list(runs_in_order(ledger.make, ledger.close, 10, here=lambda number: True, lanes=1))
    assert set(ledger.made_by.values()) == {threading.current_thread().name}


FOUR_CLAIMS = Program(prefix=(Publish("g1", "e1"), Publish("g2", "e2")),
                      branches=((Claim(),), (Claim(),), (Claim(),), (Claim(),)))


def lanes_seen(monkeypatch) -> set[str]:
    """The names of the lanes that begin from now on."""
    seen: set[str] = set()
    real = _lanes._Lanes._lane

    def lane(self):
        seen.add(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(_lanes._Lanes, "_lane", lane)
    return seen


@pytest.mark.parametrize("name", sorted(WIDE))
def test_overlapping_runs_do_not_meet_each_other(name, monkeypatch):
    """Each lane's runs are on namespaces of their own: a store broken past three callers at
    once, whose every call waits a round trip, passes three claims at once in every run while
    four lanes make them, and fails four at once."""
    backend, seen = broken_backend(name), lanes_seen(monkeypatch)
    three = Program(prefix=FOUR_CLAIMS.prefix, branches=FOUR_CLAIMS.branches[:3])
    assert check_program(backend.factory, three, backend.capabilities, repeats=30, contention=True,
                         histories=True) == 30
    assert len(seen) == LANES, "runs of three round trips at once wait, and overlap"
    with pytest.raises(ConcurrencyFailure):
        check_program(backend.factory, FOUR_CLAIMS, backend.capabilities, repeats=30, contention=True,
                      histories=True)


class RoundTrips(InMemoryTransport):
    """The reference store, every branch call a round trip (as the WIDE variants' are)."""

    def _trip(self, call, *args, **kwargs):
        _round_trip()
        return call(*args, **kwargs)

    def claim(self, *args, **kwargs):
        return self._trip(super().claim, *args, **kwargs)


def namespaces_after_the_first(first_cls, later_cls):
    """A factory whose first namespace (the measured runs') is a ``first_cls`` store and every
    later one (the lanes') a ``later_cls`` store."""
    stores, first = {}, []

    def factory(clock, namespace):
        if not first:
            first.append(namespace)
        cls = first_cls if namespace == first[0] else later_cls
        return cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    return factory


def test_a_bug_only_the_overlapping_runs_meet_is_caught_at_its_run(monkeypatch):
    """The checker judges the runs the lanes made: on a store sound on its first namespace (the
    measured runs') and whose claims share a table of three slots on every later one (the
    lanes'), four claims at once fail at a run a lane made."""
    seen = lanes_seen(monkeypatch)
    factory = namespaces_after_the_first(RoundTrips, ClaimsMarkedInThreeSlots)
    capabilities = broken_backend(sorted(WIDE)[0]).capabilities
    with pytest.raises(ConcurrencyFailure) as caught:
        check_program(factory, FOUR_CLAIMS, capabilities, repeats=30, histories=True)
    assert caught.value.runs > MEASURED and seen


class ServerOfThreeConnections(InMemoryTransport):
    """A server that takes 3 connections at once across all its namespaces, each claim holding
    one for a round trip: its limit is the server's, so runs at once on other namespaces take
    connections from each other."""

    LOCK, IN_USE = threading.Lock(), [0]

    def claim(self, *args, **kwargs):
        with self.LOCK:
            if self.IN_USE[0] >= 3:
                raise ConnectionError("too many connections: the server takes 3")
            self.IN_USE[0] += 1
        try:
            _round_trip()
            return super().claim(*args, **kwargs)
        finally:
            with self.LOCK:
                self.IN_USE[0] -= 1


def test_what_only_runs_at_once_on_one_server_show_is_not_blamed(monkeypatch):
    """Three claims at once never exceed three connections; beside three other lanes' runs they
    do, as refused branch claims and as drains that raise.  What a lane's run showed is
    confirmed by the runs made again one at a time, which show nothing, so the program passes."""
    seen = lanes_seen(monkeypatch)
    three = Program(prefix=FOUR_CLAIMS.prefix, branches=FOUR_CLAIMS.branches[:3])
    factory = namespaces_after_the_first(RoundTrips, ServerOfThreeConnections)
    capabilities = broken_backend(sorted(WIDE)[0]).capabilities
    assert check_program(factory, three, capabilities, repeats=30, contention=True, histories=True) == 30
    assert seen


class HangsInALane(InMemoryTransport):
    """A claim made from a lane's thread (a drain beside other runs) hangs a second; a branch's
    claim waits 50 ms, so that a run plainly waits, call threads and all (at 10 ms, the call
    deadline's thread hops kept a quiet machine busy a quarter of a run, and no lane began)."""

    def claim(self, *args, **kwargs):
        caller = threading.current_thread().name
        if "harel-ref-lane-" in caller:
            time.sleep(1.0)
        elif "harel-ref-branch-" in caller:
            time.sleep(0.05)
        return super().claim(*args, **kwargs)


def test_a_hang_beside_other_runs_breaks_nothing_of_the_callers(monkeypatch):
    """A lane keeps call limits of its own: its hang is a run seen beside others, made again one
    at a time (where it does not hang), and the caller's limits stay whole."""
    seen, stores = lanes_seen(monkeypatch), {}

    def factory(clock, namespace):
        return HangsInALane(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    three = Program(prefix=FOUR_CLAIMS.prefix, branches=FOUR_CLAIMS.branches[:3])
    with limit_calls(0.3) as limits:
        assert check_program(factory, three, broken_backend(sorted(WIDE)[0]).capabilities, repeats=12,
                             histories=True) == 12
    assert seen and limits.broken is None


def test_on_a_wall_clock_a_program_gets_as_many_lanes_as_runs_are_left_up_to_eight():
    from harel_ref.stateful._lanes import LANES, LANES_ON_A_WALL_CLOCK, lanes_of_runs, run_slots

    assert [lanes_of_runs(repeats, wall=True) for repeats in (3, 6, 7, 9, 10, 30)] == [LANES, 4, 5, 7, 8, 8]
    assert lanes_of_runs(30, wall=False) == LANES and LANES_ON_A_WALL_CLOCK == 8
    # the first two one after another, then the rest in lanes, where as many runs are left
    assert run_slots(30, 8) == 2 + 28 / 8 and run_slots(9, 7) == 3.0 and run_slots(5, 4) == 5.0
    assert run_slots(30, 1) == 30.0 and run_slots(1, 8) == 1.0
