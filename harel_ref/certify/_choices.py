"""An example run again from the choices Hypothesis drew for it.

Two kinds of example end with a failure but without the steps Hypothesis prints for one:

- one whose call hung: its search thread was left to the call, so the example never ended
  (:mod:`._regression_hang` replays it for its regression test);
- one whose failure Hypothesis never saw: a step made the example invalid (the rule it drew
  was refused, or the data ran out), and the divergence the teardown's drain met afterwards
  was discarded with it (:func:`~._driver.unseen_failure`).

Either is run again, once, from its choices, with Hypothesis's ``reproduce_failure``, which
prints the steps as it runs them.
"""

from __future__ import annotations

import hypothesis
from hypothesis import HealthCheck, Phase, reproduce_failure, settings
from hypothesis.core import encode_failure
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

__all__ = ["run_choices"]


def run_choices(machine: type, choices: tuple, step_count: int, printed: list[str]) -> BaseException | None:
    """Run the example of ``choices`` on ``machine`` once, ``step_count`` steps at most as in
    the search; what it raised (an interrupt goes on up), or None.  The steps Hypothesis prints
    for it are appended to ``printed``, not shown (the reporter is the calling thread's)."""
    replay = reproduce_failure(hypothesis.__version__, encode_failure(choices))(machine)
    once = settings(max_examples=1, stateful_step_count=step_count, database=None, deadline=None,
                    phases=(Phase.explicit, Phase.reuse), suppress_health_check=list(HealthCheck), print_blob=False)
    with with_reporter(printed.append):
        try:
            run_state_machine_as_test(replay, settings=once)
        except Exception as exc:  # noqa: BLE001 - the failure, or Hypothesis saying the example ended otherwise
            return exc
    return None
