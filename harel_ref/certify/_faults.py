"""The fact of an exception out of the transport: a *fault*, no answer the spec allows (an
error it never asks for, a panic, a crash, a hang), the machine rule it was raised in and the
transport's method that raised it.

The report tells each fault a search found so; the lockstep driver sets aside an example at an
error (a ``raised`` fact) already found, in another search or an earlier pass
(:func:`harel_ref.certify._verdicts.fault_owners`, SPEC.md C5)."""

from __future__ import annotations

import traceback

from harel_ref.stateful._async import TransportCrashed, TransportHung, TransportPanic
import harel_ref.stateful._facts as facts
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._machine import FOCUS_RULES, RULES, StorageFailed, TransportMachine

__all__ = ["fault_fact", "step_fault_fact"]


def fault_fact(error: BaseException, where: str, rule: str | None = None) -> Fact:
    """The fact of an exception out of the transport, met ``where``: ``raised`` and
    ``ValueError: ...`` for an ordinary one; ``panicked``, ``crashed`` or ``hung`` and the
    fault's own message (which says so) for a fault."""
    kind, answered = _exception_outcome(error)
    # a storage failure met again when its example was replayed (C15) is never met in a step
    call = "" if isinstance(error, StorageFailed) else _raising_call(error)
    return Fact(kind, f"{where}{' raised' if kind == facts.RAISED else ''}", "an answer or error the spec allows",
                answered, rule=rule, call=call)


def _exception_outcome(error: BaseException) -> tuple[str, str]:
    """The kind of fact an exception out of the transport is, and the answer it shows."""
    if isinstance(error, StorageFailed):  # met again at the same call when its example was replayed
        cause = error.__cause__
        return facts.RAISED, (f"{type(cause).__name__}: {cause}, again at the same call when the example was "
                              "replayed: not a storage failing now and then (R17), but the transport (R19)")
    for fault, kind in ((TransportPanic, facts.PANICKED), (TransportCrashed, facts.CRASHED),
                        (TransportHung, facts.HUNG)):
        if isinstance(error, fault):
            return kind, str(error)
    return facts.RAISED, f"{type(error).__name__}: {error}"


def step_fault_fact(error: BaseException) -> Fact:
    """The fact of ``error``, raised out of a lockstep machine's step (or its teardown), with
    the rule it was raised in."""
    return fault_fact(error, _raising_step(error), rule=_raising_rule(error))


def _raising_step(error: BaseException) -> str:
    """The machine rule (or teardown) during which ``error`` was raised, as the report shows it."""
    name = _raising_rule(error)
    if name is None:
        return "a step"
    return "opening the transport" if name == "__init__" else f"state.{name}(...)"


def _raising_rule(error: BaseException) -> str | None:
    """The name of the machine rule (or ``teardown``, ``__init__``) that raised ``error``."""
    names = set(RULES) | set(FOCUS_RULES) | {"begin", "choose_keys", "teardown", "__init__"}
    found = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)
             if frame.f_code.co_name in names and "self" in frame.f_locals]
    if not found:
        return None
    # a storage failure, raised in its step, is raised again by the teardown that ends its example
    return found[-1] if isinstance(error, StorageFailed) else found[0]


def _raising_call(error: BaseException) -> str:
    """The transport's method that raised ``error`` through a lockstep machine's ``_call``, or
    ``open`` through its ``_open``, the innermost such frame; "" where there is none (the
    transport's ``close()``, which the machine calls directly): then no search sets the error
    aside (:meth:`~harel_ref.certify._driver._Watching._fault_aside` sees only those two)."""
    found = ""
    for frame, _ in traceback.walk_tb(error.__traceback__):
        name, local = frame.f_code.co_name, frame.f_locals
        if name not in ("_call", "_open") or not isinstance(local.get("self"), TransportMachine):
            continue
        found = getattr(local.get("method"), "__name__", "") if name == "_call" else "open"
    return found
