"""The properties a certification gives a verdict on: one table, one row per property.

The checkers report *facts* (:mod:`harel_ref.stateful._facts`): a claim took a leased group, an
ack of a stale lease took effect, the drain found other messages than the queue holds.  This
table is the only place that says which property a fact breaks, and what each property's search
runs; :mod:`harel_ref.certify._verdicts` turns the facts of a certification into verdicts with
it.  A new property is its rule in SPEC.md, its model code, and a row here.

Each row says:

- ``what``: the property in one line, and ``spec``: the SPEC.md rules it owns;
- ``level``: ``contract`` (what harel itself promises) or ``strict`` (harel-ref's spec beyond);
- ``needs``: why it does not apply to a transport's capabilities (None: it applies);
- ``search``: ``lockstep`` (a focused search of the machine) or ``concurrent`` (none of its
  own: the shared concurrent search judges it); ``concurrent``: its verdict needs the shared
  concurrent search too;
- how its focused search runs: the machine ``rules`` that exercise it, and what it ``judges``
  that other searches relax (:data:`JUDGED`; :func:`machine_settings` turns that into the
  machine's settings);
- ``owns``: the kinds of fact that break it (each kind is owned by one row);
- ``explains``: kinds owned by other rows that its own bug can also show as: a lost message
  makes a later claim pass over its group, which looks like a fairness failure.  A property
  whose every failure another failed property explains is a *consequence* of that one;
- ``drain_shows``: its bug is in which messages the queue holds (one lost, duplicated or
  changed), which a drain shows: where a drain right after a claim found the queue as the
  model holds it, it explains nothing that claim answered (:func:`can_explain`);
- ``acts_after``: what its bug needs to exist before it can act, ``"lease"`` (a lease's end)
  or ``"park"``: it explains no fact met before the example had one;
- ``blames_after``: what an example did before a fact (:data:`~harel_ref.stateful._facts.CONTEXTS`)
  that makes the fact this property's, whatever its kind: what a reopen broke shows only at a
  later step;
- ``evidence``: the situations its verdict counts (SPEC.md C4).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import harel_ref.stateful._facts as facts
from ._backend import Capabilities
from ._facts import CONTEXTS, FAULTS, KINDS, Fact
from ._values import LONG

__all__ = [
    "CONTRACT", "DRAIN_CHECKED", "DRAWN", "JUDGED", "PROPERTIES", "Property", "SHARED", "can_explain", "drawn", "evidence", "fault_owner", "machine_settings",
    "owner", "owners", "problems", "running", "SIZES", "largest", "tally", "unreached",
]

CORE = frozenset({"prefill", "publish", "claim_any", "ack"})
SCALE = frozenset({"publish_each", "backlog", "claim_many"})
"""A message to each of the example's ids, a backlog published at once and claims in a row
(SPEC.md C13): the shared search, and the searches of the properties that data and sizes break
(single-in-flight, fifo, no-loss).  Not every search: in the others' short quick searches they
crowd out the steps that find their bugs."""
TIME = frozenset({"advance"})

JUDGED = {
    "priority": "priorities and min_priority (elsewhere every publish uses 0, every claim floor 0)",
    "routing": "routing keys and filters (elsewhere none)",
    "fairness": "the order of groups (elsewhere any claimable group is allowed)",
    "ties": "the order of groups with equal stamps: arrival (elsewhere any, as harel's round-robin)",
    "exact time": "a claim at the exact end of a lease or park (elsewhere judged within a tick of it)",
    "stale leases": "acks and nacks of superseded or used leases, the model fenced whatever is declared",
    "consequences": "what a stale ack or nack by seq breaks, for a transport that acks by seq (R20)",
    "close": "every call after close() (elsewhere only closing at the end)",
    "refusals": "errors raised by calls that ran at once (the concurrent search judges them for such a row)",
}
"""What a focused search may judge that the others relax (a row's ``judges``)."""


SHARED = "shared"
"""The name of the shared lockstep search: every lockstep property's rules in one machine, every
one of them judged at once (SPEC.md C5)."""


HELD = "a claim while a group's head was leased or parked"
LEASE_END = "a claim at a lease's exact end"
LEASE_LAPSED = "a claim after a lease lapsed, nobody having claimed again"
PARK_ENDED = "a claim after a park ended"
STALE_AFTER_RECLAIM = "an ack or nack of a lease whose message was claimed again"
TIE = "a claim between groups of equal fairness stamps"
REOPEN_HELD = "a reopen with a lease held"
OVERLAP = "a run of a program whose branches overlapped"
UNJUDGED = "a run left unjudged: its raised calls allowed more orders than the checker tries"
DRAIN_CUT = "a run whose drain an error of R17 cut short: what it left is unjudged"
NEAR_GROUPS = "two group ids of one near-collision family holding messages at once"
NEAR_KEYS = "a claim filtered by routing keys of one near-collision family"
LONG_EVENT = "an event of 32 KiB or more"
FAR_CLOCK = "a claim with the clock at today's epoch or later"
LONG_LEASE = "a lease or park of an hour or more"
MANY_GROUPS = "a claim among 100 groups or more"
LONG_GROUP = "a claim with 100 messages or more in one group"
MANY_NACKS = "a message nacked 8 times or more"
MANY_WORKERS = "claims by 8 workers or more in one example"
ANEW_BY_FLOOR = "a claim by floor, through the instance that made a group, after another made it anew"
ANEW_BY_KEY = "a claim by key, through the instance that made a group, after another made it anew"
"""Situations a search can reach: what a property's rules are about (R2, R3, R9, R10, R4, R15, R19),
and the values and sizes they are tried with (SPEC.md C13).  The checkers count them
(``TransportMachine.reached``, the parallel search's runs) and each verdict reports, for the
situations of its row's ``evidence``, how often its searches reached them."""

GROUPS_AT_A_CLAIM = "groups at a claim"
GROUPS_IN_FLIGHT = "groups in flight at once"
MESSAGES_IN_A_GROUP = "messages in one group at a claim"
NACKS_OF_A_MESSAGE = "nacks of one message"
WORKERS_IN_AN_EXAMPLE = "workers in one example"
BRANCHES_IN_A_PROGRAM = "branches in one program"
DRAWN = "drawn: "
"""The prefix of the counts of the values the searches drew (SPEC.md C13), by kind and family:
``drawn: ids case`` is the number of examples whose group ids were of the case family,
``drawn: events 65536 bytes`` the number of events of that size published.  Counts add up."""


def drawn(reached: Mapping[str, int]) -> dict[str, int]:
    """The counts of :data:`DRAWN` in ``reached``, by ``kind family``, in order of kind."""
    kinds = ("ids", "keys", "events")
    found = {name.removeprefix(DRAWN): count for name, count in reached.items() if name.startswith(DRAWN) and count}
    return dict(sorted(found.items(), key=lambda item: (kinds.index(item[0].split()[0]), -item[1], item[0])))


SIZES = (GROUPS_AT_A_CLAIM, GROUPS_IN_FLIGHT, MESSAGES_IN_A_GROUP, NACKS_OF_A_MESSAGE, WORKERS_IN_AN_EXAMPLE, BRANCHES_IN_A_PROGRAM)
"""Sizes a search reaches (SPEC.md C13): the checkers keep the largest of each beside the counts
of situations, and each verdict lists the largest its searches reached (:func:`tally`)."""


def tally(into: collections.Counter, more: Mapping[str, int]) -> None:
    """Add what more examples or searches reached to ``into``: the counts of situations add up,
    the :data:`SIZES` keep the largest."""
    for name, value in more.items():
        into[name] = max(into[name], value) if name in SIZES else into[name] + value


def largest(reached: MutableMapping[str, int], name: str, value: int) -> None:
    """Keep ``value`` as the size ``name`` (one of :data:`SIZES`) if it is the largest yet."""
    if value > reached.get(name, 0):
        reached[name] = value


EXACT_TIME_ONLY = frozenset({LEASE_END, FAR_CLOCK, LONG_LEASE})
"""The situations only an injectable clock reaches: a wall clock never stops at an instant, starts
where it is and is slept through (no lease of an hour)."""

_CLAIM_ANSWERS = frozenset({
    facts.CLAIMED_LEASED, facts.CLAIMED_AT_LEASE_END, facts.CLAIMED_PARKED, facts.MISSED_LAPSED_LEASE, facts.MISSED_ENDED_PARK, facts.MISSED_ABOVE_FLOOR, facts.MISSED_KEYED,
    facts.BELOW_FLOOR, facts.OUTSIDE_KEYS, facts.NOT_HEAD, facts.PASSED_OVER, facts.TIE_ORDER,
    facts.SEQ_CHANGED, facts.SEQ_ORDER,
})
"""What a claim's answer can show: a queue that lost, duplicated or changed a message shows as
any of them at a later claim.  (Not ``claimed-held-by-worker``: the model itself freed that
group, by a stale nack by seq, R20.)"""


@dataclass(frozen=True)
class Property:
    """One verdict line (see the module docstring for the fields)."""

    name: str
    what: str
    spec: tuple[str, ...]
    level: str
    rules: frozenset[str] = frozenset()
    needs: Callable[[Capabilities], str | None] = lambda caps: None
    search: str = "lockstep"
    concurrent: bool = False
    judges: frozenset[str] = frozenset()  # see JUDGED
    owns: frozenset[str] = frozenset()
    explains: frozenset[str] = frozenset()
    drain_shows: bool = False
    acts_after: str | None = None  # "lease" or "park"
    blames_after: frozenset[str] = frozenset()
    evidence: tuple[str, ...] = ()  # situations its verdict counts (see LEASE_END ...)


def _declared(field: str, reason: str) -> Callable[[Capabilities], str | None]:
    return lambda caps: None if getattr(caps, field) else reason


def _ordered(caps: Capabilities) -> str | None:
    return "fairness is declared unspecified" if caps.fairness == "unspecified" else None


PROPERTIES: dict[str, Property] = {p.name: p for p in (
    Property(
        "single-in-flight",
        "a group whose head is leased or parked is not claimable, by any instance, also when callers race (R2, R19)",
        ("R2", "R19"), "contract",
        rules=CORE | SCALE | {"nack_now", "claim_at_deadline", "open_second_instance"},
        concurrent=True, judges=frozenset({"consequences"}),
        owns=frozenset({facts.CLAIMED_LEASED, facts.CLAIMED_HELD_BY_WORKER, facts.OVERLAP}),
        evidence=(HELD, OVERLAP, NEAR_GROUPS, MANY_GROUPS, MANY_WORKERS),
    ),
    Property(
        "fifo",
        "a group's messages come out in publish order; a nacked message stays the head; seqs are stable and "
        "increase (R1, R6, R8, R16)",
        ("R1", "R6", "R8", "R16"), "contract",
        rules=CORE | SCALE | {"nack_now", "nack_later", "claim_at_deadline"},
        owns=frozenset({facts.NOT_HEAD, facts.SEQ_CHANGED, facts.SEQ_ORDER, facts.OUT_OF_ORDER}),
        evidence=(LONG_GROUP, MANY_NACKS),
    ),
    Property(
        "lease-expiry",
        "a lease (or park) is live while now <= its end, and claimable one tick after, also when the clock "
        "steps back (R3, R9)",
        ("R3", "R9"), "contract",
        rules=CORE | {"nack_later", "advance_to_deadline", "claim_at_deadline", "step_back", "step_back_to_deadline"},
        # On a wall clock the boundary rules cannot run: leases lapse by sleeping, and each call
        # is judged at every moment between its invocation and its answer (R18).
        judges=frozenset({"exact time"}),
        owns=frozenset({facts.MISSED_LAPSED_LEASE, facts.CLAIMED_AT_LEASE_END}),
        # a lease that ends too soon hands out its group while it should be held; one that ends
        # too late makes a claim take the next group
        explains=frozenset({facts.CLAIMED_LEASED, facts.PASSED_OVER, facts.TIE_ORDER}), acts_after="lease",
        blames_after=frozenset({facts.STEPPED_BACK}), evidence=(LEASE_END, LEASE_LAPSED, FAR_CLOCK, LONG_LEASE),
    ),
    Property(
        "parking",
        "nack(lease, delay > 0) blocks the group until now + delay, then the head returns (R9)",
        ("R9",), "contract",
        rules=CORE | {"nack_later", "claim_at_deadline"},
        needs=_declared("parking", "the transport does not declare parking"),
        owns=frozenset({facts.CLAIMED_PARKED, facts.MISSED_ENDED_PARK, facts.PARK_REFUSED}),
        explains=frozenset({facts.PASSED_OVER, facts.TIE_ORDER}), acts_after="park",
        evidence=(PARK_ENDED,),
    ),
    Property(
        "fencing",
        "ack/nack act only under the lease's token; superseded or used leases get False; tokens are never "
        "reused; also when callers race (R10, R16, R19)",
        ("R10", "R16", "R19"), "strict",
        rules=CORE | {"nack_now", "nack_later", "claim_at_deadline", "open_second_instance", "release_stale"},
        concurrent=True, judges=frozenset({"stale leases"}),
        owns=frozenset({facts.STALE_ACTED, facts.STALE_RAISED, facts.CURRENT_REFUSED, facts.TOKEN_REUSED}),
        blames_after=frozenset({facts.RELEASED_STALE}),
        evidence=(STALE_AFTER_RECLAIM, OVERLAP),
    ),
    Property(
        "fairness",
        "round-robin: the claimable group with the oldest fairness stamp goes first (R4, R5; the order of "
        "equal stamps is tie-break's)",
        ("R4", "R5"), "contract",
        rules=CORE | TIME | {"nack_now", "advance_to_deadline"},
        needs=_ordered, judges=frozenset({"fairness"}), owns=frozenset({facts.PASSED_OVER}),
        explains=frozenset({facts.TIE_ORDER}),  # a stamp set wrong makes groups tie, or not (a publish may set it)
    ),
    Property(
        "tie-break",
        "groups with equal fairness stamps (never claimed, or claimed at one instant) go in arrival order (R4)",
        ("R4",), "strict",
        rules=CORE | TIME | {"nack_now", "advance_to_deadline"},
        needs=_ordered, judges=frozenset({"fairness", "ties"}), owns=frozenset({facts.TIE_ORDER}),
        evidence=(TIE,),
    ),
    Property(
        "priority-floor",
        "claim(min_priority=p) only takes groups of priority >= p (R4, R12)",
        ("R4", "R12"), "contract",
        # a second instance, and groups published anew: what one instance caches of a group (its
        # priority) goes stale when the other empties it and publishes it again
        rules=CORE | TIME | {"claim", "open_second_instance", "publish_anew"},
        needs=_declared("priority", "the transport does not declare priorities"),
        judges=frozenset({"priority"}), owns=frozenset({facts.BELOW_FLOOR, facts.MISSED_ABOVE_FLOOR}),
        # a floor misapplied passes over a group above it whose lease or park lapsed, too
        explains=frozenset({facts.MISSED_LAPSED_LEASE, facts.MISSED_ENDED_PARK}), acts_after="lease",
        evidence=(ANEW_BY_FLOOR,),
    ),
    Property(
        "routing",
        "claim(routing_keys=...) only takes groups with one of those keys (R4, R12)",
        ("R4", "R12"), "strict",
        rules=CORE | TIME | {"publish_each", "claim", "claim_other_keys", "open_second_instance", "publish_anew"},
        needs=_declared("routing", "the transport does not declare routing keys"),
        judges=frozenset({"routing"}), owns=frozenset({facts.OUTSIDE_KEYS, facts.MISSED_KEYED}),
        explains=frozenset({facts.MISSED_LAPSED_LEASE, facts.MISSED_ENDED_PARK}), acts_after="lease",
        evidence=(NEAR_KEYS, ANEW_BY_KEY),
    ),
    Property(
        "durability",
        "closing and reopening on the same storage keeps every message, lease and park (R15)",
        ("R15",), "contract",
        rules=CORE | {"nack_now", "nack_later", "claim_at_deadline", "reopen", "open_second_instance"},
        needs=_declared("durable", "the transport does not declare durability"),
        blames_after=frozenset({facts.REOPENED}), evidence=(REOPEN_HELD,),
    ),
    Property(
        "no-loss",
        "draining at the end yields every message published and not acked, exactly once, also after "
        "callers raced (R1, R7, R19)",
        ("R1", "R7", "R19"), "contract",
        rules=CORE | SCALE | TIME | {"nack_now", "nack_later", "open_second_instance"},
        concurrent=True, judges=frozenset({"consequences"}),
        owns=frozenset({facts.MISSED_CLAIMABLE, facts.UNKNOWN_MESSAGE, facts.ACKED_HELD_MESSAGE,
                        facts.PUBLISH_ANSWERED, facts.DRAIN_DIFFERS, facts.QUEUE_DIFFERS, facts.LOST,
                        facts.DUPLICATED, facts.UNEXPECTED, facts.REDELIVERED}),
        # a message lost, duplicated or changed shows at every later claim and release of its group
        explains=_CLAIM_ANSWERS | {facts.CURRENT_REFUSED, facts.PARK_REFUSED, facts.OVERLAP, facts.OUT_OF_ORDER},
        drain_shows=True,
        evidence=(OVERLAP, NEAR_GROUPS, LONG_EVENT, MANY_GROUPS, LONG_GROUP, MANY_NACKS),
    ),
    Property(
        "event-integrity",
        "a claim answers each event as it was published: empty, long, with NUL characters or text that "
        "JSON or an encoding would change (R1)",
        ("R1",), "contract",
        rules=CORE | {"publish_each", "nack_now"},
        owns=frozenset({facts.EVENT_CHANGED}),
        # an event changed into the text of another message looks like that message: one acked,
        # another group's, one behind the head; to a history, a message never published and one lost
        explains=frozenset({facts.UNKNOWN_MESSAGE, facts.NOT_HEAD, facts.UNEXPECTED, facts.LOST}),
        drain_shows=True, evidence=(LONG_EVENT,),
    ),
    Property(
        "contention",
        "callers that run at once get answers, not errors: no call fails only because others ran at the "
        "same time, such as SQLite's 'database is locked' (R19)",
        ("R19",), "contract",
        search="concurrent", concurrent=True, judges=frozenset({"refusals"}),
        owns=frozenset({facts.RAISED_UNDER_CONTENTION, facts.NONE_UNDER_CONTENTION}),
        evidence=(OVERLAP,),
    ),
    Property(
        "bad-input",
        "bad arguments, forged leases and a clock that answers no time raise ValueError/TypeError and "
        "write nothing (R13)",
        ("R13",), "strict",
        rules=CORE | TIME | {"bad_input", "bad_release"},
        owns=frozenset({facts.BAD_INPUT_ACCEPTED}), blames_after=frozenset({facts.REFUSED}),
    ),
    Property(
        "close",
        "after close() every call raises; close() twice is harmless; other instances go on (R14)",
        ("R14",), "strict",
        rules=CORE | TIME | {"open_second_instance"}, judges=frozenset({"close"}),
        owns=frozenset({facts.CLOSED_CALL_ANSWERED, facts.CLOSED_WITHOUT_SAYING, facts.CLOSED_ANOTHER}),
    ),
)}
"""The verdict lines, in the order they are searched and reported."""

MACHINE_RULES = frozenset({
    "publish", "publish_anew", "publish_each", "backlog", "claim", "claim_other_keys", "claim_any", "claim_many", "ack", "nack_now",
    "nack_later", "advance", "advance_to_deadline",
    "claim_at_deadline", "open_second_instance", "reopen", "bad_input", "bad_release", "prefill",
    "release_stale", "step_back", "step_back_to_deadline",
})
"""The lockstep machine's rules (``RULES`` and ``FOCUS_RULES`` of ``_machine``; a test checks
that they agree)."""


def problems(rows: dict[str, Property]) -> list[str]:
    """What is wrong with a property table: a kind of fact that no row or two rows own (whom
    would it count against?), an unknown kind, context, level, search, machine rule or judged
    thing."""
    found = []
    owners: dict[str, str] = {}
    for name, row in rows.items():
        for kind in sorted(row.owns):
            if kind in owners:
                found.append(f"the kind {kind!r} is owned by both {owners[kind]!r} and {name!r}")
            owners[kind] = name
    if unowned := set(KINDS) - FAULTS - set(owners):
        found.append(f"no row owns the kinds {sorted(unowned)}")
    for name, row in rows.items():
        if name != row.name:
            found.append(f"row {name!r} is named {row.name!r}")
        if row.level not in ("contract", "strict"):
            found.append(f"{name!r}: level {row.level!r} is neither 'contract' nor 'strict'")
        if row.search not in ("lockstep", "concurrent"):
            found.append(f"{name!r}: search {row.search!r} is neither 'lockstep' nor 'concurrent'")
        if row.search == "concurrent" and not row.concurrent:
            found.append(f"{name!r}: searched only by the concurrent search, but not marked concurrent")
        if unknown := (row.owns | row.explains) - set(KINDS):
            found.append(f"{name!r}: no kind of fact {sorted(unknown)}")
        if row.owns & row.explains:
            found.append(f"{name!r}: explains kinds it owns {sorted(row.owns & row.explains)}")
        if row.acts_after not in (None, "lease", "park"):
            found.append(f"{name!r}: acts after {row.acts_after!r}, neither 'lease' nor 'park'")
        if unknown := row.blames_after - set(CONTEXTS):
            found.append(f"{name!r}: no context {sorted(unknown)}")
        if unknown := row.rules - MACHINE_RULES:
            found.append(f"{name!r}: no machine rule {sorted(unknown)}")
        if unknown := row.judges - set(JUDGED):
            found.append(f"{name!r}: judges {sorted(unknown)}, not in JUDGED")
        if not row.owns and not row.blames_after:
            found.append(f"{name!r}: no fact can break it (it owns no kind and blames nothing)")
    return found


if _problems := problems(PROPERTIES):
    raise ValueError("the property table is inconsistent: " + "; ".join(_problems))

CONTRACT = frozenset(name for name, row in PROPERTIES.items() if row.level == "contract")
"""The properties of the ``contract`` level (SPEC.md R21)."""

_OWNERS = {kind: name for name, row in PROPERTIES.items() for kind in row.owns}


def owner(kind: str) -> str:
    """The property that owns the kind of fact ``kind``."""
    return _OWNERS[kind]


def owners(kinds: frozenset[str]) -> set[str]:
    """The properties that own some of ``kinds`` (faults, which nobody owns, left out)."""
    return {_OWNERS[kind] for kind in kinds if kind in _OWNERS}


DRAIN_CHECKED = frozenset().union(*(row.explains for row in PROPERTIES.values() if row.drain_shows)) \
    & (_CLAIM_ANSWERS | {facts.UNKNOWN_MESSAGE}) - {facts.SEQ_CHANGED, facts.SEQ_ORDER}
"""The wrong answers of a claim that the lockstep machine checks by a drain right after (SPEC.md
C12): those a bug in which messages the queue holds can show as (``drain_shows``).  A message
acked and left in the queue comes back as one the queue does not hold, or ahead of the head
the model expects.  (Not a seq's kinds: that claim took the message the model expects.)"""


def can_explain(prop: str, fact: Fact) -> bool:
    """Whether ``prop``'s bug can show as ``fact``, of a kind another row owns: its row
    ``explains`` the kind, unless the example shows that bug had not acted (SPEC.md C12): a bug
    in which messages the queue holds, where a drain right after the fact found the queue
    holding the very messages the model holds; a bug of leases or parks (``acts_after``),
    where the example had taken no lease, or asked for no park, before the fact."""
    row = PROPERTIES[prop]
    if fact.kind not in row.explains:
        return False
    if row.drain_shows:
        return not fact.queue_as_modelled
    before = {"lease": fact.claimed_before, "park": fact.parked_before}.get(row.acts_after or "")
    return before is not False


def explained(kinds: frozenset[str], search: str) -> frozenset[str]:
    """The kinds of fact that the bugs behind ``kinds`` (what an earlier pass of a focused run
    found) explain in the focused search ``search``: their owners' own kinds and those they
    explain, less the kinds ``search``'s property owns (its own failure is shrunk).  A focused
    search sets aside an example that meets one, and goes on (SPEC.md C5), unless its own
    property can explain that fact (:func:`can_explain`; harel_ref.certify._verdicts.sets_aside):
    a claim of a leased group that no-loss's search meets is its own where a message was lost
    before, single-in-flight's where the queue held what the model holds."""
    roots = owners(kinds) - {search}
    return frozenset().union(*(PROPERTIES[root].owns | PROPERTIES[root].explains for root in roots)) \
        - PROPERTIES[search].owns


def fault_owner(search: str, covers: tuple[str, ...], rule: str | None) -> str:
    """The property a fault (an error the spec never asks for, a panic, a crash, a hang) counts
    against when the search ``search`` met it: a focused search's own property; in the shared
    lockstep search the first property it covers whose own search makes the step that raised
    (``rule``); in the concurrent search and the soak the property of calls made at once."""
    if search in PROPERTIES:
        return search
    if search == SHARED:
        return next((p for p in covers if rule in PROPERTIES[p].rules), covers[0])
    return next(name for name, row in PROPERTIES.items() if row.search == "concurrent")


def running(search: str, kind: str | None = None) -> str:
    """A property to select (``--only``) so that ``search`` runs again, judging what it judged
    when it saw a fact of ``kind``: that fact's owner, if the search judges it (the concurrent
    search judges only errors for ``--only contention``)."""
    if search in PROPERTIES:
        return search
    row = PROPERTIES.get(_OWNERS.get(kind, ""))
    if row is not None and row.concurrent:
        return row.name
    return next(name for name, row in PROPERTIES.items() if row.concurrent)


def evidence(prop: str, caps: Capabilities) -> tuple[str, ...]:
    """The situations whose count ``prop``'s verdict gives for a transport with ``caps``: its
    row's, less those a wall clock cannot reach, long events where it takes none and a group
    made anew through another instance where it opens one only (a
    passed verdict that never reached one of them says so, and a shared search that passed
    without one has the property's own search run, SPEC.md C5: for nothing, where it cannot)."""
    situations = PROPERTIES[prop].evidence
    if caps.clock == "wall":
        situations = tuple(s for s in situations if s not in EXACT_TIME_ONLY)
    if caps.event_bytes and caps.event_bytes < LONG:
        situations = tuple(s for s in situations if s != LONG_EVENT)
    if not caps.shared:  # one instance: nothing to make a group anew through
        situations = tuple(s for s in situations if s not in (ANEW_BY_FLOOR, ANEW_BY_KEY))
    return situations


CONCURRENT_ONLY = frozenset({OVERLAP, UNJUDGED, DRAIN_CUT})
"""Situations only the concurrent search reaches: runs of programs."""


def unreached(prop: str, caps: Capabilities, reached: Mapping[str, int]) -> tuple[str, ...]:
    """The situations of ``prop``'s evidence that a lockstep search which reached ``reached``
    never met, but for those only the concurrent search reaches: after a shared search that
    passed, ``prop``'s own search runs too (SPEC.md C5)."""
    return tuple(s for s in evidence(prop, caps) if s not in CONCURRENT_ONLY and not reached.get(s))


def machine_settings(covered: tuple[str, ...], caps: Capabilities, tick: float) -> dict[str, Any]:
    """What the lockstep machine of a search covering the properties ``covered`` runs and
    judges, for a transport of ``caps``: its rules, and the settings of
    :func:`harel_ref.stateful.make_machine` that relax what none of them judges."""
    rows = [PROPERTIES[p] for p in covered]
    judges = frozenset().union(*(row.judges for row in rows))
    wall = caps.clock == "wall"
    by_seq = caps.acks == "by-seq" and "consequences" in judges
    rules = frozenset().union(*(row.rules for row in rows))
    if by_seq:  # stale acks and nacks by seq, and what they break (R20)
        rules |= {"nack_now", "claim_at_deadline", "release_stale"}
    stale = "stale leases" in judges
    return dict(
        capabilities=_judged_capabilities(caps, judges),
        # The deadline rules need an injectable clock; with a wall clock, time passes by sleeping.
        rules=rules | TIME if wall else rules,
        stale_leases=stale or by_seq,
        # Fencing asks whether stale acks and nacks do nothing: its model is fenced, whatever
        # the transport declares, unless it declares the fence SQS gives (R10a).  When they
        # answer nothing, their effect shows later.
        model_acks="fenced" if stale and caps.acks != "until-reclaimed" else None,
        ties="arrival" if "ties" in judges else "any",
        clock_slack=0.0 if ("exact time" in judges or wall) else tick,
        check_close="close" in judges,  # so a close bug leaves the other verdicts standing
        # what stale acks and nacks by seq break, judged by the search of the property it breaks
        holdings=facts.HOLDINGS & frozenset().union(*(row.owns for row in rows)),
        declared=caps,  # every call after close, with the arguments the transport declares it takes
    )


def _judged_capabilities(caps: Capabilities, judges: frozenset[str]) -> Capabilities:
    """``caps`` with what a search does not judge left out: priorities, routing keys and the
    order of groups are exercised only by the searches that judge them."""
    return dataclasses.replace(
        caps,
        priority=caps.priority and "priority" in judges,
        routing=caps.routing and "routing" in judges,
        fairness=caps.fairness if "fairness" in judges else "unspecified",
    )
