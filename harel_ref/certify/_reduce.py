"""Steps taken away from a shrunk lockstep counterexample, one at a time (SPEC.md C7).

Hypothesis shrinks a stateful failure by its draws, and can stop at a plateau where every
smaller draw it tries changes the failure: a store that ignores trailing spaces came out as
fifteen ``publish_each`` steps where one fails the same way.  So, after Hypothesis, each
step is taken away in turn, the last first, and the example replayed as its printed steps read
(what the report's reproduction runs); where it still fails for the same property, the step
stays out.  Passes repeat until one takes nothing away, or the search's time is up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from harel_ref.stateful import Divergence
from harel_ref.stateful._properties import owner

__all__ = ["fewer_steps", "replayed", "without_steps"]


def fewer_steps(steps: list[str], index: int) -> list[str]:
    """``steps`` (``state = ...`` first, ``state.teardown()`` last) without the step at
    ``index`` of those between."""
    body = steps[1:-1]
    return [steps[0], *body[:index], *body[index + 1:], steps[-1]]


def replayed(machine: type, steps: list[str]) -> BaseException | None:
    """Run ``steps`` as the reproduction does, with ``machine`` under the name its first step
    builds; what a step or the teardown raised, or None.  A step that raised is followed by the
    teardown all the same, so that the example's transports are closed."""
    namespace = {machine.__name__: machine}
    try:
        exec(steps[0], namespace)  # noqa: S102 - the steps Hypothesis printed for this machine
    except Exception as failure:  # the transport would not open
        return failure
    state = namespace["state"]
    try:
        for step in steps[1:-1]:
            exec(step, namespace)  # noqa: S102
    except Exception as failure:
        with contextlib.suppress(Exception):
            state.teardown()
        return failure
    try:
        state.teardown()
    except Exception as failure:
        return failure
    return None


def without_steps(failure: Divergence, steps: list[str], replay: Callable[[list[str]], BaseException | None],
                  stopped: tuple[type[BaseException], ...] = ()) -> Divergence:
    """``failure`` (found with ``steps``) as the fewest steps that ``replay`` still fails for
    the same property, with those steps in its notes (where the report reads them).  An
    exception of ``stopped`` out of ``replay`` (the search's time is up) ends the taking away
    with what it has taken so far."""
    smallest, shown = steps, failure
    changed = True
    while changed:
        changed = False
        # the last step first; taking one away leaves the indices before it as they were
        for index in reversed(range(len(smallest) - 2)):
            candidate = fewer_steps(smallest, index)
            try:
                found = replay(candidate)
            except stopped:
                changed = False
                break
            if isinstance(found, Divergence) and owner(found.kind) == owner(failure.kind):
                smallest, shown, changed = candidate, found, True
    if shown is not failure:
        shown.add_note("\n".join(smallest))
    return shown
