"""The lockstep machine must catch every broken variant, and name the property it breaks."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from broken import BROKEN, broken_backend
from stateful import Divergence, make_machine


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_machine_catches_broken_variant(name):
    _, broken_property = BROKEN[name]
    machine = make_machine(broken_backend(name))
    with pytest.raises(Divergence) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(max_examples=500, stateful_step_count=20, derandomize=True, database=None, deadline=None,
                              report_multiple_bugs=False),
        )
    assert caught.value.property == broken_property, str(caught.value)
