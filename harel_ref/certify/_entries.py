"""The report's account of how a search ended (:func:`how_ended`), and of each failure it found
(:func:`failure_entry`): its fact, its steps or program, a reproduction and the command that
replays it."""

from __future__ import annotations

import dataclasses

from hypothesis.errors import FlakyFailure, HypothesisException

from harel_ref.stateful import Divergence
import harel_ref.stateful._facts as facts
from harel_ref.stateful._properties import PROPERTIES, SHARED, owner, running
from harel_ref.stateful.parallel import RAISES, ConcurrencyFailure

from ._driver import Search, shrunk_steps
from ._faults import fault_fact, step_fault_fact
from ._profiles import Profile
from ._regression_race import race_regression
from ._report import ECHO, Failure
from ._target import Target

__all__ = []


def how_ended(search_name: str, search: Search, target: Target, profile: Profile, run_seed: int,
              branches: str = "threads", tell_echoes: bool = False) -> tuple[str, str, list[Failure]]:
    """How the search ``search_name`` (a property's own, ``"shared"`` or ``"concurrent"``)
    ended, why, and the failure it found (one: SPEC.md C7; a flaky one comes in a group).
    ``tell_echoes``: after the shared search, the first fact of each other property's bug it
    set aside is told too, unshrunk, however it ended (SPEC.md C5)."""
    exc = search.outcome()  # unshrunk when time ran out, or the transport broke, while shrinking
    echoes = _echoes(search_name, search, target, profile, run_seed, branches) if tell_echoes else []
    if (search.echo or search.ended_echo) is not None and search.first is None and search.limits.broken is None \
            and (exc is None or isinstance(exc, HypothesisException)):
        ended, reason, failures = _beside_echo(search_name, search, target, profile, run_seed, branches)
        return ended, reason, failures + [echo for echo in echoes if echo.fact not in [f.fact for f in failures]]
    if exc is None:
        if search.cut_short:
            return "unknown", f"cut short by the time budget after {search.examples} examples{_unjudged_note(search)}", \
                echoes
        if _too_few_judged(search):
            return "unknown", _storage_reason(search), echoes
        return "passed", f"{search.examples - search.unjudged} examples{_in_lanes(search)}, none diverged" \
            f"{_unjudged_note(search)}", echoes
    flaky = isinstance(exc, FlakyFailure)
    found = _leaves(exc)
    if gave_up(exc):
        if search.first is None and _too_few_judged(search):  # Hypothesis gave up: every example unjudged
            return "unknown", _storage_reason(search), echoes
        if search.first is None:
            return "unknown", f"Hypothesis stopped: {type(exc).__name__}: {str(exc).splitlines()[0]}", echoes
        found = [search.first]  # shrinking was cut short by the time budget: no steps to show
    failures = [failure_entry(search_name, error, flaky, target, profile, run_seed, branches)
                for error in found if not isinstance(error, HypothesisException)]
    if search.shrink_cut:
        failures = [dataclasses.replace(failure, unshrunk=f"the shrink limit ({search.shrink_limit:g} s)")
                    for failure in failures]
    return "failed", "", failures + echoes


def _echoes(search_name: str, search: Search, target: Target, profile: Profile, run_seed: int,
            branches: str) -> list[Failure]:
    """The first fact of each other property's bug the search set aside, unshrunk: each counts
    against that property, and is its counterexample where no search shrank one (SPEC.md C5)."""
    return [dataclasses.replace(failure_entry(search_name, divergence, False, target, profile, run_seed, branches),
                                unshrunk=ECHO) for divergence in search.echoes.values()]


def _beside_echo(search_name: str, search: Search, target: Target, profile: Profile, run_seed: int,
                 branches: str) -> tuple[str, str, list[Failure]]:
    """How a search ended that found nothing of its own but met another property's bug
    (SPEC.md C5): passed, if it ran to its end (its examples judged, or as many set aside) and
    judged at least a quarter of the examples it was asked for; else stopped at that bug,
    unshrunk: its echo.  An example that met it only in its calls after close() counts as judged."""
    judged = search.examples - search.set_aside - search.unjudged
    if search.cut_short and judged >= search.wanted / 4:
        aside = f", {search.set_aside} of them set aside at {search.echo.kind}" if search.echo else ""
        return "unknown", f"cut short by the time budget after {search.examples} examples{aside}" \
            f"{_unjudged_note(search)}", []
    if _too_few_judged(search) and search.unjudged > search.set_aside:  # the storage's doing, not the bug's
        return "unknown", _storage_reason(search), []
    if search.cut_short or search.error is not None or judged < search.wanted / 4:
        echo = failure_entry(search_name, search.echo or search.ended_echo, False, target, profile, run_seed, branches)
        return "failed", f"met it in {search.set_aside} of its {search.examples} examples", \
            [dataclasses.replace(echo, unshrunk=ECHO)]
    reason = f"{judged} examples{_in_lanes(search)}, none diverged"
    if search.set_aside:
        met = "; ".join(_met(echo) for echo in search.echoes.values()) or _met(search.echo)
        reason += f"; {search.set_aside} more set aside: they met {met}"
    if search.ended_at_echo:
        reason += f"; in {search.ended_at_echo} of them the calls after close() met another property's bug"
    return "passed", reason + _unjudged_note(search), []


def _met(echo: Divergence) -> str:
    """What an example set aside met: a fact of another property's bug, or an error another
    search met first."""
    if echo.kind in facts.FAULTS:
        return f"the error {echo.answered}, already found"
    return f"{echo.kind}, a fact of {owner(echo.kind)}'s"


def _in_lanes(search: Search) -> str:
    """How many lanes the search's examples ran in, if more than one (SPEC.md C2a)."""
    return f" in {search.lanes} lanes" if search.lanes > 1 else ""


def _unjudged_note(search: Search) -> str:
    """What a search that passed says of its examples the storage failed in (R17), if any."""
    if not search.unjudged:
        return ""
    return f"; {search.unjudged} more ended unjudged where the storage failed (R17), the first: {_first_line(search.storage_failed)}"


def _too_few_judged(search: Search) -> bool:
    """Whether the examples that ended where the storage failed (R17) leave too few judged to
    stand for the search: more of them than judged ones, or fewer judged than a quarter of those
    asked for.  A transport whose errors hid its bugs would otherwise pass (SPEC.md C15)."""
    judged = search.examples - search.set_aside - search.unjudged
    return search.unjudged > 0 and (search.unjudged > judged or judged < search.wanted / 4)


def _storage_reason(search: Search) -> str:
    judged = search.examples - search.set_aside - search.unjudged
    return (f"the storage failed (R17) in {search.unjudged} of its {search.examples} examples, which ended "
            f"unjudged, and {judged} were judged: too few to stand for the {search.wanted} it was asked for; the "
            f"first: {_first_line(search.storage_failed)}")


def _first_line(error: BaseException | None) -> str:
    """The call and its error, without the explanation a StorageFailed adds for a plain run."""
    return str(error).split(" (R17: ")[0].splitlines()[0][:300]


def failure_entry(search_name: str, error: BaseException, flaky: bool, target: Target, profile: Profile, run_seed: int,
             branches: str, soak: float | None = None) -> Failure:
    """The report's account of a failure that the search ``search_name`` (a property's own,
    ``"shared"``, ``"concurrent"`` or ``"soak"``) found: its fact, and how to see it again."""
    lockstep = search_name == SHARED or (search_name in PROPERTIES and PROPERTIES[search_name].search == "lockstep")
    only = None if search_name == SHARED else running(search_name, getattr(error, "kind", None))
    replay = target.command(profile.name, run_seed, only=only, branches=branches, soak=soak)
    if isinstance(error, ConcurrencyFailure):
        program = error.program
        regression, no_regression = race_regression(target, program, error.fact, owner(error.kind),
                                                    refusals=error.kind in RAISES, runs=profile.repeats,
                                                    ran_as=error.run.how, replay=replay or "", flaky=flaky,
                                                    seen=error.seen)
        return Failure(
            error.fact, found_by=search_name,
            steps=tuple(str(program).splitlines()) if program is not None else (),
            reproduction="" if program is None else target.parallel_reproduction(  # judged as it was found
                search_name, program, contention=error.kind in RAISES, histories=error.kind not in RAISES,
                repeats=profile.repeats, branches=branches),
            replay=replay, flaky=flaky, timeline=error.timeline, timeline_svg=error.svg,
            history=tuple(_jsonable(record) for record in error.shown),
            regression=regression, no_regression=no_regression,
        )
    if not lockstep:  # the transport raised in a parallel search, outside any judged call
        steps = _program_note(error)
        fact = fault_fact(error, "running a program" if steps else "a parallel search")
        return Failure(fact, found_by=search_name, steps=tuple(steps), reproduction="", replay=replay, flaky=flaky)
    steps = shrunk_steps(error)
    reproduction = target.reproduction(search_name, steps)
    if isinstance(error, Divergence):
        return Failure(error.fact, found_by=search_name, steps=tuple(steps), reproduction=reproduction,
                       replay=replay, flaky=flaky)
    # The transport (or its factory) raised something the spec never asks for, or panicked,
    # crashed or hung: the rule it raised in says whose it is (fault_owner).
    fact = step_fault_fact(error)
    return Failure(fact, found_by=search_name, steps=tuple(steps), reproduction=reproduction, replay=replay,
                   flaky=flaky)


def _program_note(error: BaseException) -> list[str]:
    """The program a parallel search noted on an exception it did not expect."""
    for note in getattr(error, "__notes__", ()):
        if note.startswith("program:\n"):
            return note.removeprefix("program:\n").splitlines()
    return []


def _jsonable(record) -> dict:
    from harel_ref.stateful.history import _jsonable as jsonable

    return {field.name: jsonable(getattr(record, field.name)) for field in dataclasses.fields(record)}


def gave_up(exc: BaseException) -> bool:
    """Whether what a search ended with is only Hypothesis giving up (its draws inconsistent,
    every example invalid), no failure of the transport's."""
    return all(isinstance(error, HypothesisException) for error in _leaves(exc))


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
