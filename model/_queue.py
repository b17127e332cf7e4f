"""The queue model: SPEC.md, executed.

Pure: no I/O, no clock, no randomness.  Every operation takes ``now``: an exact time, or a
:class:`When` window when the caller only knows that the operation happened somewhere between
two instants (wall-clock certification, SPEC.md R18).

``claim_outcomes`` does not choose: it returns the *set* of answers the spec allows.  The
checker compares the implementation's answer with that set, then tells the model which answer
was given (``take``), so the model follows the implementation wherever the spec leaves room.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ACKS", "RELAXABLE", "Claimed", "Fairness", "Holding", "QueueModel", "When"]

Fairness = Literal["claim", "ack", "unspecified"]

ACKS = ("fenced", "until-reclaimed", "by-seq")
"""How ack and nack find their message: ``"fenced"`` by the lease's token while it holds the
message (R10); ``"until-reclaimed"`` by the token until the message is claimed again, also
after the lease parked or freed it (R10a: SQS's receipt handles); ``"by-seq"`` by the lease's
seq alone, whoever holds the message (R20, harel's unfenced transports)."""

RELAXABLE = {
    "R2": "a claim may also take the head of a group whose head is leased (not parked)",
    "R10": "ack and nack may also act on the lease's message whoever holds it (by seq, unfenced)",
}
"""The rules a model can be built without (``QueueModel(relax=...)``), and what each allows.

The checkers use them to *name* what a concurrent history breaks: a history that fits the
model only without R2 breaks single in-flight; one that fits only without R10 breaks fencing.
Leaving a rule out only ever widens the allowed answers."""


@dataclass(frozen=True, slots=True)
class When:
    """A moment known to lie in ``[lo, hi]``.  ``When.at(t)`` is an exact moment."""

    lo: float
    hi: float

    @classmethod
    def at(cls, t: float) -> When:
        return cls(t, t)

    @classmethod
    def of(cls, now: float | When) -> When:
        return now if isinstance(now, When) else cls.at(float(now))

    def __add__(self, seconds: float) -> When:
        return When(self.lo + seconds, self.hi + seconds)


NEVER = When.at(0.0)
"""The fairness stamp of a group never claimed (R5)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """An allowed claim answer: the message at the head of ``group_id``."""

    group_id: str
    seq: int
    event: str


@dataclass(frozen=True, slots=True)
class Holding:
    """A lease as the worker that claimed it sees it (R20): it holds ``seq`` of ``group_id``
    under ``token`` until ``until``, unless it acks or nacks it first."""

    token: str
    group_id: str
    seq: int
    until: When


@dataclass(frozen=True, slots=True)
class _Hold:
    """A lease (``token`` set) or a park (``token`` None) on a group's head, until ``until``."""

    token: str | None
    until: When


@dataclass
class _Group:
    group_id: str
    priority: int
    routing_key: str | None
    arrival: int
    stamp: When = NEVER  # last_claimed_at (R5)
    messages: list[tuple[int, str]] = field(default_factory=list)  # (seq, event), FIFO
    hold: _Hold | None = None  # only the head is ever held (R6)
    leased_by: dict[int, frozenset[str]] = field(default_factory=dict)  # seq -> tokens, without R10
    last_lease: str | None = None  # the token of the head's latest claim (R10a)

    def copy(self) -> _Group:
        return _Group(
            self.group_id, self.priority, self.routing_key, self.arrival, self.stamp,
            list(self.messages), self.hold, dict(self.leased_by), self.last_lease,
        )

    def key(self) -> tuple:
        hold = None if self.hold is None else (self.hold.token, self.hold.until.lo, self.hold.until.hi)
        leased = tuple(sorted(self.leased_by.items())) if self.leased_by else ()
        return (self.group_id, self.priority, self.routing_key, self.arrival, self.stamp.lo,
                self.stamp.hi, tuple(self.messages), hold, leased, self.last_lease)


class QueueModel:
    """The state of one queue and the rules that change it.

    ``fairness`` picks the R5 policy: ``"claim"`` stamps ``last_claimed_at`` when a group is
    claimed (SQLite, libSQL, rqlite, in-memory), ``"ack"`` when its message is acknowledged
    (the Postgres/Mongo/Redis family), ``"unspecified"`` allows any claimable group.

    ``relax`` names rules of :data:`RELAXABLE` to leave out (the checkers' diagnosis of a
    concurrent history; see there).

    ``ties="any"`` leaves out R4's tie-break (groups with equal stamps go by arrival): the
    round-robin that harel's contract promises, without the order harel-ref adds (R21).

    ``acks`` (:data:`ACKS`) says how ack and nack find their message: by token (R10) or by seq
    (R20).  Either way the model also keeps each worker's own view of its leases
    (:meth:`holdings`): the checkers compare it with the queue to see what a stale ack or nack
    by seq broke.
    """

    def __init__(
        self, fairness: Fairness = "claim", *, relax: Iterable[str] = (), acks: str = "fenced", ties: str = "arrival"
    ) -> None:
        if fairness not in ("claim", "ack", "unspecified"):
            raise ValueError(f"fairness must be 'claim', 'ack' or 'unspecified', got {fairness!r}")
        relax = frozenset(relax)
        if unknown := relax - set(RELAXABLE):
            raise ValueError(f"relax takes rules from {sorted(RELAXABLE)}, got {sorted(unknown)}")
        if acks not in ACKS:
            raise ValueError(f"acks must be one of {ACKS}, got {acks!r}")
        if ties not in ("arrival", "any"):
            raise ValueError(f"ties must be 'arrival' or 'any', got {ties!r}")
        self.fairness = fairness
        self.ties = ties
        self.relax = relax
        self.acks = acks
        self._groups: dict[str, _Group] = {}
        self._holdings: dict[str, Holding] = {}  # token -> the worker's view of its lease (R20)
        self._last_seq = 0
        self._arrivals = 0
        self._published: set[str] = set()  # every event given to publish (R1), shared by copies

    def copy(self) -> QueueModel:
        """An independent copy (the linearizability checker branches on copies)."""
        twin = QueueModel.__new__(QueueModel)
        twin.fairness, twin.relax, twin.acks, twin.ties = self.fairness, self.relax, self.acks, self.ties
        twin._groups = {group_id: group.copy() for group_id, group in self._groups.items()}
        twin._holdings = dict(self._holdings)
        twin._last_seq, twin._arrivals = self._last_seq, self._arrivals
        twin._published = self._published  # what was given to publish is history, on every branch
        return twin

    def key(self) -> tuple:
        """The whole state as a hashable value: equal keys behave the same from here on.
        (The workers' views of their leases are left out: they change no answer.)"""
        return (self._last_seq, self._arrivals, tuple(g.key() for g in self._groups.values()))

    # --- R1, R11, R12: publish ---------------------------------------------------------------

    def publish(
        self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None
    ) -> None:
        """Append ``event`` to ``group_id``; the creating publish fixes priority and routing
        key (R12), and a group created anew gets a new arrival rank and stamp 0 (R11)."""
        group = self._groups.get(group_id)
        if group is None:
            self._arrivals += 1
            group = self._groups[group_id] = _Group(group_id, priority, routing_key, self._arrivals)
        self._last_seq += 1
        group.messages.append((self._last_seq, event))
        self._published.add(event)

    def was_published(self, event: object) -> bool:
        """R1: whether some publish was given ``event``, as given.  A transport stores events
        unchanged, so a claim answers no other text: not one cut short, re-encoded, stripped of
        its NUL characters or given back as bytes."""
        return isinstance(event, str) and event in self._published

    # --- R2-R6: claim --------------------------------------------------------------------------

    def claim_outcomes(
        self,
        now: float | When,
        min_priority: int = 0,
        routing_keys: Iterable[str] | None = None,
    ) -> frozenset[Claimed | None]:
        """Every answer a claim at ``now`` may give: a :class:`Claimed` head, or None."""
        now = When.of(now)
        keys = None if routing_keys is None else frozenset(routing_keys)
        eligible = [g for g in self._groups.values() if _eligible(g, min_priority, keys)]
        allowed: set[Claimed | None] = {
            _head(group) for group, ahead_until in self._with_groups_ahead(eligible)
            if _may_be_first_free(group, ahead_until, now)
        }
        if _may_all_be_in_flight(eligible, now):
            allowed.add(None)
        if "R2" in self.relax:  # without R2: a leased head may be taken over
            allowed.update(_head(g) for g in eligible if g.hold is not None and g.hold.token is not None)
        return frozenset(allowed)

    def claimable(
        self, group_id: str, now: float | When, min_priority: int = 0, routing_keys: Iterable[str] | None = None
    ) -> bool:
        """Whether the head of ``group_id`` is among :meth:`claim_outcomes` (computed for it
        alone, in one pass over the groups: the checkers ask it of every claim that answered a
        message, and compute every outcome only to report one that is not allowed)."""
        now = When.of(now)
        keys = None if routing_keys is None else frozenset(routing_keys)
        group = self._groups.get(group_id)
        if group is None or not _eligible(group, min_priority, keys):
            return False
        if "R2" in self.relax and group.hold is not None and group.hold.token is not None:
            return True
        ahead_until = math.inf
        if self.fairness != "unspecified":
            # _before(other, group), written out: this loop runs for every claim of a drain
            lo, arrival, by_arrival = group.stamp.lo, group.arrival, self.ties == "arrival"
            for other in self._groups.values():
                hi = other.stamp.hi
                if (hi < lo or (by_arrival and hi == lo and other.arrival < arrival)) and _eligible(
                    other, min_priority, keys
                ):
                    ahead_until = min(ahead_until, _in_flight_until(other))
                    if ahead_until < now.lo:
                        return False  # a group before it is surely free: it is not the first
        return _may_be_first_free(group, ahead_until, now)

    def tied(self, now: float | When, min_priority: int = 0, routing_keys: Iterable[str] | None = None) -> bool:
        """R4: whether the tie-break decides a claim at ``now``: two groups it may take (not held
        at ``now``) have the same fairness stamp.  The checkers count how often they reach it."""
        now = When.of(now)
        keys = None if routing_keys is None else frozenset(routing_keys)
        free = [g for g in self._groups.values()
                if _eligible(g, min_priority, keys) and (g.hold is None or g.hold.until.hi < now.lo)]
        stamps = [(g.stamp.lo, g.stamp.hi) for g in free]
        return len(stamps) != len(set(stamps))

    def may_answer_none(
        self, now: float | When, min_priority: int = 0, routing_keys: Iterable[str] | None = None
    ) -> bool:
        """Whether None is among :meth:`claim_outcomes` (computed alone: the checkers ask it
        of every claim that answered None)."""
        keys = None if routing_keys is None else frozenset(routing_keys)
        eligible = [g for g in self._groups.values() if _eligible(g, min_priority, keys)]
        return _may_all_be_in_flight(eligible, When.of(now))

    def take(self, claimed: Claimed, token: str, now: float | When, visibility: float) -> None:
        """Follow a claim that answered ``claimed``: lease the head under ``token`` (R3) and,
        under the claim policy, stamp the group (R5)."""
        now = When.of(now)
        group = self._groups[claimed.group_id]
        assert _head(group) == claimed, f"{claimed} is not the head of its group"
        group.hold = _Hold(token, now + visibility)
        if self.acks == "until-reclaimed":  # kept only where it decides: equal states stay equal
            group.last_lease = token
        self._holdings = {t: h for t, h in self._holdings.items() if h.until.hi >= now.lo}  # lapsed: gone
        self._holdings[token] = Holding(token, claimed.group_id, claimed.seq, now + visibility)
        if "R10" in self.relax or self.acks == "by-seq":  # remember the message, for acks by seq
            group.leased_by[claimed.seq] = group.leased_by.get(claimed.seq, frozenset()) | {token}
        if self.fairness == "claim":
            group.stamp = now

    def _before(self, a: _Group, b: _Group) -> bool:
        """R4, R5: is group ``a`` surely before ``b`` in claim order?  By ``last_claimed_at``,
        ties by arrival; with uncertain stamps, only when certain."""
        if self.fairness == "unspecified":
            return False
        if a.stamp.hi < b.stamp.lo:
            return True
        return self.ties == "arrival" and a.stamp.hi == b.stamp.lo and a.arrival < b.arrival

    def _with_groups_ahead(self, eligible: list[_Group]) -> Iterator[tuple[_Group, float]]:
        """R4, R5: each of the ``eligible`` groups, with the moment until which the groups
        surely before it in claim order (:meth:`_before`) may all be in flight (inf if none).

        ``a`` is before ``b`` when ``a.stamp.hi < b.stamp.lo``, or (ties by arrival) when
        ``a.stamp.hi == b.stamp.lo`` and ``a`` arrived first.  That is ``(a.stamp.hi,
        a.arrival) < (b.stamp.lo, b.arrival)``: sorted by the left side, the groups before
        ``b`` are a prefix, found by bisection.  So a claim among
        thousands of groups costs n log n, not n squared (SPEC.md C13, scale)."""
        if self.fairness == "unspecified":
            yield from ((group, math.inf) for group in eligible)
            return
        order = sorted(eligible, key=lambda g: (g.stamp.hi, g.arrival))
        positions = [(g.stamp.hi, g.arrival) for g in order]
        until = list(itertools.accumulate(map(_in_flight_until, order), min, initial=math.inf))
        for group in eligible:
            # arrivals start at 1: with ties="any" an equal stamp never puts a group before
            before = (group.stamp.lo, group.arrival if self.ties == "arrival" else 0)
            yield group, until[bisect.bisect_left(positions, before)]

    # --- R7-R10: ack and nack ------------------------------------------------------------------

    def ack(self, token: str, now: float | When, *, by_seq: bool = False) -> bool:
        """R7: remove the message held under ``token``; False if no message is (R10).

        ``by_seq`` (a model without R10 only): act on the message ever leased under
        ``token``, whoever holds it now, as an ack by seq does.  A model with ``acks="by-seq"``
        always does (R20)."""
        self._holdings.pop(token, None)  # the worker is done with its lease, whatever happens
        group = self._released(token, by_seq)
        if group is None:
            return False
        seq, _ = group.messages.pop(0)
        group.hold = None
        group.last_lease = None  # the new head was never claimed
        group.leased_by.pop(seq, None)
        if not group.messages:
            del self._groups[group.group_id]  # R11: a group lives while it has messages
        elif self.fairness == "ack":
            group.stamp = When.of(now)
        return True

    def nack(self, token: str, delay: float, now: float | When, *, by_seq: bool = False) -> bool:
        """R8: ``delay == 0`` frees the message at once (still the head); R9: ``delay > 0``
        parks it, its group blocked until ``now + delay``.  False if not held (R10).
        ``by_seq``: as for :meth:`ack`."""
        self._holdings.pop(token, None)
        group = self._released(token, by_seq)
        if group is None:
            return False
        group.hold = None if delay == 0 else _Hold(None, When.of(now) + delay)
        return True

    def acts(self, token: str) -> bool:
        """Whether an ack or nack under ``token`` would act now (R10, R10a, R20)."""
        return self._released(token, False) is not None

    def _released(self, token: str, by_seq: bool) -> _Group | None:
        """The group an ack or nack under ``token`` acts on, as ``acks`` says; None if none."""
        if by_seq or self.acks == "by-seq":
            return self._leased_under(token)
        if self.acks == "until-reclaimed":
            return self._last_leased_by(token)
        return self._held_by(token)

    def _last_leased_by(self, token: str) -> _Group | None:
        """R10a: the group whose head was last claimed under ``token``, whether that lease is
        live, lapsed, parked or freed since: its handle stays good until the next claim."""
        for group in self._groups.values():
            if group.last_lease == token:
                return group
        return None

    def _held_by(self, token: str) -> _Group | None:
        """R10: the group whose head is held under ``token`` (lapsed or not), if any."""
        for group in self._groups.values():
            if group.hold is not None and group.hold.token == token:
                return group
        return None

    def _leased_under(self, token: str) -> _Group | None:
        """Without R10: the group whose head was ever leased under ``token``, whoever holds
        it now (an ack by seq acts on it)."""
        if "R10" not in self.relax and self.acks != "by-seq":
            raise ValueError("an ack or nack by seq needs acks='by-seq', or a model without R10 (relax=['R10'])")
        for group in self._groups.values():
            if group.messages and token in group.leased_by.get(group.messages[0][0], ()):
                return group
        return None

    # --- what the checkers read ----------------------------------------------------------------

    def contents(self) -> dict[str, list[str]]:
        """Every group's events in FIFO order, groups in arrival order."""
        return {g.group_id: [event for _, event in g.messages] for g in self._groups.values()}

    def deadlines(self) -> list[float]:
        """The earliest end of every lease and park, sorted: the moments worth stepping to."""
        return sorted(g.hold.until.lo for g in self._groups.values() if g.hold is not None)

    def holds(self) -> dict[str, tuple[str | None, When]]:
        """group_id -> (token or None if parked, until) for every held head."""
        return {g.group_id: (g.hold.token, g.hold.until) for g in self._groups.values() if g.hold}

    def holdings(self, group_id: str, now: float | When) -> list[Holding]:
        """R20: the leases on ``group_id`` that their workers surely still hold at ``now``:
        live by the clock and not yet acked or nacked by them.  Under R10 that is at most one,
        the current lease; acks and nacks by seq can free a message under a worker that is
        still processing it, and then a claim can make two."""
        now = When.of(now)
        return [h for h in self._holdings.values() if h.group_id == group_id and now.hi <= h.until.lo]

    def head(self, group_id: str) -> Claimed | None:
        """R6: the head of ``group_id`` (whether or not it is held), or None if there is no
        such group."""
        group = self._groups.get(group_id)
        return None if group is None else _head(group)

    def group_info(self, group_id: str) -> tuple[int, str | None] | None:
        """(priority, routing_key) of an existing group, else None."""
        group = self._groups.get(group_id)
        return None if group is None else (group.priority, group.routing_key)

    def size(self) -> tuple[int, int]:
        """How many groups hold messages, and how many the longest of them holds."""
        return len(self._groups), max((len(g.messages) for g in self._groups.values()), default=0)

    def __len__(self) -> int:
        return sum(len(g.messages) for g in self._groups.values())


# --- the rules as small functions ------------------------------------------------------------


def _eligible(group: _Group, min_priority: int, keys: frozenset[str] | None) -> bool:
    """R4: the priority floor, and the routing filter (a group without a key matches only an
    unfiltered claim)."""
    if group.priority < min_priority:
        return False
    return keys is None or group.routing_key in keys


def _head(group: _Group) -> Claimed:
    """R6: a claim takes the group's head, the lowest seq."""
    seq, event = group.messages[0]
    return Claimed(group.group_id, seq, event)


def _free_after(group: _Group) -> float:
    """R2, R3: the group may be claimable at any t strictly after this (-inf if not held).

    A lease or park ending at ``until`` is live while ``t <= until`` (inclusive)."""
    return -math.inf if group.hold is None else group.hold.until.lo


def _in_flight_until(group: _Group) -> float:
    """R2, R3: the group may be blocked at any t up to this (-inf if not held)."""
    return -math.inf if group.hold is None else group.hold.until.hi


def _may_be_first_free(group: _Group, ahead_until: float, now: When) -> bool:
    """R4: some moment t in ``now`` where ``group`` is free and every group surely ahead of it
    is in flight (as they may all be until ``ahead_until``)."""
    latest = min(now.hi, ahead_until)
    earliest = _free_after(group)
    if earliest >= now.lo:
        return earliest < latest
    return now.lo <= latest


def _may_all_be_in_flight(eligible: list[_Group], now: When) -> bool:
    """R2: the claim may answer None if at some moment in ``now`` every eligible group is in
    flight (trivially so when no group is eligible)."""
    return now.lo <= min([now.hi, *(_in_flight_until(g) for g in eligible)])
