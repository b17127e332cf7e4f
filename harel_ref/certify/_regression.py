"""A lockstep failure as a regression test in the transport's own calls (issue 44).

What a transport author fixes a bug against is a plain test: the calls that show it, with a
clock set by hand, failing today and passing once the bug is gone, that stays in their suite
without harel-ref.  :func:`regression_test` makes one from a shrunk lockstep failure:

- The failure's steps run once more, each transport the machine opens wrapped in a recorder
  (:class:`_Recorder`): every call the machine makes (open, publish, claim, ack, nack, close),
  its arguments as given, the clock it was made at, its answer, and what the specification
  allows there: a claim's outcomes, per the model; for the other calls the answer the machine
  judged right; at the call that diverged, the fact's expectation.  They run first on the
  shared machine, every property's fine print judged (the strict model: where the
  specification decides, one outcome per claim), so that a fixed transport, which takes the
  path the specification gives, meets every later expectation; where they fail otherwise
  there (the transport breaks another rule first), on the search's own focus machine, whose
  claims may allow several outcomes and whose later expectations follow the path taken.
- :mod:`._regression_text` writes those calls out as a ``def test_...():`` that imports the
  user's factory, the standard library and pytest (and the Protocol's ``Lease`` where a lease
  is made by hand before the transport handed one out).

A call that raised, panicked or ended its thread is written so that the test fails saying
what it raised; a call that hung, whose example has no steps, is replayed from its example's
choices (:mod:`._regression_hang`) and made on a thread the test leaves to it after the call
deadline.  A failure it cannot write is said so, and why (its reproduction, the machine's
steps, stays): one on a wall clock (no clock to set), and a few facts that no single call
shows.  A transport of harel's Protocol gets harel's calls: its
events as harel Events, made from the event texts as the checkers make them, no routing keys,
and acks and nacks whose answers go unjudged, as harel ignores them (SPEC.md R20).  A race's test is :mod:`._regression_race`'s.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import harel_ref.stateful._facts as facts
from harel_ref.stateful import Divergence
from harel_ref.stateful._facts import Fact
from harel_ref.stateful._async import current_limits
from harel_ref.stateful._harel import takes_namespace
from harel_ref.stateful._properties import PROPERTIES, SHARED, owner
from harel_ref.stateful._values import OnePass

from ._focus import focus_machine, shared_properties
from ._regression_hang import hung_calls
from ._reduce import replayed
from ._regression_text import Call, OneShot, Unwritable, written
from ._report import Failure
from ._target import Target

__all__ = ["regression_test", "with_regression"]

UNWRITTEN = {
    facts.DRAIN_DIFFERS: "the drain's messages differ as a whole, which no single call shows",
    facts.SEQ_CHANGED: "a lease's seq differs from an earlier one's, which the test would have to compare by hand",
    facts.SEQ_ORDER: "a lease's seq is out of order with an earlier one's, which the test would have to compare by hand",
}
"""The facts of a lockstep failure that get no regression test, and why."""

WALL_CLOCK = "the transport keeps its own time (a wall clock), which a test cannot set"


def with_regression(failure: Failure, target: Target, machine: type, hung: tuple = ()) -> Failure:
    """``failure``, a lockstep search's on the focus ``machine``, with its regression test, or
    why it has none.  ``hung``: for a call that hung, the choices of its example and the
    search's step count (:mod:`._regression_hang`)."""
    if failure.flaky:
        return failure
    prop = failure.found_by
    if prop not in PROPERTIES and failure.kind not in facts.FAULTS:  # the shared search's: its kind's owner
        prop = owner(failure.kind)
    try:
        if failure.steps:
            text, why = regression_test(target, machine, list(failure.steps), failure.fact, prop, failure.replay or "")
        elif failure.kind == facts.HUNG and hung and current_limits().deadline is not None:
            text, why = _hung_test(target, machine, failure.fact, prop, *hung)
        else:  # a search stopped before its failure was shrunk
            text, why = "", "its example has no steps"
    except Unwritable as exc:
        text, why = "", str(exc)
    return dataclasses.replace(failure, regression=text, no_regression=why)


def _hung_test(target: Target, machine: type, fact: Fact, prop: str, choices: tuple, step_count: int) -> tuple[str, str]:
    """The regression test of a call that hung, from its example's ``choices``."""
    if target.capabilities.clock == "wall":
        return "", WALL_CLOCK
    calls: list[Call] = []
    namespaces: set[str] = set()
    recording = _recording(machine, calls, namespaces, machine.__name__)
    try:
        calls = hung_calls(machine, choices, step_count, current_limits().deadline, recording, calls)
    finally:
        if (discard := getattr(target.factory, "discard", None)) is not None:
            for namespace in namespaces:
                discard(namespace)
    if not calls or f"hung: {calls[-1].method} " not in fact.answered:  # "hung: nack did not return ..."
        return "", "the call that hung did not hang again when its example was replayed"
    calls[-1].diverged = fact
    return written(calls, setup=target.setup, is_async=target.is_async, prop=prop, fact=fact,
                   opens=_factory_call(target.factory), harel=target.capabilities.protocol == "harel",
                   deadline=current_limits().deadline), ""


def regression_test(target: Target, machine: type, steps: list[str], fact: Fact, prop: str,
                    replay: str = "") -> tuple[str, str]:
    """The regression test of the lockstep failure ``fact`` that ``steps`` show on the focus
    ``machine``, as the text of a test module; or ``""`` and why there is none."""
    why = _unwritable(target, fact, steps)
    if why:
        return "", why
    strict = shared_properties(target.capabilities) and focus_machine(
        target.factory, SHARED, target.capabilities, is_async=target.is_async)
    for each in ([strict] if strict else []) + [machine]:
        calls = _recorded(target, each, steps, fact)
        if calls:
            break
    else:
        return "", "the steps did not fail the same way when replayed to write it"
    if calls[-1].method == "open" and calls[-1].raised is None:
        return "", "the failure came before any call of the transport"
    opens = _factory_call(target.factory)
    return written(calls, setup=target.setup, is_async=target.is_async, prop=prop, fact=calls[-1].diverged,
                   replay=replay, opens=opens, harel=target.capabilities.protocol == "harel"), ""


def _recorded(target: Target, machine: type, steps: list[str], fact: Fact) -> list[Call]:
    """The calls ``steps`` make on ``machine``, up to the one that showed ``fact`` (marked
    ``diverged``); empty if they do not show it there."""
    calls: list[Call] = []
    namespaces: set[str] = set()
    named = steps[0].removeprefix("state = ").removesuffix("()")  # the name the steps build it by
    try:
        found = replayed(_recording(machine, calls, namespaces, named), steps)
    finally:
        if (discard := getattr(target.factory, "discard", None)) is not None:
            for namespace in namespaces:
                discard(namespace)
    fault = fact.kind in facts.FAULTS  # then what the steps raised is a call's own error
    if not (isinstance(found, Divergence) and found.kind == fact.kind) and not (
            fault and any(call.raised is found for call in calls)):
        return []
    calls = calls[:_failing_call(calls, found) + 1]
    if calls:
        calls[-1].diverged = fact if fault else found.fact
    return calls


def _factory_call(factory: Any) -> str:
    """How :func:`~harel_ref.stateful._harel.call_factory` calls ``factory``, as source."""
    if not takes_namespace(factory):
        return "factory(clock)"
    try:
        parameter = inspect.signature(factory).parameters.get("namespace")
    except (TypeError, ValueError):
        parameter = None
    if parameter is not None and parameter.kind == inspect.Parameter.KEYWORD_ONLY:
        return "factory(clock, namespace=namespace)"
    return "factory(clock, namespace)"


def _failing_call(calls: list[Call], found: BaseException) -> int:
    """The index of the call that showed the failure: the last one before the divergence was
    raised, or the last call that raised what no step asked it to (a fault)."""
    if isinstance(found, Divergence):
        return getattr(found, "failed_at", len(calls)) - 1
    raised = [n for n, call in enumerate(calls) if call.raised is not None and call.refuses is None
              and not call.after_close]
    return raised[-1] if raised else len(calls) - 1


def _unwritable(target: Target, fact: Any, steps: list[str]) -> str:
    """Why the failure gets no regression test, or ``""``."""
    if not steps:
        return "its steps were not shrunk (a search cut short)"
    if target.capabilities.clock == "wall":
        return WALL_CLOCK
    return UNWRITTEN.get(fact.kind, "")


def _recording(machine: type, calls: list[Call], namespaces: set[str], name: str) -> type:
    """``machine``, under ``name``, with every transport it opens recorded into ``calls``, and
    the namespaces it opened them on in ``namespaces``."""

    class Recording(machine):
        def _open(self):
            namespaces.add(self.namespace)
            number = getattr(self, "opened", 0)
            self.opened = number + 1
            calls.append(opening := Call(number, "open", now=self.clock.now))
            try:
                return _Recorder(super()._open(), number, self, calls)
            except BaseException as exc:
                opening.raised = exc
                raise

        def _refused(self, error, case, method, *args):
            before = len(calls)
            try:
                super()._refused(error, case, method, *args)
            finally:
                for call in calls[before:]:
                    call.refuses = error

        def _queue_as_modelled(self, *args):
            return self._unrecorded(super()._queue_as_modelled, *args)

        def _unrecorded(self, check, *args):
            """A check's drain after a claim answered wrong: the certifier's, not a call the test makes."""
            before = len(calls)
            try:
                return check(*args)
            finally:
                del calls[before:]

        def _fail(self, *args, **kwargs):
            try:
                super()._fail(*args, **kwargs)
            except Divergence as divergence:
                divergence.failed_at = len(calls)  # the calls after it are the teardown's clean-up
                raise

    Recording.__name__ = Recording.__qualname__ = name
    return Recording


class _Recorder:
    """An opened transport, each of whose calls is recorded (:class:`Call`) with the clock it
    was made at and, for a claim, the outcomes the model allows then."""

    def __init__(self, transport: Any, number: int, machine: Any, calls: list[Call]) -> None:
        self._transport, self._number, self._machine, self._calls = transport, number, machine, calls
        self._closed = False  # its calls after its own close() must say so; another instance's need not

    def _made(self, method: str, args: tuple, kwargs: dict) -> Any:
        args = tuple(_fixed(arg) for arg in args)
        kwargs = {name: _fixed(value) for name, value in kwargs.items()}
        machine = self._machine
        call = Call(self._number, method, args, kwargs, now=machine.clock.now, after_close=self._closed)
        if method == "claim" and not call.after_close:
            call.allowed = _outcomes(machine, args, kwargs)
        self._calls.append(call)
        try:
            call.answer = getattr(self._transport, method)(*map(_given, args), **{k: _given(v) for k, v in kwargs.items()})
        except BaseException as exc:
            call.raised = exc
            raise
        return call.answer

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("publish", args, kwargs)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("claim", args, kwargs)

    def ack(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("ack", args, kwargs)

    def nack(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("nack", args, kwargs)

    def close(self) -> Any:
        try:
            return self._made("close", (), {})
        finally:
            self._closed = True


def _outcomes(machine: Any, args: tuple, kwargs: dict) -> frozenset | None:
    """What a claim with these arguments may answer now, per the machine's model: ``(group,
    event)`` or None for each outcome; None where the arguments are not a valid claim's."""
    min_priority = args[2] if len(args) > 2 else kwargs.get("min_priority", 0)
    keys = args[3] if len(args) > 3 else kwargs.get("routing_keys")
    if isinstance(keys, OneShot):
        keys = keys.items
    try:
        allowed = machine.model.claim_outcomes(machine._judged_now(), min_priority, keys)
    except (TypeError, ValueError):  # bad input: the call must raise, and _refused says which error
        return None
    return frozenset(None if outcome is None else (outcome.group_id, outcome.event) for outcome in allowed)


def _fixed(value: Any) -> Any:
    """``value`` as it can be recorded and given again: an iterator, which the call will use
    up, as the :class:`OneShot` of its items."""
    if isinstance(value, (OnePass, Iterator)) and not isinstance(value, (str, bytes)):
        return OneShot(list(value))
    return value


def _given(value: Any) -> Any:
    """What the transport is given for a recorded argument: a fresh iterator for a one-shot."""
    return iter(value.items) if isinstance(value, OneShot) else value

