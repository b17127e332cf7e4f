"""What a certification tells a front-end as it goes: the :class:`Plan` before the first
search, with a rough estimate of the time (:func:`estimate_seconds`, from the preflight's
:class:`Speed`), then the :class:`Progress` of each search and verdict."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from harel_ref.stateful import Capabilities
from harel_ref.stateful._lanes import lanes_of_runs, run_slots
from harel_ref.stateful._machine import RULES, Choices

from ._profiles import Profile
from ._report import PropertyVerdict
from ._search_lanes import lanes_of

__all__ = ["Plan", "Progress", "Speed", "calls_per_step", "estimate_seconds"]


@dataclass(frozen=True)
class Speed:
    """How fast the transport answered the preflight: seconds to open one on a fresh namespace,
    and seconds per call.  What the time estimate is made of."""

    open: float
    call: float


@dataclass(frozen=True)
class Plan:
    """What a certification is about to do, for a front-end's header: told to
    :meth:`Progress.planned` before the first search."""

    transport: str
    capabilities: Capabilities
    is_async: bool
    profile: Profile  # what runs
    fitted_from: Profile | None  # the profile asked for, when it was fitted to the transport
    seed: int
    properties: tuple[str, ...]  # the selected properties, in the order they are searched
    not_applicable: tuple[str, ...]  # those of them that will not be searched
    branches: str  # where the concurrent search runs its branches: see BRANCHES
    soak: float | None
    time_budget: float | None
    call_deadline: float | None
    estimate: float  # seconds: a rough estimate (estimate_seconds)
    jobs: int = 1  # searches that run at once, each in a process of its own when more than one
    jobs_note: str = ""  # why fewer searches run at once than were asked for
    shared: tuple[str, ...] = ()  # the properties a shared lockstep search covers first (SPEC.md C5)
    branches_note: str = ""  # why the branches do not run in processes too, when they could not
    lanes: int = 1  # a lockstep search's examples that run at once (SPEC.md C2a)


class Progress:
    """What :func:`certify` says as it goes, for a front-end to show (the CLI's console shows
    all of it).  Every method does nothing here: override the ones you need."""

    def planned(self, plan: Plan) -> None:
        """Before the first search: what will be certified, and about how long it will take."""

    def started(self, prop: str) -> None:
        """The searches of ``prop`` begin."""

    def searching(self, prop: str, search: str, done: int, total: int) -> None:
        """Within ``prop``: its ``search`` (``"lockstep"``, ``"concurrent"``
        or ``"soak"``) starts example (program) ``done`` of at most ``total``."""

    def finished(self, verdict: PropertyVerdict) -> None:
        """The verdict on a property: once per selected property, in order, once every search
        has ended (what any search finds may bear on any verdict, SPEC.md C12)."""


class CallbackProgress(Progress):
    """``progress(property, verdict)``, the older form: called with None as a property's
    searches start and with its verdict when they end."""

    def __init__(self, callback: Callable[[str, PropertyVerdict | None], None]) -> None:
        self.callback = callback

    def started(self, prop: str) -> None:
        self.callback(prop, None)

    def finished(self, verdict: PropertyVerdict) -> None:
        self.callback(verdict.property, verdict)


def estimate_seconds(profile: Profile, caps: Capabilities, speed: Speed, *, lockstep: int, parallel: int,
                     branches: str = "threads", soak: float | None = None, jobs: int = 1,
                     largest: int = 1, lanes: int = 1) -> float:
    """A rough estimate of a certification's time when nothing fails: ``lockstep`` lockstep
    searches and ``parallel`` parallel ones, at the ``speed`` the preflight measured, ``jobs``
    of them at once; the longest single search stands for ``largest`` lockstep searches (the
    shared one, SPEC.md C5), and with several at once the run lasts at least as long as it.
    A lockstep search's examples run up to ``lanes`` at once (SPEC.md C2a).

    A lockstep search runs about a quarter more examples than ``max_examples`` (Hypothesis
    counts only the valid ones); each opens a transport, now and then a second, and makes
    :func:`calls_per_step` calls a step, plus the prefill and the drain.  A run of a parallel
    program makes about a dozen calls, some at once; its transports are opened once per program
    (see stateful.parallel.Bench), or per run in each branch process.  The per-step and per-run
    overheads are the checker's own (Hypothesis, the model, threads), measured with the
    in-memory transport."""
    # On a wall clock lapses and leases pass by sleeping: a run of a concurrent program waits
    # about two scaled seconds, a lockstep step about a fifth of one (SQS at standard: 545
    # examples of up to 35 steps, 8 at once, in 409 s).
    wall = Choices.of(caps).scale if caps.clock == "wall" else 0.0
    example = (1.5 * speed.open + (profile.step_count * calls_per_step(caps) + 4) * speed.call
               + profile.step_count * (0.0007 + wall / 5) + 0.003)
    in_processes = {"threads": 0.0, "both": 0.5, "processes": 1.0}[branches]  # the share of runs
    opens = (1 + 2.5 * caps.shared) / profile.repeats + in_processes  # branch processes: at once, every run
    run = opens * speed.open + 12 * speed.call + 0.0035 + 0.0045 * in_processes + 2 * wall
    one_lockstep = 1.25 * profile.max_examples * example / lanes_of(lanes, profile.max_examples)
    longest = 1.25 * largest * profile.max_examples * example / lanes_of(lanes, largest * profile.max_examples)
    # on a wall clock a program's runs after the first two are made several at once, once the
    # second, its branches in this process, showed that they wait (SPEC.md C9a)
    lanes_of_runs_here = lanes_of_runs(profile.repeats, wall=True) if wall and branches != "processes" else 1
    concurrent = parallel * profile.programs * run_slots(profile.repeats, lanes_of_runs_here) * run
    searches = (lockstep - largest) * one_lockstep + longest + concurrent if lockstep >= largest \
        else lockstep * one_lockstep + concurrent
    if jobs > 1:  # the searches spread over the processes (which take a moment to start)
        searches = max(searches / jobs * 1.15 + 1.5, longest, concurrent)
    return searches + (soak or 0.0)


def calls_per_step(caps: Capabilities) -> float:
    """About how many calls a lockstep step makes, each rule drawn as often as another: one,
    but a backlog publishes many messages at once (each claimed and acked by the example's
    end) and a run of claims makes a claim and an ack or a nack for each.  At the sizes of
    :mod:`harel_ref.stateful._values` that is about 8 calls a step, 6 on a wall clock: the
    estimate of a transport whose every call is a round trip was 6 times short without it."""
    choices = Choices.of(caps)
    backlog = 3 * statistics.mean(groups * depth for groups, depth in choices.backlogs) - 1 if choices.backlogs else 0
    run = 2 * statistics.mean(choices.claim_runs) - 1
    return 1 + (backlog + run) / len(RULES)
