"""The certification engine: one focused Hypothesis search per property.

A single lockstep search stops at the first divergence, so it can say "something is wrong"
but not which of the twelve properties hold.  The engine therefore runs one search per
property, each with the machine narrowed to what that property needs:

- only the rules that exercise it (bad input is sent only when checking bad input, stale
  leases are acked only when checking fencing, reopen happens only when checking durability);
- the other properties' fine print relaxed: outside the fairness search the model accepts any
  claimable group, outside the lease-expiry search a claim is judged as if it happened anywhere
  within one tick of the clock (so an off-by-one-tick lease end does not stop the FIFO search),
  and priority and routing are exercised only by their own searches.

Every divergence names the property it breaks (``Divergence.property``).  A search that stops
at another property's divergence records that failure against the other property, and its own
verdict is "unknown" (it was cut short).  Each search is seeded, so a failure replays exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.errors import FlakyFailure, HypothesisException
from hypothesis.stateful import run_state_machine_as_test

from stateful import Backend, Capabilities, Divergence, make_machine
from stateful._async import open_transport
from stateful._machine import FOCUS_RULES, RULES, TICK, FakeClock

from ._report import Failure, PropertyVerdict, Report
from ._target import CertificationError, Target

__all__ = ["PROFILES", "PROPERTIES", "Profile", "certify", "focus_machine"]


@dataclass(frozen=True)
class Profile:
    """How hard each property's search looks: Hypothesis's ``max_examples`` and
    ``stateful_step_count`` for every one of the (up to twelve) searches."""

    name: str
    max_examples: int
    step_count: int

    def __post_init__(self) -> None:
        if self.max_examples < 1 or self.step_count < 1:
            raise ValueError(f"a Profile needs max_examples >= 1 and step_count >= 1, got {self}")


PROFILES = {
    "quick": Profile("quick", max_examples=50, step_count=20),
    "standard": Profile("standard", max_examples=120, step_count=35),
    "thorough": Profile("thorough", max_examples=500, step_count=60),
}


@dataclass(frozen=True)
class _Focus:
    """What the search for one property runs and checks."""

    what: str  # the property in one line, with its SPEC.md rules
    rules: frozenset[str]
    needs: Callable[[Capabilities], str | None] = lambda caps: None  # why not applicable
    exact_time: bool = False  # judge claims at the exact clock (no slack)
    stale_leases: bool = False  # ack/nack superseded and consumed leases
    checks: frozenset[str] = frozenset()  # of "priority", "routing", "fairness"


_CORE = frozenset({"prefill", "publish", "claim_any", "ack"})
_TIME = frozenset({"advance"})


def _declared(field: str, reason: str) -> Callable[[Capabilities], str | None]:
    return lambda caps: None if getattr(caps, field) else reason


PROPERTIES: dict[str, _Focus] = {
    "single-in-flight": _Focus(
        "a group whose head is leased or parked is not claimable, by any instance (R2)",
        _CORE | {"nack_now", "claim_at_deadline", "open_second_instance"},
    ),
    "fifo": _Focus(
        "a group's messages come out in publish order; a nacked message stays the head; "
        "seqs are stable and increase (R1, R6, R8, R16)",
        _CORE | {"nack_now", "nack_later", "claim_at_deadline"},
    ),
    "lease-expiry": _Focus(
        "a lease (or park) is live while now <= its end, and claimable one tick after (R3, R9)",
        _CORE | {"nack_later", "advance_to_deadline", "claim_at_deadline"},
        # The boundary rules step the clock to a lease's exact end: a wall clock cannot.
        needs=lambda caps: "exact lease boundaries need an injectable clock (this one is the wall clock)"
        if caps.clock == "wall" else None,
        exact_time=True,
    ),
    "parking": _Focus(
        "nack(lease, delay > 0) blocks the group until now + delay, then the head returns (R9)",
        _CORE | {"nack_later", "claim_at_deadline"},
        needs=_declared("parking", "the transport does not declare parking"),
    ),
    "fencing": _Focus(
        "ack/nack act only under the lease's token; superseded or used leases get False; "
        "tokens are never reused (R10, R16)",
        _CORE | {"nack_now", "nack_later", "claim_at_deadline", "open_second_instance"},
        stale_leases=True,
    ),
    "fairness": _Focus(
        "the claimable group with the oldest fairness stamp goes first, ties by arrival (R4, R5)",
        _CORE | _TIME | {"nack_now", "advance_to_deadline"},
        needs=lambda caps: "fairness is declared unspecified" if caps.fairness == "unspecified" else None,
        checks=frozenset({"fairness"}),
    ),
    "priority-floor": _Focus(
        "claim(min_priority=p) only takes groups of priority >= p (R4, R12)",
        _CORE | _TIME | {"claim"},
        needs=_declared("priority", "the transport does not declare priorities"),
        checks=frozenset({"priority"}),
    ),
    "routing": _Focus(
        "claim(routing_keys=...) only takes groups with one of those keys (R4, R12)",
        _CORE | _TIME | {"claim"},
        needs=_declared("routing", "the transport does not declare routing keys"),
        checks=frozenset({"routing"}),
    ),
    "durability": _Focus(
        "closing and reopening on the same storage keeps every message, lease and park (R15)",
        _CORE | {"nack_now", "nack_later", "claim_at_deadline", "reopen", "open_second_instance"},
        needs=_declared("durable", "the transport does not declare durability"),
    ),
    "no-loss": _Focus(
        "draining at the end yields every message published and not acked, exactly once (R1, R7)",
        _CORE | _TIME | {"nack_now", "nack_later", "open_second_instance"},
    ),
    "bad-input": _Focus(
        "bad arguments raise ValueError/TypeError and write nothing (R13)",
        _CORE | _TIME | {"bad_input", "bad_delay"},
    ),
    "close": _Focus(
        "after close() every call raises; close() twice is harmless (R14)",
        _CORE | _TIME,
    ),
}
"""The verdict lines, in the order they are searched and reported."""

_CHECK_TO_PROPERTY = {"publish": "no-loss", "ack": "fencing", "nack": "fencing"}
"""The machine's own check names that are not verdict lines: a publish that answers something
else than None counts against no-loss; an ack/nack that does not answer True for the current
lease counts against fencing (R10 says which leases act, both ways)."""


def property_of(check: str) -> str:
    """The verdict line a machine check (``Divergence.property``) counts against."""
    return _CHECK_TO_PROPERTY.get(check, check)


def focus_machine(
    factory: Callable,
    property: str,
    capabilities: Capabilities | None = None,
    *,
    is_async: bool = False,
) -> type:
    """The lockstep machine class that the search for ``property`` runs.

    Reports print failing steps against this class, so a reproduction is: build the class
    with the same arguments, then run the printed steps.
    """
    if property not in PROPERTIES:
        raise ValueError(f"unknown property {property!r}; choose from {list(PROPERTIES)}")
    caps = capabilities if capabilities is not None else Capabilities()
    focus = PROPERTIES[property]
    effective = dataclasses.replace(
        caps,
        priority=caps.priority and "priority" in focus.checks,
        routing=caps.routing and "routing" in focus.checks,
        fairness=caps.fairness if "fairness" in focus.checks else "unspecified",
    )
    wall = caps.clock == "wall"
    name = "".join(word.capitalize() for word in property.split("-")) + "Machine"
    return make_machine(
        Backend(property, factory, effective, is_async=is_async),
        # The deadline rules need an injectable clock; with a wall clock, time passes by sleeping.
        rules=focus.rules | _TIME if wall else focus.rules,
        stale_leases=focus.stale_leases,
        clock_slack=0.0 if (focus.exact_time or wall) else TICK,
        after_reopen="durability" if "reopen" in focus.rules else None,
        # A refused call that still changed the queue shows up at a later step.
        after_bad_input="bad-input" if "bad_input" in focus.rules else None,  # and bad_delay
        check_close=property == "close",  # so a close bug leaves the other verdicts standing
        name=name,
    )


# --- one search --------------------------------------------------------------------------


@dataclass
class _Search:
    """What one focused search saw: its outcome and the bookkeeping for the time budget."""

    deadline: float  # time.monotonic() after which no new example starts
    grace: float  # extra time to finish shrinking a failure already found
    examples: int = 0
    cut_short: bool = False
    first: Divergence | None = None  # the first divergence seen, before shrinking
    error: BaseException | None = None

    def out_of_time(self) -> bool:
        now = time.monotonic()
        if now <= self.deadline or (self.first is not None and now <= self.deadline + self.grace):
            return False
        self.cut_short = True
        return True


class _OutOfTime(KeyboardInterrupt):
    """Stops a search when its time is up.  Hypothesis lets an interrupt through at once
    (anything else it would count as a failure, or as inconsistent data generation)."""


def _watched(machine: type, search: _Search) -> type:
    """``machine`` counting its examples, remembering the first divergence, and stopping the
    search once its time budget is spent."""

    class Watched(machine):
        def __init__(self) -> None:
            if search.out_of_time():
                raise _OutOfTime
            search.examples += 1
            super().__init__()

        def _diverge(self, *args):
            divergence = super()._diverge(*args)
            if search.first is None:
                search.first = divergence
            return divergence

        def _call(self, method, *args):
            try:
                return super()._call(method, *args)
            except Exception as exc:  # a crash: kept in case time runs out while shrinking
                if search.first is None:
                    search.first = exc
                raise

    # Hypothesis prints steps as ``state = <class name>()``: keep the focus machine's name.
    Watched.__name__ = Watched.__qualname__ = machine.__name__
    return Watched


def _settings(profile: Profile) -> settings:
    return settings(
        max_examples=profile.max_examples,
        stateful_step_count=profile.step_count,
        database=None,
        deadline=None,
        derandomize=False,  # the seed decides
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        verbosity=Verbosity.normal,  # the failing steps land in the exception's notes
    )


def _run_search(machine: type, profile: Profile, run_seed: int, search: _Search) -> None:
    try:
        run_state_machine_as_test(seed(run_seed)(_watched(machine, search)), settings=_settings(profile))
    except _OutOfTime:
        pass  # search.cut_short says so; search.first holds a failure found before
    except Exception as exc:  # a divergence, the transport raising, or Hypothesis giving up
        search.error = exc


def _steps(exc: BaseException) -> list[str]:
    """The shrunk steps Hypothesis attached to ``exc``, from ``state = ...`` to teardown."""
    lines = [line for note in getattr(exc, "__notes__", ()) for line in str(note).splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return []
    steps = lines[starts[-1]:]
    if "state.teardown()" in steps:
        steps = steps[: steps.index("state.teardown()") + 1]
    return steps


# --- the whole certification -------------------------------------------------------------


def certify(
    factory: Callable,
    capabilities: Capabilities | None = None,
    *,
    profile: str | Profile = "standard",
    is_async: bool | None = None,
    seed: int = 0,
    properties: Iterable[str] | None = None,
    time_budget: float | None = None,
    progress: Callable[[str, PropertyVerdict | None], None] | None = None,
    name: str | None = None,
    _target: Target | None = None,
) -> Report:
    """Certify the transport ``factory`` opens against the specification; return a Report.

    - ``factory(clock, namespace)`` returns a fresh, isolated transport for a new
      ``namespace``, and the same storage again for a namespace it has seen (reopen, second
      instance).  Async transports: an ``async def`` factory, or ``is_async=True``.
    - ``capabilities``: what the transport supports; by default what the factory declares
      (``factory.capabilities``, else the module's ``HAREL_CAPABILITIES``), else the defaults.
    - ``profile``: ``"quick"``, ``"standard"``, ``"thorough"`` or a :class:`Profile`.
    - ``seed``: every search is seeded with it, so the same call finds the same examples.
    - ``properties``: certify only these (names from :data:`PROPERTIES`).
    - ``time_budget``: seconds for the whole run, shared fairly among the searches left;
      a search cut short or never started is "unknown".
    - ``progress(property, verdict)``: called with ``None`` as a search starts and with its
      verdict when it ends.
    """
    target = _target if _target is not None else Target.from_factory(factory, capabilities, is_async)
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; choose from {list(PROFILES)}")
        profile = PROFILES[profile]
    chosen = list(PROPERTIES) if properties is None else list(dict.fromkeys(properties))
    unknown = [p for p in chosen if p not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; choose from {list(PROPERTIES)}")
    if time_budget is not None and not (time_budget > 0 and math.isfinite(time_budget)):
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget}")
    caps = target.capabilities
    preflight(target)

    started = time.monotonic()
    end = math.inf if time_budget is None else started + time_budget
    failures: dict[str, list[Failure]] = {}
    searched: dict[str, tuple[str, str, float, int]] = {}  # property -> (verdict, reason, s, n)
    for index, prop in enumerate(chosen):
        if (reason := PROPERTIES[prop].needs(caps)) is not None:
            searched[prop] = ("not applicable", reason, 0.0, 0)
            if progress:
                progress(prop, _verdict(prop, searched[prop], failures))
            continue
        if progress:
            progress(prop, None)
        left = sum(1 for p in chosen[index:] if PROPERTIES[p].needs(caps) is None)
        began = time.monotonic()
        if began >= end:
            searched[prop] = ("unknown", "not reached: the time budget was spent", 0.0, 0)
        else:
            share = (end - began) / left  # a fair share of what is left
            search = _Search(deadline=began + share, grace=share)
            machine = focus_machine(target.factory, prop, caps, is_async=target.is_async)
            _run_search(machine, profile, seed, search)
            verdict, reason = _judge(prop, search, target, profile, seed, failures)
            searched[prop] = (verdict, reason, time.monotonic() - began, search.examples)
        if progress:
            progress(prop, _verdict(prop, searched[prop], failures))

    order = chosen + [p for p in PROPERTIES if p in failures and p not in chosen]
    verdicts = tuple(_verdict(p, searched.get(p, ("unknown", "not selected", 0.0, 0)), failures) for p in order)
    return Report(
        transport=name or target.name,
        capabilities=caps,
        is_async=target.is_async,
        profile=profile,
        seed=seed,
        verdicts=verdicts,
        seconds=time.monotonic() - started,
        replay=target.command(profile.name, seed),
        descriptions={p: PROPERTIES[p].what for p in order},
    )


def preflight(target: Target) -> None:
    """Open and close one transport, so a factory that cannot work fails with a clear error
    instead of twelve failed searches."""
    loop = asyncio.new_event_loop() if target.is_async else None
    clock = time.time if target.capabilities.clock == "wall" else FakeClock()
    try:
        transport = open_transport(target.factory, clock, "harel_ref_preflight", loop)
        transport.close()
    except Exception as exc:
        raise CertificationError(
            f"the factory {target.name} could not open and close a transport: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if loop is not None:
            loop.close()


def _judge(prop, search: _Search, target: Target, profile: Profile, run_seed: int, failures) -> tuple[str, str]:
    """The verdict of ``prop``'s own search; record every failure it found under the property
    that failure breaks (Hypothesis reports distinct bugs of one search together)."""
    exc = search.error
    if exc is None and search.first is not None:
        exc = search.first  # time ran out while shrinking: report the failure unshrunk
    if exc is None:
        if search.cut_short:
            return "unknown", f"cut short by the time budget after {search.examples} examples"
        return "passed", f"{search.examples} examples, none diverged"
    flaky = isinstance(exc, FlakyFailure)
    found = _leaves(exc)
    if all(isinstance(e, HypothesisException) for e in found):
        if search.first is None:
            return "unknown", f"Hypothesis stopped: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        found = [search.first]  # shrinking was cut short by the time budget: no steps to show
    broken = []
    for error in found:
        if isinstance(error, HypothesisException):
            continue
        failure = _failure(prop, error, flaky, target, profile, run_seed)
        tripped = property_of(failure.check)
        if tripped != failure.property and any(f.found_by == tripped for f in failures.get(tripped, [])):
            # Blamed on the reopen (or the refused bad input) before it, but the check that
            # tripped failed in its own search too, without one: it is that property's bug.
            failure = dataclasses.replace(failure, property=tripped)
        failures.setdefault(failure.property, []).append(failure)
        broken.append(failure.property)
    if prop in broken:
        return "failed", failures[prop][-1].summary()
    return "unknown", f"cut short: the search stopped at a failure of {', '.join(broken)} (see there)"


def _failure(prop: str, error: BaseException, flaky: bool, target: Target, profile: Profile, run_seed: int) -> Failure:
    steps = _steps(error)
    common = dict(
        found_by=prop,
        steps=tuple(steps),
        reproduction=target.reproduction(prop, steps),
        replay=target.command(profile.name, run_seed, only=prop),
        flaky=flaky,
    )
    if isinstance(error, Divergence):
        return Failure(
            property=property_of(error.property),
            check=error.check,
            step=error.step,
            expected=error.expected,
            answered=error.answered,
            state=error.state,
            **common,
        )
    # The transport (or its factory) raised something the spec never asks for: it counts
    # against the property being searched.
    return Failure(
        property=prop,
        check="exception",
        step=f"{_raising_step(error)} raised",
        expected="an answer or error the spec allows",
        answered=f"{type(error).__name__}: {error}",
        state="",
        **common,
    )


def _raising_step(error: BaseException) -> str:
    """The machine rule (or teardown) during which ``error`` was raised."""
    names = set(RULES) | set(FOCUS_RULES) | {"teardown", "__init__"}
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_name in names and "self" in frame.f_locals:
            name = frame.f_code.co_name
            return "opening the transport" if name == "__init__" else f"state.{name}(...)"
    return "a step"


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _verdict(prop: str, searched, failures: dict[str, list[Failure]]) -> PropertyVerdict:
    verdict, reason, seconds, examples = searched
    found = failures.get(prop, [])
    if found and verdict != "not applicable":
        own = [f for f in found if f.found_by == prop]
        failure = (own or found)[0]
        return PropertyVerdict(prop, "failed", failure.summary(), seconds, examples, failure)
    return PropertyVerdict(prop, verdict, reason, seconds, examples, None)
