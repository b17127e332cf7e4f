"""One recorded call: the unit of a history (:mod:`harel_ref.stateful.history`), which the
linearizability checker (:mod:`harel_ref.stateful._linearize`) and the timelines read.  In a
module of its own so that the checker and the history module need not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Record"]


@dataclass
class Record:
    """One call: who made it, when it started and ended, with what, and what it answered.

    ``complete`` is None when no answer came (it raised, or the process died): the call may or
    may not have taken effect.  ``result`` is JSON data: a claim's lease is a dict with
    ``group_id``, ``event``, ``seq``, ``token``; ack/nack answer a bool.
    """

    worker: str
    op: str
    invoke: float
    args: dict[str, Any]
    complete: float | None = None
    result: Any = None
    error: str | None = None
    id: str = ""
    at: float | None = None  # the transport's clock when it was frozen; None: [invoke, complete]

    @property
    def ok(self) -> bool:
        """The call returned (no error, answer known)."""
        return self.complete is not None and self.error is None
