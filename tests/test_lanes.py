"""Runs of one program made several at once while they wait (harel_ref.stateful._lanes,
SPEC.md C9a): they come back in their order, a run that raised raises at its place, what each
lane kept is closed, no lane outlives the caller, and a store broken past three callers is
still caught when its runs overlap."""

import threading
import time

import pytest

from broken import WIDE, TakesThreeConnections, _round_trip, broken_backend
from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.stateful import _lanes
from harel_ref.stateful._lanes import LANES, MEASURED, runs_in_order, waited
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
    ledger = Ledger(seconds=lambda number: 0.002 if number <= MEASURED else 0.04 / number)
    got = list(runs_in_order(ledger.make, ledger.close, 30, here=lambda number: True))
    assert got == [(number, f"run {number}") for number in range(1, 31)]
    lanes = {ledger.made_by[number] for number in range(MEASURED + 1, 31)}
    assert len(lanes) > 1 and all(name.startswith("harel-ref-lane-") for name in lanes), lanes
    assert {ledger.made_by[number] for number in range(1, MEASURED + 1)} == {threading.current_thread().name}
    assert ledger.opened == ledger.closed and ledger.opened <= 1 + LANES
    assert lanes_alive() == []


def test_runs_made_elsewhere_are_not_measured_and_stay_one_at_a_time():
    # every run's branches in processes (here() False): this process's idle CPU says nothing
    ledger = Ledger()
    got = list(runs_in_order(ledger.make, ledger.close, 12, here=lambda number: False))
    assert [number for number, _ in got] == list(range(1, 13))
    assert set(ledger.made_by.values()) == {threading.current_thread().name}
    assert ledger.opened == ledger.closed == 1


def test_a_run_that_raised_raises_at_its_place_after_the_runs_before_it():
    ledger = Ledger(raise_at=9, seconds=lambda number: 0.03 if number < 9 else 0.001)
    got = []
    with pytest.raises(ValueError, match="run 9 raised"):
        for number, run in runs_in_order(ledger.make, ledger.close, 30, here=lambda number: True):
            got.append(number)
    assert got == list(range(1, 9))
    assert ledger.opened == ledger.closed
    assert lanes_alive() == []
    assert max(ledger.made_by) <= 9 + 2 * LANES  # the lanes ran no further ahead than their room


def test_a_caller_that_stops_early_ends_the_lanes_and_closes_what_they_kept():
    ledger = Ledger()
    made = runs_in_order(ledger.make, ledger.close, 200, here=lambda number: True)
    for number, _ in made:
        if number == 5:
            break
    made.close()
    assert lanes_alive() == []
    assert ledger.opened == ledger.closed
    assert max(ledger.made_by) <= 5 + 2 * LANES


@pytest.mark.parametrize("busy, wall, waits", [(0.0, 0.0, False), (0.001, 0.1, True), (0.024, 0.1, True),
                                               (0.025, 0.1, False), (0.1, 0.1, False)])
def test_runs_wait_when_they_kept_the_cpu_busy_under_a_quarter_of_their_time(busy, wall, waits):
    assert waited(busy, wall) is waits


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


def test_a_bug_only_the_overlapping_runs_meet_is_caught_at_its_run(monkeypatch):
    """The checker judges the runs the lanes made: on a store sound on its first namespace (the
    measured runs') and refusing a fourth caller on every later one (the lanes'), a program of
    four claims fails at a run a lane made."""
    seen, stores, first = lanes_seen(monkeypatch), {}, []

    def factory(clock, namespace):
        if not first:
            first.append(namespace)
        cls = RoundTrips if namespace == first[0] else TakesThreeConnections
        return cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    capabilities = broken_backend(sorted(WIDE)[0]).capabilities
    with pytest.raises(ConcurrencyFailure) as caught:
        check_program(factory, FOUR_CLAIMS, capabilities, repeats=30, contention=True, histories=True)
    assert caught.value.runs > MEASURED and seen
    assert len(stores) > 1
