"""One pure function from what the searches of a certification found to a verdict per property.

The checkers report facts (:mod:`harel_ref.stateful._facts`), each search ends as a
:class:`Searched`, and :func:`verdicts` decides, once and nowhere else:

1. **Whom each fact counts against.**  The property that owns its kind in the table
   (:mod:`harel_ref.stateful._properties`), unless the example did something before it that a
   property the search covers ``blames_after`` (a reopen is durability's: what it broke shows
   at a later step), or the owner's own search, which looks for exactly that, passed and a
   property that ``explains`` its kind found it in its own search, or found it in the shared
   search and failed in its own (a floor misapplied passes over a group whose lease lapsed: the
   priority-floor search sees it, the lease-expiry search does not), unless the search left it
   unshrunk as an echo of another property's bug (SPEC.md C5; :attr:`Failure.echo`); a fault
   (an error the spec never asks for, a panic, a hang) counts against the property whose
   search met it (:func:`~harel_ref.stateful._properties.fault_owner`), but an error several
   lockstep searches met, one bug wherever it shows (:func:`fault_owners`), counts against one
   property: the shared search's, else the first in the table's order whose search met it.
2. **Which failures are consequences of another.**  One bug shows in many searches: a queue
   that drops an event equal to one it holds loses a message (no-loss), and every later claim
   of that group looks wrong to the other searches (a group passed over, a head missing).  A
   property whose every fact is one that another failed property owns or ``explains``, where
   that other property also failed in a way this one does not explain (one call at a time,
   where this one's facts were: a race explains no fact of a lockstep search), is a
   *consequence* of it: its verdict is unknown, and the root failure lists it.  So is a
   property whose search stopped at another's failure.
3. **Every verdict**, from the searches that stand for the property: its own, the shared
   lockstep search when that passed (SPEC.md C5), the concurrent search and the soak for the
   properties they judge.

Nothing here runs a search, replays an example or reads a clock: the same searches always give
the same verdicts (SPEC.md C1).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harel_ref.stateful._backend import Capabilities
from harel_ref.stateful._facts import CONTEXTS, FAULTS, MISSED_CLAIMABLE, Fact, raised_error
from harel_ref.stateful._properties import (
    PROPERTIES, SHARED, SIZES, can_explain, drawn, evidence, fault_owner, owner, tally,
)

from ._report import Failure, PropertyVerdict

__all__ = ["Searched", "anothers", "blame", "consequences", "fault_owners", "left_undecided", "sets_aside",
           "shared_sets_aside", "unexplained", "verdicts"]


@dataclass(frozen=True)
class Searched:
    """What one search of a certification ended with.

    - ``search``: a property's own search (its name), ``"shared"``, ``"concurrent"`` or
      ``"soak"``; ``covers``: the properties whose rules it ran, in the table's order.
    - ``ended``: ``"passed"`` (it judged everything it covers: a property with no fact from it
      passed, whatever it found against others), ``"failed"`` (it stopped at the failures
      ``stopped_at``: what it covers and found nothing against is undecided), ``"unknown"``
      (it could not finish: ``reason`` says why) or ``"covered"`` (a focused search the shared
      search made needless: it never ran).
    - ``failures``: what it found, each with its fact; ``reached``: the situations it met."""

    search: str
    covers: tuple[str, ...]
    ended: str
    reason: str = ""
    seconds: float = 0.0
    examples: int = 0
    failures: tuple[Failure, ...] = ()
    reached: Mapping[str, int] = field(default_factory=dict)
    stopped_at: tuple[Failure, ...] | None = None  # None: all its failures, when it ended "failed"
    undecided: tuple[str, ...] = ()  # of a shared search that passed: what it set aside left these to their own

    def stopped(self) -> tuple[Failure, ...]:
        """The failures it stopped at (none unless it ended "failed")."""
        if self.ended != "failed":
            return ()
        return self.failures if self.stopped_at is None else self.stopped_at

    def decides(self, prop: str) -> bool:
        """Whether this search stands for ``prop``'s verdict: a shared lockstep search only when
        it passed (else the focused searches ran and decide), and not for a property it left
        ``undecided``; a search never run not at all."""
        if prop not in self.covers or self.ended == "covered" or prop in self.undecided:
            return False
        return self.search != SHARED or self.ended == "passed"


def blame(fact: Fact, search: Searched, cleared: frozenset[str] = frozenset(),
          convicted: frozenset[str] = frozenset()) -> str:
    """The property ``fact``, found by ``search``, counts against (the module docstring, 1);
    ``cleared``: the properties whose own search passed, ``convicted``: those whose own search
    found a fact against them."""
    if fact.kind in FAULTS:
        return fault_owner(search.search, search.covers, fact.rule)
    for context in CONTEXTS:  # the earliest kind of cause first
        if context in fact.after:
            for prop in search.covers:
                if context in PROPERTIES[prop].blames_after:
                    return prop
    if owner(fact.kind) in cleared:
        explaining = [p for p in search.covers if can_explain(p, fact)]
        if search.search in explaining:
            return search.search
        if found := [p for p in explaining if p in convicted]:
            return found[0]
    return owner(fact.kind)


def fault_owners(searched: Sequence[Searched]) -> dict[str, str]:
    """Whom each error the lockstep searches met counts against, by :func:`raised_error`: a
    transport that cannot store a group id with a NUL raises at the first publish of one in
    every search that draws it, and that is one bug, not one failure per search (SPEC.md C5).
    Where the shared search met it, the property it counts against there; else the first, in
    the table's order, whose own search met it (told unshrunk as an echo or not)."""
    order = sorted((s for s in searched if s.search == SHARED or s.search in PROPERTIES),
                   key=lambda s: -1 if s.search == SHARED else list(PROPERTIES).index(s.search))
    owners: dict[str, str] = {}
    for search in order:
        for failure in search.failures:
            if (error := raised_error(failure.fact)) is not None:
                owners.setdefault(error, blame(failure.fact, search))
    return owners


def sets_aside_error(fact: Fact, errors: frozenset[str]) -> bool:
    """Whether a search sets aside an example at ``fact``: an error of ``errors``, which
    another search met first (or an earlier pass of its own, which told it), as one bug."""
    return raised_error(fact) in errors


def anothers(fact: Fact, prop: str) -> bool:
    """Whether ``fact``, met by ``prop``'s own search, counts against another property whatever
    else the certification finds: ``prop`` neither owns its kind nor explains it, it is no fault,
    and nothing before it is ``prop``'s to blame (a reopen in durability's search).  Such a
    search has not decided ``prop`` when it stops there (SPEC.md C5)."""
    return blame(fact, Searched(prop, (prop,), "failed")) != prop and not can_explain(prop, fact)


def sets_aside(fact: Fact, known: frozenset[str], prop: str) -> bool:
    """Whether ``prop``'s own search sets aside an example at ``fact`` when the kinds ``known``
    (:func:`~harel_ref.stateful._properties.explained`) are another bug's: of such a kind, and
    counting against another property all the same (not after a step ``prop`` blames)."""
    return fact.kind in known and anothers(fact, prop)


def unexplained(fact: Fact, covers: tuple[str, ...]) -> bool:
    """Whether ``fact``, found by the shared search, counts against the property that owns its
    kind whatever else is found: no fault, nothing before it that another property blames, and
    no other property it covers explains its kind.  Only then may the shared search search again
    with that property taken as broken (SPEC.md C5): a fact another's bug explains (a group
    passed over, which a lost message also makes) may be that bug's echo, and the searches of
    the properties that could be its cause must run."""
    if fact.kind in FAULTS or blame(fact, Searched(SHARED, covers, "failed")) != owner(fact.kind):
        return False
    return not any(can_explain(prop, fact) for prop in covers)


def shared_sets_aside(fact: Fact, broken: frozenset[str], covers: tuple[str, ...]) -> bool:
    """Whether the shared search, searching again with the properties ``broken`` taken as broken
    (SPEC.md C5), sets aside an example at ``fact``: one that counts against one of them, or of
    a kind their bugs own or explain, whatever came before it; never a fault.  Whom else such a
    fact could count against is left to their own searches (:func:`left_undecided`)."""
    if fact.kind in FAULTS:
        return False
    return any(fact.kind in PROPERTIES[prop].owns or can_explain(prop, fact) for prop in broken) \
        or blame(fact, Searched(SHARED, covers, "failed")) in broken


def left_undecided(aside: Sequence[Fact], broken: frozenset[str], covers: tuple[str, ...]) -> tuple[str, ...]:
    """The properties a shared search that passed after setting aside examples at the facts
    ``aside`` does not stand for: those it covers, not taken as ``broken``, that one of them
    could count against (by its kind, a kind they explain, or what came before it).  A bug of
    theirs could have shown only as such a fact, so their own searches decide them, as after a
    shared search that failed (SPEC.md C5)."""
    searched = Searched(SHARED, covers, "failed")
    could = set()
    for fact in aside:
        could |= {prop for prop in covers if fact.kind in PROPERTIES[prop].owns or can_explain(prop, fact)}
        could.add(blame(fact, searched))
    return tuple(prop for prop in covers if prop in could and prop not in broken)


def consequences(failed: Mapping[str, Sequence[Fact]],
                 in_lockstep: Mapping[str, Sequence[Fact]] | None = None) -> dict[str, str]:
    """Of the properties with facts against them (``failed``), each that is a consequence of
    another, and the root failure it follows from (the module docstring, 2).  Candidates are
    tried in the table's order; a chain leads to its root, and a cycle is no consequence.  A
    root needs a fact of a kind it owns that the other does not explain: a fault, or a fact it
    got only by what came before it, explains nothing.  ``in_lockstep``: of each property's
    facts, those a lockstep search found, one call at a time (all, if not given).  A root whose
    own facts only calls made at once showed (a race) explains no such fact: its bug does not
    show one call at a time."""
    in_lockstep = failed if in_lockstep is None else in_lockstep

    def explains(prop: str, fact: Fact) -> bool:
        # a root whose own failure is a group missed (missed-claimable: a lock table that
        # collides, a claim that reads one page) left the queue's messages as they were
        missed = PROPERTIES[prop].drain_shows and any(f.kind == MISSED_CLAIMABLE for f in failed[prop])
        return fact.kind in PROPERTIES[prop].owns or can_explain(prop, fact) or (missed and fact.kind in PROPERTIES[prop].explains)

    def shows(root: str, prop: str, facts: Sequence[Fact]) -> bool:
        return any(f.kind in PROPERTIES[root].owns and not explains(prop, f) for f in facts)

    follows: dict[str, str] = {}
    for prop in (p for p in PROPERTIES if p in failed):
        for root in (r for r in PROPERTIES if r in failed and r != prop):
            sequential = bool(in_lockstep.get(prop))  # a fact of its own one call at a time
            if all(explains(root, f) for f in failed[prop]) and \
                    shows(root, prop, in_lockstep.get(root, ()) if sequential else failed[root]):
                follows[prop] = root
                break
    found = {}
    for prop in follows:
        chain = [prop]
        while chain[-1] in follows and follows[chain[-1]] not in chain:
            chain.append(follows[chain[-1]])
        if chain[-1] not in follows:  # a root, not a cycle
            found[prop] = chain[-1]
    return found


def verdicts(chosen: Sequence[str], caps: Capabilities, searched: Sequence[Searched],
             why: str | None = None) -> dict[str, PropertyVerdict]:
    """The verdict on every chosen property, and on any other a search found broken, in the
    table's order for the latter.  ``why``: the run was stopped (a search that did not end says
    it was interrupted, or not reached)."""
    errors = fault_owners(searched)
    cleared = frozenset(s.search for s in searched if s.search in PROPERTIES and s.ended == "passed")
    convicted = frozenset(s.search for s in searched for f in s.failures
                          if s.search in PROPERTIES and _blame(f, s, errors, cleared) == s.search)
    against: dict[str, list[tuple[Failure, Searched]]] = collections.defaultdict(list)
    for search in searched:
        for failure in search.failures:
            against[_blame(failure, search, errors, cleared, convicted)].append((failure, search))
    follows = consequences({prop: [f.fact for f, _ in found] for prop, found in against.items()},
                           {prop: [f.fact for f, s in found if s.search == SHARED or s.search in PROPERTIES]
                            for prop, found in against.items()})
    stopped = {prop: _stopped_by(prop, searched, follows, errors, cleared, convicted) for prop in chosen}
    follows.update({prop: root for prop, root in stopped.items() if root is not None and prop not in against})
    order = list(chosen) + [p for p in PROPERTIES if p in against and p not in chosen]
    return {prop: _verdict(prop, caps, searched, against.get(prop, []), follows, why) for prop in order}


def _blame(failure: Failure, search: Searched, errors: Mapping[str, str], cleared: frozenset[str],
           convicted: frozenset[str] = frozenset()) -> str:
    """:func:`blame` for a failure: an error several lockstep searches met counts against its
    one owner (``errors``, :func:`fault_owners`); an echo of another property's bug, which its
    finder did not shrink (SPEC.md C5), counts against that bug's property, never its finder's
    own."""
    lockstep = search.search == SHARED or search.search in PROPERTIES
    if lockstep and (error := raised_error(failure.fact)) in errors:
        return errors[error]
    if failure.echo:
        return blame(failure.fact, search)
    return blame(failure.fact, search, cleared, convicted)


def _stopped_by(prop: str, searched: Sequence[Searched], follows: dict[str, str], errors: Mapping[str, str],
                cleared: frozenset[str], convicted: frozenset[str]) -> str | None:
    """The root failure a search that stands for ``prop`` stopped at, if one did."""
    for search in searched:
        if search.decides(prop):
            for failure in search.stopped():
                blamed = _blame(failure, search, errors, cleared, convicted)
                if blamed != prop:
                    return follows.get(blamed, blamed)
    return None


def _verdict(prop: str, caps: Capabilities, searched: Sequence[Searched], found: list[tuple[Failure, Searched]],
             follows: dict[str, str], why: str | None) -> PropertyVerdict:
    parts = sorted((s for s in searched if s.decides(prop)), key=lambda s: s.search != prop)  # its own first
    seconds = sum(_share(search, prop) for search in searched)
    examples = parts[0].examples if parts else 0
    reached: collections.Counter[str] = collections.Counter()
    for search in searched:
        if prop in search.covers:
            tally(reached, search.reached)
    counted = {situation: reached[situation] for situation in evidence(prop, caps)}
    sizes = {size: reached[size] for size in SIZES if reached[size]}
    scale = dict(largest=sizes, drawn=drawn(reached))
    if (reason := PROPERTIES[prop].needs(caps)) is not None:
        return PropertyVerdict(prop, "not applicable", reason, 0.0, 0)
    # the counterexample shown: its own search's, of a kind it owns, shrunk, where there is one
    failure = min(found, key=lambda item: (
        item[1].search != prop, item[0].kind not in PROPERTIES[prop].owns, bool(item[0].unshrunk)))[0] if found else None
    if prop in follows:  # its counterexample stays in the report, under its reason
        # one its own search stopped at, where no fact counts against it: the root's, found its way
        failure = failure or next((f for s in parts if s.search == prop for f in s.stopped()), None)
        return PropertyVerdict(prop, "unknown", _consequence_reason(follows[prop], failure, parts), seconds, examples,
                               failure, counted, **scale)
    if found:
        shown = tuple(p for p, root in sorted(follows.items(), key=lambda item: list(PROPERTIES).index(item[0]))
                      if root == prop)
        return PropertyVerdict(prop, "failed", failure.summary(), seconds, examples, failure, counted, shown, **scale)
    verdict, reason = _combined(prop, parts, why)
    never = [situation for situation, times in counted.items() if not times]
    if verdict == "passed" and never:
        reason = f"{reason}; never reached: {'; '.join(never)}"
    return PropertyVerdict(prop, verdict, reason, seconds, examples, evidence=counted, **scale)


def _share(search: Searched, prop: str) -> float:
    """The seconds of ``search`` that ``prop``'s verdict cost: an equal share among the
    properties it stands for, or, a search that stands for none (a shared search that found
    something), among those it covers."""
    if prop not in search.covers:
        return 0.0
    decided = [p for p in search.covers if search.decides(p)]
    if decided:
        return search.seconds / len(decided) if prop in decided else 0.0
    return search.seconds / len(search.covers)


def _consequence_reason(root: str, failure: Failure | None, parts: list[Searched]) -> str:
    if failure is None:
        how = next((s.reason for s in parts if s.ended == "failed" and s.reason), "stopped at it")
        return f"a consequence of {root}'s failure: its search {how} (see {root})"
    whose = f"a fact of {root}'s" if failure.kind in PROPERTIES[root].owns else f"which {root}'s bug explains"
    return f"a consequence of {root}'s failure: its search saw {failure.kind}, {whose} (see {root}): {failure.summary()}"


def _combined(prop: str, parts: list[Searched], why: str | None) -> tuple[str, str]:
    """One verdict from the searches that stand for ``prop`` and found nothing against it:
    passed when all passed, else unknown with the first reason why."""
    if not parts:
        how = "interrupted" if why else "not reached"
        return "unknown", f"{how}: {why}" if why else how
    reasons = []
    for search in parts:
        own = search.search == prop
        if search.ended != "passed":
            reason = search.reason or "it stopped at what it found"
            return "unknown", reason if own else f"{search.search} search: {reason}"
        label = "" if own else "shared search: " if search.search == SHARED else f"{search.search}: "
        reasons.append(f"{label}{search.reason}")
    return "passed", "; ".join(reasons)
