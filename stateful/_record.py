"""One recorded call: the unit of a history (:mod:`harel_ref.stateful.history`), which the
linearizability checker (:mod:`harel_ref.stateful._linearize`) and the timelines read.  In a
module of its own so that the checker and the history module need not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harel_ref.transport import StorageError

__all__ = ["Record", "error_text"]


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

    @property
    def did_nothing(self) -> bool:
        """The call raised StorageError, which changed nothing (R17; see :func:`error_text`)."""
        return self.error is not None and self.error.startswith(("StorageError(", "StorageError: "))


def error_text(error: BaseException, text: str | None = None) -> str:
    """How a record keeps a call's error: ``text`` (by default ``Class(message)``), named
    ``StorageError`` first when its class is a subclass of it (a backend's own, such as rqlite's
    request that no node took).  R17 says a call that raised StorageError changed nothing, and
    the checker reads that from the name: kept under its own, such a call was judged as one of
    unknown outcome (it may have acted), and a transport that raised one after it had acted
    passed."""
    text = f"{type(error).__name__}({error})" if text is None else text
    if isinstance(error, StorageError) and not text.startswith("StorageError"):
        return f"StorageError: {text}"
    return text
