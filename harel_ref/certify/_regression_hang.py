"""The calls of an example whose call hung, for its regression test (:mod:`._regression`).

A call that hangs stops its search at once (the search thread is left to the call), so the
example is never shrunk and Hypothesis never prints its steps.  What is left of it are the
choices Hypothesis drew for it, up to the call (:meth:`~._driver.Search.hung_choices`).  They
are replayed here (:mod:`._choices`), once, with every transport the machine opens recorded,
under a deadline of their own: the replay makes the example's calls again up to the one that
hangs, which is abandoned at the deadline as the search's was.  So the test costs one more
call deadline.
"""

from __future__ import annotations

from typing import Any

from harel_ref.stateful._async import TransportHung, in_line_calls, limit_calls

from ._choices import run_choices
from ._regression_text import Call

__all__ = ["hung_calls"]


def hung_calls(machine: type, choices: tuple, step_count: int, deadline: float,
               recording: Any, calls: list[Call]) -> list[Call]:
    """Replay the example of ``choices`` on the ``recording`` machine (``machine`` with its
    calls recorded into ``calls``), ``step_count`` steps at most as in the search, each call
    under ``deadline``: the calls up to the one that hung again, or [] if none did."""
    def run_once() -> None:
        run_choices(recording, choices, step_count, [])  # the hang, or the example ending otherwise

    with limit_calls(deadline) as limits:
        if machine.backend.is_async:  # each call a task with its deadline: the hang raises in the step
            run_once()
        else:
            in_line_calls(run_once, limits)
        if limits.broken is None:
            return []
    hung = next((n for n, call in enumerate(calls) if isinstance(call.raised, TransportHung)), len(calls) - 1)
    return calls[:hung + 1]
