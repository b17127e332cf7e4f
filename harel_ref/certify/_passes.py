"""A search task run to its end (:func:`run_task`): a property's focused search, the shared
search, the concurrent search or the soak, each in as many passes as it takes to give every
property it covers a verdict of its own (SPEC.md C5, C6), and what it found, as data."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from harel_ref.stateful._async import CallLimits, limit_calls
import harel_ref.stateful._facts as facts
from harel_ref.stateful._facts import raised_error
from harel_ref.stateful._properties import (
    DRAIN_CUT, PROPERTIES, SHARED, UNJUDGED, explained, owner, owners, running, tally,
)
from harel_ref.stateful._processes import BranchProcesses
from harel_ref.stateful.soak import soak as run_soak

from ._driver import Search, hypothesis_apart, run_parallel
from ._entries import failure_entry, how_ended
from ._faults import fault_fact
from ._focus import focus_machine
from ._probes import probe_programs
from ._profiles import PROFILES, Profile, standby_examples
from ._regression import with_regression
from ._report import Failure
from ._search_lanes import run_lockstep
from ._signals import raise_if_stopped
from ._target import Target
from ._tasks import Found, Task
from ._verdicts import anothers, left_undecided, sets_aside, sets_aside_error, shared_sets_aside, unexplained

__all__ = ["CONCURRENT_PASSES", "FOCUSED_PASSES"]


def run_task(target: Target, context: dict[str, Any], task: Task, started, event: Callable,
              pool: BranchProcesses | None = None) -> Found:
    """Run the search ``task``: here, or in a search process (:mod:`harel_ref.certify._jobs`).

    ``context`` holds the profile, the seed, the time budget's end, how many searches share it
    (``budgeted``) and how many run at once (``jobs``); ``started`` counts the searches begun,
    across processes; ``event(name, *args)`` calls the :class:`Progress` method ``name``."""
    home = os.path.join(context["hypothesis_home"], str(os.getpid()))  # this process's, in the run's
    with limit_calls(context["call_deadline"]) as limits, hypothesis_apart(home):
        if task.kind == "soak":
            event("searching", task.prop, "soak", 0, 1)
            return _soak(target, context["soak"], context["seed"])
        with started.get_lock():
            started.value += 1
            left = context["budgeted"] - started.value + 1
        began = time.monotonic()
        if began >= context["end"]:
            return Found("unknown", "not reached: the time budget was spent", 0.0, 0)
        share = (context["end"] - began) * min(context["jobs"], left) / max(1, left)  # a fair share of what is left
        if task.kind != "concurrent":
            event("started", task.prop)
            if task.kind in PROPERTIES:
                return _focused_passes(target, context, task, share, limits, event, pool, began)
            return _shared_passes(target, context, task, share, limits, event, pool, began)
        if PROPERTIES[task.prop].search != "lockstep":  # no search of its own has started it (contention)
            event("started", task.prop)
        return _concurrent_passes(target, context, task, share, limits, event, pool, began)


FOCUSED_PASSES = 3
"""How many passes a property's own lockstep search makes at most (:func:`_focused_passes`)."""


def _focused_passes(target: Target, context: dict[str, Any], task: Task, share: float, limits: CallLimits,
                    event: Callable, pool: BranchProcesses | None, began: float) -> Found:
    """A property's own lockstep search, again while it stops only at other properties' bugs
    (:func:`~._verdicts.anothers`) or at errors the spec never asks for, with those taken as
    known: each such failure is shrunk and reported, and the next pass sets aside the examples
    that meet a fact of its bug, or raise that error, until a pass passes, finds a fact of the
    property's own, or :data:`FOCUSED_PASSES` passes were made.  So the verdict is the
    property's own, not unknown for another's failure (SPEC.md C5).  After the shared search (a
    ``standby`` task) it sets aside every other property's fact from the start, and the errors
    the shared search met, unshrunk, and tells the first of each as an echo; it makes a second
    pass only past an error of its own finding.  Run again to shrink one of them
    (``shrinks``), it makes one pass."""
    known: frozenset[str] = frozenset()
    shared_errors = context.get("shared_errors", {}) if task.standby else {}
    errors = frozenset(error for error, whose in shared_errors.items() if whose != task.kind)  # its own it shrinks
    earlier: list[Failure] = []
    reached: collections.Counter = collections.Counter()
    for number in range(1, FOCUSED_PASSES + 1):
        left = share - (time.monotonic() - began)  # the passes share the search's time
        found = _search_once(target, context, task, left, limits, event, pool, known, earlier, errors=errors)
        tally(reached, found.reached)
        found.failures = _not_told_before(found.failures, earlier)
        if earlier and found.ended == "passed":
            found.reason += f" (searched again with {_taken_as_broken(known, earlier)})"
        stopped = [failure for failure in found.failures if not failure.echo]  # echoes: others met them
        goes_on = found.ended == "failed" and bool(stopped) and all(
            anothers(failure.fact, task.kind) or _searches_again_past(failure.fact, errors, shared_errors, task.kind)
            for failure in stopped)
        if not goes_on or number == FOCUSED_PASSES or limits.broken is not None or task.shrinks:
            found.seconds, found.earlier = time.monotonic() - began, len(earlier)
            found.failures, found.reached = earlier + found.failures, dict(reached)
            return found
        earlier += found.failures
        known |= frozenset(failure.kind for failure in stopped if not raised_error(failure.fact))
        errors |= frozenset(error for failure in stopped if (error := raised_error(failure.fact)))
        event("found", Found("unknown", "", time.monotonic() - began, 0, list(earlier), earlier=len(earlier)))
    raise AssertionError("unreachable")


def _searches_again_past(fact: facts.Fact, errors: frozenset[str], shared_errors: dict[str, str], prop: str) -> bool:
    """Whether a focused search that stopped at ``fact`` searches again with it set aside: an
    error a transport's call raised in a step or the drain (``fact.call``: not its close(), nor
    a storage failure that repeats, which the driver cannot set aside), not set aside already,
    not met as the example opened the transport (every example opens), and not one the shared
    search found and counts against ``prop`` (its verdict is failed by it whatever a second
    pass finds)."""
    error = raised_error(fact)
    return error is not None and bool(fact.call) and error not in errors and fact.rule != "__init__" \
        and shared_errors.get(error) != prop


def _not_told_before(failures: list[Failure], earlier: Sequence[Failure]) -> list[Failure]:
    """``failures`` less the echoes of bugs an earlier pass told already, as an echo or as the
    failure it stopped at (each pass tells the first of each bug it set aside:
    :func:`_focused_passes`)."""
    told = {_echo_of(failure) for failure in earlier}
    return [failure for failure in failures if not failure.echo or _echo_of(failure) not in told]


def _echo_of(failure: Failure) -> str:
    return raised_error(failure.fact) or owner(failure.kind)


def _taken_as_broken(known: frozenset[str], earlier: Sequence[Failure]) -> str:
    """What a focused search's later pass set aside, as its reason says it: the properties
    whose bugs it took as broken, and the errors the transport raised (:func:`_focused_passes`)."""
    parts = [f"{', '.join(sorted(owners(known)))} taken as broken"] if owners(known) else []
    raised = {raised_error(f.fact): f.answered.encode("unicode_escape").decode("ascii")
              for f in earlier if raised_error(f.fact) and not f.echo}
    if raised:
        parts.append(f"the examples that raised {'; '.join(raised.values())} set aside")
    return ", and ".join(parts)


def _shared_passes(target: Target, context: dict[str, Any], task: Task, share: float, limits: CallLimits,
                   event: Callable, pool: BranchProcesses | None, began: float) -> Found:
    """The shared lockstep search, and, when it stopped at one property's bug (a fact that counts
    against it whatever else is found: :func:`~._verdicts.unexplained`), a second pass with that
    property taken as broken: it sets aside the examples that meet its facts
    (:func:`~._verdicts.shared_sets_aside`).  If the second pass passes, the search passes with
    the first one's failure: it stands for the properties it covers but those its set-aside
    facts could count against (``undecided``), whose own searches run.  If it finds anything,
    it stops there, unshrunk, and the search is the first pass's failure: every focused search
    runs, as it would have (SPEC.md C5).  In one machine a bug shows in more ways than the
    table's ``explains`` says (routing keys split at commas make a claim pass a group over),
    so what a second pass finds is no property's failure, only a sign to look closer.  The
    second pass costs about two thirds of the focused searches it can make needless ("unfenced
    ack" at standard: 35 s to the report instead of 47 s)."""
    first = _search_once(target, context, task, share, limits, event, pool)
    covers = task.covers
    if first.ended != "failed" or limits.broken is not None or not all(
            unexplained(failure.fact, covers) and not failure.flaky for failure in first.failures):
        return first  # a fault (owned by no property) among them, or a fact another's bug explains
    broken = frozenset(owner(failure.kind) for failure in first.failures)
    if len(broken) != 1:
        return first
    event("found", Found("unknown", "", time.monotonic() - began, 0, list(first.failures),
                          earlier=len(first.failures)))  # what a stop during the second pass reports
    left = share - (time.monotonic() - began)  # the passes share the search's time
    second = _search_once(target, context, task, left, limits, event, pool, earlier=first.failures,
                          broken=broken, clean=first.clean)
    seconds = time.monotonic() - began
    if second.ended != "passed":
        return dataclasses.replace(first, seconds=seconds)
    reached = collections.Counter(first.reached)
    tally(reached, second.reached)
    return dataclasses.replace(
        second, seconds=seconds, failures=first.failures, earlier=len(first.failures), reached=dict(reached),
        clean=first.clean, reason=f"{second.reason} (searched again with {', '.join(broken)} taken as broken, after "
                                  f"{first.clean} examples before its failure)")


CONCURRENT_PASSES = 4
"""How many passes the concurrent search makes at most, each with what the passes before it
found taken as known (:func:`_concurrent_passes`)."""


def _concurrent_passes(target: Target, context: dict[str, Any], task: Task, share: float, limits: CallLimits,
                       event: Callable, pool: BranchProcesses | None, began: float) -> Found:
    """The concurrent search, again with what it found taken as known (every kind of fact of
    the properties it showed broken ignored: a rule of the model left out, or errors no longer
    judged), until a pass finds nothing new, every property it covers is known broken,
    :data:`CONCURRENT_PASSES` passes were made, or the transport broke.  Each property it judges
    then gets a verdict of its own, not the first failure's (SPEC.md C6)."""
    ignore: frozenset[str] = frozenset()
    earlier: list[Failure] = []
    reached: collections.Counter = collections.Counter()
    for number in range(1, CONCURRENT_PASSES + 1):
        left = share - (time.monotonic() - began)  # the passes share the search's time
        found = _search_once(target, context, task, left, limits, event, pool, ignore, earlier)
        seen = frozenset(failure.kind for failure in found.failures)
        if ignore and found.ended == "passed":
            found.reason += f" (searched again with {', '.join(sorted(owners(ignore)))} taken as broken)"
        tally(reached, found.reached)
        broken = owners(ignore | seen)
        judged_all = set(task.covers) <= broken or (
            "histories" not in task.judges and facts.RAISED_UNDER_CONTENTION in ignore | seen)
        last = number == CONCURRENT_PASSES or limits.broken is not None or seen & facts.FAULTS or judged_all
        if found.ended != "failed" or last:
            found.seconds, found.earlier = time.monotonic() - began, len(earlier)
            found.failures = earlier + found.failures
            found.reached = dict(reached)
            return found
        earlier += found.failures
        ignore |= frozenset().union(*(PROPERTIES[prop].owns for prop in owners(seen)))
        # What a stop before the next pass finds anything reports: these, shrunk.
        event("found", Found("unknown", "", time.monotonic() - began, 0, list(earlier), earlier=len(earlier)))
    raise AssertionError("unreachable")


def _search_once(target: Target, context: dict[str, Any], task: Task, share: float, limits: CallLimits,
                 event: Callable, pool: BranchProcesses | None, ignore: frozenset[str] = frozenset(),
                 earlier: Sequence[Failure] = (), broken: frozenset[str] = frozenset(),
                 clean: int | None = None, errors: frozenset[str] = frozenset()) -> Found:
    """One run of a lockstep or parallel search, with ``share`` seconds to search (and as
    many again to shrink a failure found in time).  ``ignore``: the kinds of fact earlier passes
    found, which the concurrent search no longer judges and a focused search sets aside with the
    shared search's (:func:`_focused_passes`); ``earlier``: the failures those passes found
    (told with this one's, as found, see :meth:`Certification.report`).  ``broken``: the
    property the second pass of the shared search takes as broken, after ``clean`` examples of
    its first pass (:func:`_shared_passes`); ``errors``: the errors a focused search sets aside
    (:func:`~harel_ref.stateful._facts.raised_error`), found by the shared search or an earlier
    pass."""
    began, kind, profile, caps = time.monotonic(), task.kind, context["profile"], target.capabilities
    lockstep = kind == SHARED or (kind in PROPERTIES and PROPERTIES[kind].search == "lockstep")
    shown = "lockstep" if kind in PROPERTIES and lockstep else kind
    total = profile.shared_examples if kind == SHARED else profile.max_examples if lockstep else profile.programs
    # the shared search's clean examples count for a focused search's, but for the property its
    # failure counts against: that one's own search looks for the bug in its own machine
    after_shared = (context.get("shared_clean") or 0) if task.standby and kind not in context.get("shared_blamed", ()) \
        else 0
    total = standby_examples(profile, after_shared) if after_shared else total
    if broken:  # the first pass's clean examples count, as a passed pass's would
        total = max(math.ceil(total / 4), total - (clean or 0))
    shrink_limit = 0.0 if broken else context["shrink_limit"]  # a second shared pass never shrinks
    machine = focus_machine(target.factory, kind, caps, is_async=target.is_async) if lockstep else None
    told_total = total + len(probe_programs(machine, profile.probe)) if lockstep else total  # the probes are examples
    search = Search(deadline=began + share, grace=share, limits=limits, shrink_limit=shrink_limit,
                     on_example=lambda done: event("searching", task.prop, shown, done, told_total))

    tell_echoes = task.standby and not task.shrinks  # after the shared search (_sets_aside)

    def found(seen: Search) -> None:  # the failure as found, for a report made while it is shrunk (a stopped run)
        _, _, failures = how_ended(kind, seen, target, profile, context["seed"], context["branches"], tell_echoes)
        event("found", Found("failed", "", time.monotonic() - began, seen.examples, [*earlier, *failures],
                              earlier=len(earlier)))

    search.on_found = None if broken else found  # what a second shared pass finds is never reported
    if lockstep:
        run_lockstep(machine, profile, context["seed"], search, total, _sets_aside(task, broken, ignore, errors),
                     context.get("lanes", 1))
    else:
        run_parallel(target, caps, profile, context["seed"], search, judges=task.judges,
                      processes=pool, alternate=context["branches"] == "both", ignore=ignore)
    ended, reason, failures = how_ended(kind, search, target, profile, context["seed"], context["branches"],
                                        tell_echoes)
    if lockstep and not broken:  # what a second shared pass finds is never reported
        hung = (choices, profile.step_count) if (choices := search.hung_choices()) else ()
        failures = [failure if failure.echo else with_regression(failure, target, machine, hung) for failure in failures]
    if not lockstep and ended == "passed":
        reason = _concurrent_passed(task, search, profile, ignore)
    elif not lockstep:
        reason = reason.replace("examples", "programs", 1)
    if search.probes_unrun and ended == "passed":
        reason += f"; {search.probes_unrun} of its probes past the sizes searched did not run: the time was spent"
    if after_shared and total < profile.max_examples and ended == "passed":
        reason += f", beside the shared search's {after_shared} before its failure (SPEC.md C5)"
    if task.standby and (missed := context.get("unreached", {}).get(kind)) and ended == "passed":
        reason += f", run since the shared search never reached {'; '.join(missed)} (SPEC.md C5)"
    # only a shared search stands for properties other than its own search's
    shared_passed = kind == SHARED and ended == "passed"
    undecided = left_undecided(list(search.aside_facts.values()), broken, task.covers) if shared_passed else ()
    return Found(ended, reason, time.monotonic() - began, search.examples, failures, reached=dict(search.reached),
                  clean=search.clean if search.first is not None else None, undecided=undecided)


def _sets_aside(task: Task, broken: frozenset[str], ignore: frozenset[str],
                errors: frozenset[str] = frozenset()) -> Callable[[facts.Fact], bool]:
    """Whether a lockstep search sets aside, unshrunk, an example at a fact (SPEC.md C5): the
    shared search's second pass, what its ``broken`` property's bug explains; a focused search
    after the shared search, every other property's fact; run again to shrink one kind of fact
    it set aside, every other kind; a focused search of a run of chosen properties, what the
    bugs its earlier passes found (``ignore``) explain.  A focused search also sets aside the
    ``errors`` (:func:`~harel_ref.stateful._facts.raised_error`) another search met first, or
    an earlier pass of its own."""
    kind = task.kind
    if kind == SHARED:
        return functools.partial(shared_sets_aside, broken=broken, covers=task.covers)
    if task.shrinks:  # its own property's facts too: they were shrunk when it first ran
        return lambda fact: (raised_error(fact) or fact.kind) != task.shrinks
    if task.standby:
        judged = functools.partial(anothers, prop=kind)
    else:
        judged = functools.partial(sets_aside, known=explained(ignore, kind), prop=kind)
    return lambda fact: judged(fact) or sets_aside_error(fact, errors)


def _concurrent_passed(task: Task, search: Search, profile: Profile, ignore: frozenset[str]) -> str:
    """The reason of a concurrent search that passed: what it ran and judged, and the runs it
    could not judge in full."""
    judged = ["no call refused"] * ("refusals" in task.judges and facts.RAISED_UNDER_CONTENTION not in ignore) + [
        "every history linearizable"] * ("histories" in task.judges)
    reason = f"{search.examples} programs × {profile.repeats} runs, {', '.join(judged)}"
    if unjudged := search.reached.get(UNJUDGED):
        reason += (f"; {unjudged} runs left unjudged (their raised calls allowed more orders than the "
                   "checker tries, SPEC.md C9)")
    if cut := search.reached.get(DRAIN_CUT):
        reason += f"; in {cut} runs an error of R17 cut the drain short, and what they left is unjudged (SPEC.md C15)"
    return reason


def clean_up_process(target: Target) -> None:
    """What a search process does as it ends: remove what its transports made on the user's
    servers (files are the certifier's to remove)."""
    if target.recipe is not None and target.recipe.bundled:
        from harel_ref.stateful.backends import clean_up

        clean_up()


def _soak(target: Target, seconds: float, run_seed: int) -> Found:
    """Run the soak, and what it found: a failure per kind of fact seen (errors and the
    history's breaches, each judged in full, and the model's verdict, which stops at its first
    misfit; SPEC.md R19).  It ended "passed" when the model's verdict did: what it covers and
    found nothing against holds."""
    began = time.monotonic()
    replay = target.command("quick", run_seed, only=running("soak"), soak=seconds)
    try:
        result = run_soak(target.factory, target.capabilities, seconds, is_async=target.is_async, seed=run_seed,
                          checkpoint=raise_if_stopped)
        calls, lin = len(result.records), result.linearizability
    except Exception as exc:
        fact = fault_fact(exc, "the soak")
        failure = Failure(fact, found_by="soak", steps=(), reproduction="", replay=replay)
        return Found("failed", "the soak crashed", time.monotonic() - began, 0, [failure])
    failures = [failure_entry("soak", divergence, False, target, PROFILES["quick"], run_seed, "threads", soak=seconds)
                for divergence in result.failures()]
    spent = time.monotonic() - began
    if lin.ok is None:
        return Found("unknown", f"the soak's model check gave up: {lin}", spent, calls, failures)
    if lin.ok is False:  # it stopped at the model's misfit; errors and breaches were judged in full
        judged = [failure for failure in failures if failure.fact != lin.fact]
        misfit = [failure for failure in failures if failure.fact == lin.fact]
        return Found("failed", "", spent, calls, judged + misfit, earlier=len(judged))
    clean = "" if failures else ", no history violation, none raised"
    return Found("passed", f"{calls} calls in {result.seconds:.0f} s, linearizable{clean}", spent, calls, failures)
