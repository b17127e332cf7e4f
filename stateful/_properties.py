"""The properties a certification gives a verdict on: one table, one row per property.

The checkers report *facts*: the lockstep machine names the check that failed
(:attr:`~harel_ref.stateful.Divergence.check`) and what came before it (a reopen, a refused bad
input, a stale release: ``Divergence.after``); the linearizability checker names the rule whose
removal explains a history (``R2``, ``R10``); the history checker names the kind of breach
(``overlap``, ``lost``, ...).  This table turns those facts into properties, and
:mod:`harel_ref.certify._engine` turns properties into verdicts.  A new property is its rule in
SPEC.md, its model code, and a row here.

Each row says:

- ``what``: the property in one line, and ``spec``: the SPEC.md rules it owns;
- ``level``: ``contract`` (what harel itself promises) or ``strict`` (harel-ref's spec beyond);
- ``needs``: why it does not apply to a transport's capabilities (None: it applies);
- ``search``: ``lockstep`` (a focused search of the machine) or ``concurrent`` (none of its
  own: the shared concurrent search judges it); ``concurrent``: its verdict needs the shared
  concurrent search, which judges histories for the lockstep rows among these and refusals
  for a row that ``judges`` them;
- how its focused search runs: the machine ``rules`` that exercise it, and what it ``judges``
  that other searches relax (the order of groups, the tie-break, priorities, routing keys, the
  exact end of a lease, stale leases);
- which facts count against it: ``checks`` (the machine's check names), ``diagnoses``
  (linearizability), ``breaches`` (history kinds), and ``blames_after``: in its own search, a
  failure of another check after one of these facts is its failure (what a reopen, or a
  refused call, changed shows only at a later step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._backend import Capabilities

__all__ = [
    "CHECKS", "CONTRACT", "DIAGNOSES", "problems", "PROPERTIES", "Property", "SHARED", "attribute", "evidence",
    "owner", "owner_of_breach",
]

CORE = frozenset({"prefill", "publish", "claim_any", "ack"})
TIME = frozenset({"advance"})

AFTER_REOPEN = "a reopen"
AFTER_REFUSED = "bad input was refused"
AFTER_STEP_BACK = "the clock stepped back"
AFTER_STALE = "a stale ack or nack"
"""The facts a machine records before a failing step (``Divergence.after``), as the step's note
says them: ``(after a reopen; the check that failed: fifo)``.  ``AFTER_STALE`` is recorded only
for a transport whose ack and nack answer nothing (harel's Protocol), where what a stale one did
shows only later."""


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
one of them judged at once (SPEC.md C5).  A failure it finds is attributed like a focused
search's (:func:`attribute`)."""


HELD = "a claim while a group's head was leased or parked"
LEASE_END = "a claim at a lease's exact end"
LEASE_LAPSED = "a claim after a lease lapsed, nobody having claimed again"
PARK_ENDED = "a claim after a park ended"
STALE_AFTER_RECLAIM = "an ack or nack of a lease whose message was claimed again"
TIE = "a claim between groups of equal fairness stamps"
REOPEN_HELD = "a reopen with a lease held"
OVERLAP = "a run of a program whose branches overlapped"
"""Situations a search can reach: what a property's rules are about (R2, R3, R9, R10, R4, R15, R19).  The checkers count them
(``TransportMachine.reached``, the parallel search's runs) and each verdict reports, for the
situations of its row's ``evidence``, how often its searches reached them."""
EXACT_TIME_ONLY = frozenset({LEASE_END})
"""The situations only an injectable clock reaches: a wall clock never stops at an instant."""


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
    checks: frozenset[str] = frozenset()
    diagnoses: frozenset[str] = frozenset()
    breaches: frozenset[str] = frozenset()
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
        rules=CORE | {"nack_now", "claim_at_deadline", "open_second_instance"},
        concurrent=True, judges=frozenset({"consequences"}), checks=frozenset({"single-in-flight"}),
        diagnoses=frozenset({"R2"}), breaches=frozenset({"overlap"}),
        evidence=(HELD, OVERLAP),
    ),
    Property(
        "fifo",
        "a group's messages come out in publish order; a nacked message stays the head; seqs are stable and "
        "increase (R1, R6, R8, R16)",
        ("R1", "R6", "R8", "R16"), "contract",
        rules=CORE | {"nack_now", "nack_later", "claim_at_deadline"},
        checks=frozenset({"fifo"}), breaches=frozenset({"fifo"}),
    ),
    Property(
        "lease-expiry",
        "a lease (or park) is live while now <= its end, and claimable one tick after, also when the clock "
        "steps back (R3, R9)",
        ("R3", "R9"), "contract",
        rules=CORE | {"nack_later", "advance_to_deadline", "claim_at_deadline", "step_back"},
        # On a wall clock the boundary rules cannot run: leases lapse by sleeping, and each call
        # is judged at every moment between its invocation and its answer (R18).
        judges=frozenset({"exact time"}), checks=frozenset({"lease-expiry"}),
        blames_after=frozenset({AFTER_STEP_BACK}), evidence=(LEASE_END, LEASE_LAPSED),
    ),
    Property(
        "parking",
        "nack(lease, delay > 0) blocks the group until now + delay, then the head returns (R9)",
        ("R9",), "contract",
        rules=CORE | {"nack_later", "claim_at_deadline"},
        needs=_declared("parking", "the transport does not declare parking"), checks=frozenset({"parking"}),
        evidence=(PARK_ENDED,),
    ),
    Property(
        "fencing",
        "ack/nack act only under the lease's token; superseded or used leases get False; tokens are never "
        "reused; also when callers race (R10, R16, R19)",
        ("R10", "R16", "R19"), "strict",
        rules=CORE | {"nack_now", "nack_later", "claim_at_deadline", "open_second_instance", "release_stale"},
        concurrent=True, judges=frozenset({"stale leases"}),
        checks=frozenset({"fencing", "ack", "nack"}), diagnoses=frozenset({"R10"}),
        blames_after=frozenset({AFTER_STALE}),
        evidence=(STALE_AFTER_RECLAIM, OVERLAP),
    ),
    Property(
        "fairness",
        "round-robin: the claimable group with the oldest fairness stamp goes first (R4, R5; the order of "
        "equal stamps is tie-break's)",
        ("R4", "R5"), "contract",
        rules=CORE | TIME | {"nack_now", "advance_to_deadline"},
        needs=_ordered, judges=frozenset({"fairness"}), checks=frozenset({"fairness"}),
    ),
    Property(
        "tie-break",
        "groups with equal fairness stamps (never claimed, or claimed at one instant) go in arrival order (R4)",
        ("R4",), "strict",
        rules=CORE | TIME | {"nack_now", "advance_to_deadline"},
        # The fairness search's steps, judged with the tie-break: a wrong group is its failure.
        needs=_ordered, judges=frozenset({"fairness", "ties"}), checks=frozenset({"tie-break"}),
        evidence=(TIE,),
    ),
    Property(
        "priority-floor",
        "claim(min_priority=p) only takes groups of priority >= p (R4, R12)",
        ("R4", "R12"), "contract",
        rules=CORE | TIME | {"claim"},
        needs=_declared("priority", "the transport does not declare priorities"),
        judges=frozenset({"priority"}), checks=frozenset({"priority-floor"}),
    ),
    Property(
        "routing",
        "claim(routing_keys=...) only takes groups with one of those keys (R4, R12)",
        ("R4", "R12"), "strict",
        rules=CORE | TIME | {"claim"},
        needs=_declared("routing", "the transport does not declare routing keys"),
        judges=frozenset({"routing"}), checks=frozenset({"routing"}),
    ),
    Property(
        "durability",
        "closing and reopening on the same storage keeps every message, lease and park (R15)",
        ("R15",), "contract",
        rules=CORE | {"nack_now", "nack_later", "claim_at_deadline", "reopen", "open_second_instance"},
        needs=_declared("durable", "the transport does not declare durability"),
        checks=frozenset({"durability"}), blames_after=frozenset({AFTER_REOPEN}),
        evidence=(REOPEN_HELD,),
    ),
    Property(
        "no-loss",
        "draining at the end yields every message published and not acked, exactly once, also after "
        "callers raced (R1, R7, R19)",
        ("R1", "R7", "R19"), "contract",
        rules=CORE | TIME | {"nack_now", "nack_later", "open_second_instance"},
        concurrent=True, judges=frozenset({"consequences"}), checks=frozenset({"no-loss", "publish"}),
        breaches=frozenset({"lost", "duplicate", "unexpected", "redelivered"}),
        evidence=(OVERLAP,),
    ),
    Property(
        "contention",
        "callers that run at once get answers, not errors: no call fails only because others ran at the "
        "same time, such as SQLite's 'database is locked' (R19)",
        ("R19",), "contract",
        search="concurrent", concurrent=True, judges=frozenset({"refusals"}), checks=frozenset({"contention"}),
        evidence=(OVERLAP,),
    ),
    Property(
        "bad-input",
        "bad arguments, forged leases and a clock that answers no time raise ValueError/TypeError and "
        "write nothing (R13)",
        ("R13",), "strict",
        rules=CORE | TIME | {"bad_input", "bad_release"},
        checks=frozenset({"bad-input"}), blames_after=frozenset({AFTER_REFUSED}),
    ),
    Property(
        "close",
        "after close() every call raises; close() twice is harmless (R14)",
        ("R14",), "strict",
        rules=CORE | TIME, judges=frozenset({"close"}), checks=frozenset({"close"}),
    ),
)}
"""The verdict lines, in the order they are searched and reported."""

MACHINE_RULES = frozenset({
    "publish", "claim", "claim_any", "ack", "nack_now", "nack_later", "advance", "advance_to_deadline",
    "claim_at_deadline", "open_second_instance", "reopen", "bad_input", "bad_release", "prefill",
    "release_stale", "step_back",
})
"""The lockstep machine's rules (``RULES`` and ``FOCUS_RULES`` of ``_machine``; a test checks
that they agree)."""


def problems(rows: dict[str, Property]) -> list[str]:
    """What is wrong with a property table: a check, diagnosis or breach that two rows claim
    (whom would it count against?), an unknown level, search, machine rule or judged thing."""
    found = []
    for kind in ("checks", "diagnoses", "breaches"):
        seen: dict[str, str] = {}
        for name, row in rows.items():
            for fact in getattr(row, kind):
                if fact in seen:
                    found.append(f"{kind[:-1]} {fact!r} is claimed by both {seen[fact]!r} and {name!r}")
                seen[fact] = name
    for name, row in rows.items():
        if name != row.name:
            found.append(f"row {name!r} is named {row.name!r}")
        if row.level not in ("contract", "strict"):
            found.append(f"{name!r}: level {row.level!r} is neither 'contract' nor 'strict'")
        if row.search not in ("lockstep", "concurrent"):
            found.append(f"{name!r}: search {row.search!r} is neither 'lockstep' nor 'concurrent'")
        if row.search == "concurrent" and not row.concurrent:
            found.append(f"{name!r}: searched only by the concurrent search, but not marked concurrent")
        if unknown := row.rules - MACHINE_RULES:
            found.append(f"{name!r}: no machine rule {sorted(unknown)}")
        if unknown := row.judges - set(JUDGED):
            found.append(f"{name!r}: judges {sorted(unknown)}, not in JUDGED")
        if name not in row.checks:
            found.append(f"{name!r}: its own name is not among its checks")
    return found


if _problems := problems(PROPERTIES):
    raise ValueError("the property table is inconsistent: " + "; ".join(_problems))

CONTRACT = frozenset(name for name, row in PROPERTIES.items() if row.level == "contract")
"""The properties of the ``contract`` level (SPEC.md R21)."""

DIAGNOSES = tuple((rule, name) for name, row in PROPERTIES.items() for rule in sorted(row.diagnoses))
"""The rules the linearizability checker leaves out, in order, to name what a history breaks."""

_OWNERS = {check: name for name, row in PROPERTIES.items() for check in row.checks}
CHECKS = frozenset(_OWNERS)
"""Every check a checker may name; a failure's check may also be a fault of the transport
(``exception``, ``panicked``, ``crashed``, ``hung``), which counts against the search's own
property."""
_BREACHES = {kind: name for name, row in PROPERTIES.items() for kind in row.breaches}


def evidence(prop: str, caps: Capabilities) -> tuple[str, ...]:
    """The situations whose count ``prop``'s verdict gives for a transport with ``caps``: its
    row's, less those a wall clock cannot reach (a passed verdict that never reached one of
    them says so)."""
    situations = PROPERTIES[prop].evidence
    return tuple(s for s in situations if s not in EXACT_TIME_ONLY) if caps.clock == "wall" else situations


def owner(check: str) -> str:
    """The property a failed check counts against, wherever it was found."""
    return _OWNERS[check]


def owner_of_breach(kind: str) -> str | None:
    """The property a history breach (:class:`harel_ref.stateful.history.Violation` kind) breaks;
    None for ``model`` and ``undecided``, which the linearizability verdict covers."""
    return _BREACHES.get(kind)


def attribute(check: str, after: frozenset[str] | tuple[str, ...], search: str | None) -> tuple[str, str, str]:
    """Whom a failed ``check`` counts against when the lockstep search ``search`` (a
    property's focused search, or :data:`SHARED`) found it after the facts ``after``: the
    property, the check as the report names it, and a note for its step (empty, or
    ``(after a reopen; the check that failed: fifo)``).

    In a search that judges the tie-break, a wrong order of groups is the tie-break's (its
    check too); a failure after one of the facts that a property ``blames_after`` is that
    property's, whatever check tripped, in its own search and in the shared one (the engine
    gives it back to that check when the check's own search failed too, see ``_reblamed``)."""
    prop = owner(check)
    rows = [row for row in PROPERTIES.values() if row.search == "lockstep"] if search == SHARED else (
        [PROPERTIES[search]] if search in PROPERTIES else [])
    for row in rows:
        if prop == "fairness" and "ties" in row.judges:
            return row.name, row.name, ""
    for fact in (AFTER_REOPEN, AFTER_REFUSED, AFTER_STEP_BACK, AFTER_STALE):  # the earliest kind of cause first
        for row in rows:
            if fact in after and fact in row.blames_after and prop != row.name:
                return row.name, check, f"  (after {fact}; the check that failed: {prop})"
    return prop, check, ""
