"""Steps taken away from a shrunk lockstep counterexample (SPEC.md C7, harel_ref/certify/_reduce.py):
Hypothesis can leave steps a failure does not need, and replaying the printed steps without
each one in turn finds the ones it does."""

import pytest

from broken import broken_backend
from harel_ref.certify import focus_machine
from harel_ref.certify._reduce import replayed, without_steps
from harel_ref.stateful import Divergence
from harel_ref.stateful import _facts as facts
from harel_ref.stateful._facts import Fact

# As the single-in-flight search left a store that ignores trailing spaces at seed 0: fifteen
# publish_each steps, of which one fails the same way.  (The pair in the other order, ``g``
# first, starts with a message in each id, and the failure would need no step but the initial
# ones: ``begin``, and ``choose_keys`` where begin ran first, whose keys its messages wait for.)
PLATEAU = [
    "state = SingleInFlightMachine()",
    "groups_0, groups_1 = state.begin(group_ids=['g ', 'g'], clock=1000.0)",
    "keys_0, keys_1 = state.choose_keys(routing_keys=['blue', 'green'])",
    "(groups_2,) = state.prefill(messages=[('g1', '', 0, None)])",
    "state.open_second_instance()",
    *["state.publish_each(events='numbered', via=0)"] * 15,
    "state.claim_many(count=4, then='hold', via=0, visibility=0.25)",
    "state.teardown()",
]


def _machine(name: str):
    backend = broken_backend(name)
    return focus_machine(backend.factory, "single-in-flight", backend.capabilities, is_async=False)


def test_the_steps_a_failure_does_not_need_are_taken_away():
    machine = _machine("group ids pad spaces")
    found = replayed(machine, PLATEAU)
    assert isinstance(found, Divergence), found
    replays = []

    def replay(steps):
        replays.append(steps)
        return replayed(machine, steps)

    smallest = without_steps(found, PLATEAU, replay)
    steps = str(smallest.__notes__[-1]).splitlines()
    assert steps == ["state = SingleInFlightMachine()",
                     "groups_0, groups_1 = state.begin(group_ids=['g ', 'g'], clock=1000.0)",
                     "state.publish_each(events='numbered', via=0)",
                     "state.teardown()"], steps
    assert isinstance(replayed(machine, steps), Divergence)
    assert len(replays) <= 3 * len(PLATEAU)  # a pass per step taken away would be 20 times more


def test_a_step_whose_absence_passes_or_fails_another_property_stays():
    """A transport that is right passes every replay: nothing is taken away, and the failure
    given is returned as it was."""
    machine = _machine("group ids pad spaces")
    found = replayed(machine, PLATEAU)
    assert without_steps(found, PLATEAU, lambda steps: None) is found
    assert isinstance(replayed(machine, ["state = AnotherMachine()", "state.teardown()"]), NameError)
    other = Divergence(Fact(facts.TIE_ORDER, "claim(...)"))  # another property's: not this failure
    assert without_steps(found, PLATEAU, lambda steps: other) is found


def test_the_search_stopping_ends_the_taking_away_with_what_it_has():
    machine = _machine("group ids pad spaces")
    found = replayed(machine, PLATEAU)
    calls = []

    def replay(steps):
        calls.append(steps)
        if len(calls) > 3:
            raise KeyboardInterrupt  # as the search's StopSearch
        return replayed(machine, steps)

    smaller = without_steps(found, PLATEAU, replay, stopped=(KeyboardInterrupt,))
    steps = str(smaller.__notes__[-1]).splitlines()
    assert len(steps) == len(PLATEAU) - 3, steps  # each of the three replays took a step away
    assert isinstance(replayed(machine, steps), Divergence)
    with pytest.raises(KeyboardInterrupt):
        without_steps(found, PLATEAU, replay)  # not a stop it was told of: it goes on up
