"""How hard a certification looks: the profiles (quick, standard, thorough), the shared
search's share of them (SPEC.md C5), and the limits every search has unless told (shrinking,
a call's deadline)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from harel_ref.stateful import Capabilities

from ._probes import PROBE_SIZE

__all__ = ["DEFAULT_CALL_DEADLINE", "DEFAULT_SHRINK_LIMIT", "FITS", "PROFILES", "Profile", "SHARED_FACTOR", "default_level",
           "standby_examples"]


DEFAULT_SHRINK_LIMIT = 120.0
"""Seconds a search may spend shrinking a failure it found before it shows the failure as found
(SPEC.md C10).  A transport whose calls are slow (a wall clock, a server far away) made
Hypothesis shrink one failure for over five minutes."""

DEFAULT_CALL_DEADLINE = 30.0
"""Seconds a transport call may take before it is declared hung.  Not scaled by the profile:
a profile says how many calls to make, not how long one may take.  Generous for a networked
store (an rqlite call takes milliseconds); tests of a hanging transport pass a smaller one."""


@dataclass(frozen=True)
class Profile:
    """How hard each search looks: Hypothesis's ``max_examples`` and ``stateful_step_count``
    for every lockstep search; for the concurrent search, ``programs`` examples, each
    program run up to ``repeats`` times (races are rare events).

    ``target``: the seconds a certification with this profile aims at, whatever the transport
    (quick's).  A transport too slow for it, such as a networked store, whose every call and
    every opening is a round trip, gets the profile :meth:`fitted` to it: fewer examples and
    runs per search, the same steps and programs.

    ``probe``: the size of the probes that each search publishing backlogs runs as its first
    examples (:mod:`._probes`, SPEC.md C13a); 0, none."""

    name: str
    max_examples: int
    step_count: int
    programs: int = 10
    repeats: int = 10
    target: float | None = None
    probe: int = 0

    def __post_init__(self) -> None:
        if min(self.max_examples, self.step_count, self.programs, self.repeats) < 1:
            raise ValueError(f"every count of a Profile must be >= 1, got {self}")

    def divided(self, by: int) -> Profile:
        """This profile with its searches ``by`` times smaller: the examples of each lockstep
        search (at least 5) and the runs of each parallel program (at least 2); named
        ``NAME/by`` (what ``--profile quick/3`` asks for).  It is never fitted again: ``quick/1``
        is quick as it is, whatever the transport."""
        return Profile(f"{self.name}/{by}", max(5, math.ceil(self.max_examples / by)), self.step_count,
                       self.programs, max(2, math.ceil(self.repeats / by)), probe=self.probe)

    def fitted(self, estimate: Callable[[Profile], float]) -> Profile:
        """What runs for a transport whose run of a profile is estimated to take
        ``estimate(profile)`` seconds: this profile, unless it has a ``target`` and its estimate
        is more than twice that; then :meth:`divided` by the smallest of :data:`FITS` whose
        estimate is under the target.  The margin keeps an in-process transport on a busy
        machine, whose estimate swells, from being fitted one run and not the next; a networked
        store, whose every call is a round trip, is well beyond it.  Each divided profile is
        estimated on its own: a search of fewer examples runs in fewer lanes (SPEC.md C2a), so
        a profile's time is not the undivided one's over ``by``."""
        if self.target is None or estimate(self) <= 2 * self.target:
            return self
        return next((self.divided(by) for by in FITS if estimate(self.divided(by)) <= self.target),
                    self.divided(FITS[-1]))

    @classmethod
    def named(cls, name: str) -> Profile:
        """``quick``, ``standard``, ``thorough``, or one of them divided: ``quick/3``."""
        base, slash, by = name.partition("/")
        if base not in PROFILES or (slash and not (by.isdigit() and int(by) >= 1)):
            raise ValueError(f"unknown profile {name!r}; choose from {list(PROFILES)}, or one divided "
                             f"by a whole number (quick/3)")
        return PROFILES[base].divided(int(by)) if slash else PROFILES[base]

    @property
    def shared_examples(self) -> int:
        """Examples of the shared lockstep search (SPEC.md C5): :data:`SHARED_FACTOR` times a
        focused search's, which reaches each property's situations at least as often as that
        property's own search does (docs/certify-speed.md)."""
        return SHARED_FACTOR * self.max_examples

    @property
    def shrink_repeats(self) -> int:
        """Runs per program while a failure is being shrunk: a race that a program still
        contains shows within a few runs, and a program without it need not cost all of them."""
        return max(3, self.repeats // 3)


SHARED_FACTOR = 4
"""How many focused searches' examples the shared search runs (Profile.shared_examples)."""

FITS = (2, 3, 4, 6, 8)
"""What a profile with a target may be divided by to fit a slow transport (Profile.fitted)."""

PROFILES = {
    "quick": Profile("quick", max_examples=50, step_count=20, programs=20, repeats=20, target=75.0),
    "standard": Profile("standard", max_examples=120, step_count=35, programs=40, repeats=30, probe=PROBE_SIZE),
    "thorough": Profile("thorough", max_examples=500, step_count=60, programs=150, repeats=50, probe=PROBE_SIZE),
}


def default_level(caps: Capabilities) -> str:
    """The level the exit code follows unless one is chosen: ``contract`` for a transport of
    harel's Protocol, ``strict`` for one of harel-ref's."""
    return "contract" if caps.protocol == "harel" else "strict"


def standby_examples(profile: Profile, shared_before: int) -> int:
    """The examples of a focused search that runs because the shared search failed after
    ``shared_before`` examples without one (SPEC.md C5): those count for a focused search's as
    a passed shared search's do, one for every :data:`SHARED_FACTOR`; at least a quarter of the
    profile's remain its own."""
    return max(math.ceil(profile.max_examples / 4), profile.max_examples - shared_before // SHARED_FACTOR)
