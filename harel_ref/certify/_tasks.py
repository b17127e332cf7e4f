"""The searches a certification makes (:class:`Task`), in the order a serial run makes them,
and what each found (:class:`Found`), as data that comes back from a search process."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harel_ref.stateful._properties import PROPERTIES, SHARED

from ._report import Failure

__all__ = ["SOAK_PROPERTIES"]


SOAK_PROPERTIES = frozenset(p for p, row in PROPERTIES.items() if row.concurrent)
"""The properties a soak counts for (single-in-flight, fencing, no-loss, contention)."""


@dataclass(frozen=True)
class Task:
    """One search of a certification: the own search of the property ``kind``, or a shared
    one (``kind`` ``"shared"``, ``"concurrent"`` or ``"soak"``), whose time counts for
    ``prop``, the first property that needs it.  A ``standby`` search is a focused lockstep
    search that runs only if the shared lockstep search did not pass (SPEC.md C5).  The
    concurrent search ``judges`` ``refusals``, ``histories`` or both: what the chosen
    properties need (SPEC.md C6).  ``covers``: the properties whose rules it runs.  ``shrinks``:
    a standby search run again once every search has ended, to shrink the fact of this kind it
    met and set aside unshrunk, or this error (:func:`~harel_ref.stateful._facts.raised_error`)
    (:meth:`Certification.shrink_echoes`)."""

    kind: str
    prop: str
    standby: bool = False
    judges: frozenset[str] = frozenset()
    covers: tuple[str, ...] = ()
    shrinks: str = ""


def ordered_tasks(chosen: list[str], applicable: list[str], soak: float | None, sharing: tuple[str, ...] = ()) -> list[Task]:
    """The searches in the order a serial run makes them (and weighs them): each property's own
    search, and before the first property that needs a shared search, that one.

    ``sharing``: the properties the shared lockstep search covers (:func:`shared_properties`);
    it runs when they are two or more and all of them are chosen, and their own searches stand by."""
    tasks, shared = [], set()
    sharing = sharing if len(sharing) > 1 and set(sharing) <= set(chosen) else ()
    concurrent = tuple(p for p in PROPERTIES if p in applicable and PROPERTIES[p].concurrent)
    judges = frozenset(["refusals"] * any("refusals" in PROPERTIES[p].judges for p in concurrent)
                       + ["histories"] * any(PROPERTIES[p].search == "lockstep" for p in concurrent))
    for prop in chosen:
        if prop not in applicable:
            continue
        if sharing and prop == next(p for p in chosen if p in sharing):
            tasks.append(Task(SHARED, prop, covers=tuple(p for p in PROPERTIES if p in sharing)))
        if PROPERTIES[prop].search == "lockstep":
            tasks.append(Task(prop, prop, standby=prop in sharing, covers=(prop,)))
        wanted = ["concurrent"] + (["soak"] if soak else []) if prop in SOAK_PROPERTIES else []
        for kind in wanted:
            if kind in shared:
                continue
            shared.add(kind)
            tasks.append(Task(kind, prop, judges=judges if kind == "concurrent" else frozenset(), covers=concurrent))
    return tasks


@dataclass
class Found:
    """What one search found, as data (it comes back from a search process): how it ended
    (``passed``, ``failed``: it stopped at the failures it found, ``unknown``: it could not
    finish, ``covered``: the shared search made it needless) and why, its time and examples, and
    the failures it found.  Whom a failure counts against, and so every verdict, is
    :func:`harel_ref.certify._verdicts.verdicts`'s to say."""

    ended: str
    reason: str
    seconds: float
    examples: int
    failures: list[Failure] = dataclasses.field(default_factory=list)
    # of the failures, how many come before those it stopped at: the concurrent search's earlier
    # passes (shrunk before a stop), the soak's errors and history breaches (judged in full)
    earlier: int = 0
    reached: dict[str, int] = dataclasses.field(default_factory=dict)  # situations met (_properties)
    clean: int | None = None  # of a lockstep search that failed: its examples that ended before the failure
    undecided: tuple[str, ...] = ()  # of a shared search that passed: the properties left to their own searches
