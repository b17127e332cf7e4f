"""Calls made at once, judged by harel-ref's checker: the one helper a race's regression test
imports (issue 44, SPEC.md C14).

A lockstep failure's regression test needs nothing of harel-ref: its calls and the answers the
specification allows are written out.  A race's does: whether a run of calls made at once is
right depends on the order they took effect in, which only a linearizability checker can tell.
:func:`check_at_once` takes the calls as plain data, in the Protocol's terms, and runs them as
the concurrent search did (:func:`~harel_ref.stateful.parallel.check_program`):

- ``prefix``: calls made one after another first;
- ``branches``: one list of calls per branch, each branch on a thread of its own (a task, for
  an asyncio transport), or with ``processes=True`` in a process of its own, all started
  together;
- repeated ``runs`` times, each time on an empty queue, until the checker refuses a run.

A call is a tuple: ``("publish", group_id, event)``, ``("claim",)`` (a plain claim for the
run's visibility), ``("ack", lease)``, ``("nack", lease)`` or ``("nack", lease, delay)``, and in
the prefix only ``("lapse",)`` (the clock moves past every lease and park taken so far) or
``("lapse", "exact")`` (to the end of the next one, where it is still live).  A lease is named
after the claim that took it: ``"p0"``, ``"p1"``... in the prefix, ``"b0.0"``, ``"b0.1"``... in
branch 0, ``"b1.0"``... in branch 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from ._async import open_transport
from ._forking import fork_server_of_its_own
from ._backend import HAREL_IMPLIES, Capabilities
from ._processes import BranchProcesses, FactoryRecipe
from .parallel import Ack, Claim, ConcurrencyFailure, Lapse, Nack, Op, Program, Publish, check_program

__all__ = ["check_at_once", "plain_call"]

Call = tuple[Any, ...]


def check_at_once(factory: Callable, prefix: Sequence[Call], branches: Sequence[Sequence[Call]], *,
                  runs: int = 30, capabilities: dict[str, Any] | Capabilities | None = None, refusals: bool = False,
                  histories: bool = True, is_async: bool = False, processes: bool | str = False) -> str | None:
    """Run ``prefix``, then ``branches`` at once, up to ``runs`` times; None if the checker
    accepted every run, else what it found in the first run it refused (the call, what the
    specification allows, what the transport answered, and the run's timeline).

    ``factory(clock, namespace)`` builds the transport, as for ``harel-ref certify``;
    ``capabilities``: what it declares (:class:`~harel_ref.stateful.Capabilities`, or a dict of
    its fields); ``refusals``: judge whether a call raised where the specification allows no
    error; ``histories``: judge whether the answers fit some order of the calls the
    specification allows; ``is_async``: the factory builds an asyncio transport.
    ``processes``: each branch runs in a process of its own, as the concurrent search ran them
    when it found a race that threads may not show (a lock of the process, a connection per
    process).  The processes import the factory: ``"module:attribute"`` names it (as
    ``harel-ref certify`` took it), and ``True`` finds its name, for a factory defined at a
    module's top level.
    Anything wrong with the arguments raises ValueError before the transport is opened."""
    if not (isinstance(runs, int) and runs >= 1):
        raise ValueError(f"runs must be a whole number >= 1, got {runs!r}")
    if not (refusals or histories):
        raise ValueError("judge something: refusals=True, histories=True, or both")
    recipe = _recipe(factory, processes)
    program = Program(prefix=tuple(_op(call) for call in prefix),
                      branches=tuple(tuple(_op(call) for call in branch) for branch in branches))
    declared = _capabilities(capabilities)
    if recipe is not None and not declared.shared:
        raise ValueError("processes needs capabilities with shared=True: only instances that share one "
                         "storage see one queue from processes of their own")
    is_async = is_async or inspect.iscoroutinefunction(factory)
    try:
        with contextlib.ExitStack() as stack:
            pool = None if recipe is None else stack.enter_context(
                _processes(recipe, factory, len(program.branches), is_async, declared.protocol))
            check_program(factory, program, declared, is_async=is_async, repeats=runs, contention=refusals,
                          histories=histories, processes=pool)
    except ConcurrencyFailure as found:
        fact = found.fact
        return (f"{fact.step}: the specification allows {fact.expected}; the transport answered {fact.answered} "
                f"(run {found.runs} of {runs})\n{found.timeline}")
    return None


def _recipe(factory: Callable, processes: bool | str | None) -> FactoryRecipe | None:
    """How the branch processes build the factory (None: the branches run on threads)."""
    if isinstance(processes, str):
        if not re.fullmatch(r"[\w.]+:[\w.]+", processes):
            raise ValueError(f"processes names the factory as module:attribute, got {processes!r}")
        recipe = FactoryRecipe(spec=processes, path=os.getcwd())
        try:
            named = recipe.load()
        except Exception as exc:
            raise ValueError(f"processes={processes!r} cannot be imported here: {type(exc).__name__}: {exc}") from None
        if named is not factory:
            raise ValueError(f"processes={processes!r} is not the factory given ({factory!r}): the branches would "
                             "run another transport than the prefix")
        return recipe
    if processes not in (True, False, None):
        raise ValueError(f"processes is True, False or 'module:attribute', got {processes!r}")
    recipe = FactoryRecipe.by_name(factory) if processes else None
    if processes and recipe is None:
        raise ValueError(f"processes=True needs a factory other processes can import by name (one defined "
                         f"at a module's top level), and {factory!r} is not: name it, processes='module:attribute'")
    return recipe


@contextlib.contextmanager
def _processes(recipe: FactoryRecipe, factory: Callable, branches: int, is_async: bool, protocol: str):
    """The branch processes, once one of them has published a message this process's
    transport claims: else the storage is not shared across processes (an in-memory store
    declared shared), and every run would show a race that is not there."""
    with fork_server_of_its_own():  # stopped with the pool (stateful/_forking.py)
        pool = BranchProcesses(recipe, branches=max(2, branches), is_async=is_async, protocol=protocol)
        try:
            try:
                pool.probe(factory, open_transport)
            except RuntimeError as exc:
                raise ValueError(f"processes: {exc}") from None
            yield pool
        finally:
            pool.close()


def _capabilities(given: dict[str, Any] | Capabilities | None) -> Capabilities:
    """``given`` as Capabilities; harel's Protocol implies no routing keys and acks by seq,
    unless given too (as ``harel-ref certify --protocol harel`` does)."""
    if given is None or isinstance(given, Capabilities):
        return given or Capabilities()
    if not isinstance(given, dict):
        raise ValueError(f"capabilities are a Capabilities or a dict of its fields, got {given!r}")
    if unknown := set(given) - {field.name for field in dataclasses.fields(Capabilities)}:
        raise ValueError(f"no such capabilities: {sorted(unknown)}")
    if given.get("protocol") == "harel":
        given = {**HAREL_IMPLIES, **given}
    try:
        return Capabilities(**given)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"capabilities {given!r}: {exc}") from None


_OPS = {"publish": Publish, "claim": Claim, "ack": Ack, "nack": Nack}

_TEXTS = {"publish": 2, "claim": 0, "ack": 1, "nack": 1}
"""How many str arguments each call starts with (a group id and an event; a lease's name); only
a nack takes one more, its delay."""


def _op(call: Call) -> Op:
    """The concurrent search's operation for the plain ``call``."""
    if not (isinstance(call, (tuple, list)) and call and isinstance(call[0], str)):
        raise ValueError(f"a call is a tuple that starts with the method's name, got {call!r}")
    method, *args = call
    if method == "lapse":
        if args not in ([], ["exact"]):
            raise ValueError(f"lapse takes nothing, or 'exact': got {call!r}")
        return Lapse(exact=bool(args))
    if method not in _OPS:
        raise ValueError(f"{method!r} is no call check_at_once makes: publish, claim, ack, nack or lapse")
    texts, rest = args[:_TEXTS[method]], args[_TEXTS[method]:]
    if len(texts) != _TEXTS[method] or not all(isinstance(text, str) for text in texts) or len(rest) > (method == "nack"):
        raise ValueError(f"wrong arguments for {method}: {call!r} (check_at_once's module says each call's)")
    if rest and not (type(rest[0]) in (int, float) and 0 <= rest[0] < math.inf):
        raise ValueError(f"a nack's delay is a number of seconds >= 0, got {rest[0]!r}")
    return _OPS[method](*args)


def plain_call(op: Op) -> Call:
    """``op`` as the plain call :func:`check_at_once` takes (what a written test holds)."""
    if isinstance(op, Publish):
        return ("publish", op.group, op.event)
    if isinstance(op, Ack):
        return ("ack", op.lease)
    if isinstance(op, Nack):
        return ("nack", op.lease, op.delay) if op.delay else ("nack", op.lease)
    if isinstance(op, Lapse):
        return ("lapse", "exact") if op.exact else ("lapse",)
    return ("claim",)
