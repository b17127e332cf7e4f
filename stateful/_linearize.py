"""Is a concurrent history linearizable against the model?  (SPEC.md R19)

A history is a list of :class:`~harel_ref.stateful.history.Record`: who called what, with which
arguments, when the call was invoked and when its answer came back, and the answer.  It is
*linearizable* if the calls can be put in one order that respects real time (a call that
returned before another was invoked comes first) and in which every answer is one that
:class:`harel_ref.model.QueueModel`, applying the calls one by one, allows.

The search is Wing and Gong's, with Lowe's memoization, as Porcupine and Knossos do it: keep the
calls not yet placed in a list of invoke and return events sorted by time; a call may be placed
next if its invocation comes before every unplaced call's return; try it on a copy of the model;
if its answer fits, place it and start again from the front, else try the next; when a return
event comes up whose call is still unplaced, undo the last placement and try what comes after
it.  A (placed calls, model state) pair once explored is never explored again.

Calls without an answer (SPEC.md R17):

- a call that raised :class:`~harel_ref.transport.StorageError` did nothing and is left out;
- a call that raised anything else, or never returned, *may* have happened: it can be placed
  anywhere after its invocation, with any answer the model allows there, or left out.

**Time.**  A record's ``at`` is the transport's clock when the checker froze it (the parallel
search); without it, the call happened at some moment between ``invoke`` and ``complete``, both
read from the transport's clock (a wall-clock soak, SPEC.md R18).

**Partitioning.**  ``partition=True`` checks each group on its own, which makes long histories
fast.  It is sound only with fairness left out (``"unspecified"``: any claimable group may be
taken, R5), because then a claim that answered a message of group ``g`` depends on ``g`` alone.
A claim that answered None depends on every group: it is checked in the partition of every
group active while it ran (from the group's first invocation to its last answer), and the last
such claim of the history (a final drain) in every partition.  Each partition then finds its own
moment for it, so a None that is wrong only because two groups were free at *different*
moments of one claim is not caught; everything else is exact.

**Diagnosis.**  A history that does not fit is checked again without R2, then without R10
(:data:`harel_ref.model.RELAXABLE`; leaving a rule out only ever allows more).  If it fits without
R2, some claim took a leased head: the fact is ``claimed-leased``.  If it fits without R10, some
ack or nack acted for a lease that was not current: ``stale-acted``.  Otherwise the call at the
deepest point the search reached is explained against the model there, as the lockstep machine
explains a step; a claim that answered None there, beside a claim that took a message past a
head it missed which a later claim handed out, has the history judged again without the
claims that answered None (:func:`_taken_past`).  The answer is a fact
(:mod:`harel_ref.stateful._facts`), never a property.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harel_ref.model import Claimed, QueueModel, When

import harel_ref.stateful._facts as facts
from ._facts import Fact
from ._machine import claim_fact, describe_queue, release_fact, show_outcomes
from ._record import Record

__all__ = ["Linearizability", "check_linearizable"]

DEFAULT_MAX_STEPS = 2_000_000
"""Calls tried before the search gives up and answers "undecided" (never on a correct history
of the sizes the certifier records; the benchmark shows how far a correct history goes)."""

DRAIN_WORKER = "drain"
"""Records of this worker are the final drain: a divergence there means a message was lost or
duplicated (``drain-differs``), whatever the claim's answer looks like, unless the drain handed
out a message its group still holds ahead of the head, and the head came out later
(``not-head``)."""

RELAXES = (("R2", facts.CLAIMED_LEASED), ("R10", facts.STALE_ACTED))
"""The rules a history that does not fit is checked again without, in order, and the fact a
history that fits without one shows (see the module docstring)."""


@dataclass(frozen=True)
class Linearizability:
    """The checker's answer.

    ``ok`` is True (a linearization exists: ``order``), False (none does), or None (the search
    gave up after ``max_steps``).  When False, ``kind`` is the kind of fact the history shows
    (:mod:`harel_ref.stateful._facts`), ``step``, ``expected``, ``answered`` and ``state``
    explain the call that cannot be placed, as the lockstep machine's Divergence does, and
    ``culprits`` are the records to mark on a timeline (that call, and the claim whose lease it
    collides with, if any).
    """

    ok: bool | None
    calls: int
    steps: int
    order: tuple[Record, ...] = ()
    kind: str | None = None
    relaxed: str | None = None  # the rule without which the history fits
    step: str = ""
    expected: str = ""
    answered: str = ""
    state: str = ""
    culprits: tuple[Record, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ok)

    def __str__(self) -> str:
        if self.ok:
            return f"linearizable: {self.calls} calls placed in {self.steps} steps"
        if self.ok is None:
            return f"undecided: the search gave up after {self.steps} steps on {self.calls} calls"
        return (
            f"not linearizable [{self.kind}]: {self.step}\n"
            f"  the model allows:       {self.expected}\n"
            f"  the transport answered: {self.answered}\n"
            f"  queue per the model:\n{self.state}"
        )

    @property
    def fact(self) -> Fact | None:
        """What a history that does not fit shows, as a fact (None if it fits, or undecided)."""
        if self.ok is not False:
            return None
        return Fact(self.kind, self.step, self.expected, self.answered, self.state)


def check_linearizable(
    records: Iterable[Record],
    *,
    fairness: str = "unspecified",
    partition: bool = False,
    relax: Iterable[str] = (),
    acks: str = "fenced",
    acks_answer: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
    uncertain_steps: int | None = None,
) -> Linearizability:
    """Judge ``records`` against :class:`harel_ref.model.QueueModel` (see the module docstring).

    ``relax`` leaves rules of :data:`harel_ref.model.RELAXABLE` out of the model: a fact already
    known (say a claim that took a leased head, R2) then does not hide what else a history shows.
    ``acks`` is the model's (``"fenced"``, or ``"by-seq"`` for a transport that acks by seq);
    ``acks_answer=False`` is for harel's Protocol, whose ack and nack answer None: only what
    they did is judged (R20).  ``uncertain_steps``: the steps a part (a group, with
    ``partition``) holding a call that raised or never returned may take, whose orders multiply
    with every such call (R17); a part it cannot decide in them is left undecided while the
    others are judged, and the answer is undecided only if none of them fails."""
    if partition and fairness != "unspecified":
        raise ValueError("partition=True judges groups apart, which needs fairness='unspecified' (R5)")
    relax = frozenset(relax)
    with _no_cyclic_gc():
        calls = [_Call.of(index, record, acks_answer) for index, record in enumerate(records)]
        calls = [call for call in calls if not call.did_nothing]
        parts = _partitions(calls) if partition else [calls]
        total, undecided = 0, None
        for part in parts:
            uncertain = uncertain_steps is not None and not all(call.known for call in part)
            steps = min(max_steps, uncertain_steps) if uncertain else max_steps
            result = _judge(part, fairness, relax, acks, steps)
            total += result.steps
            if result.ok is None and uncertain:
                undecided = undecided or result
                continue
            if result.ok is False and result.kind == facts.NONE_UNDER_CONTENTION:
                # a claim that passed over a group while another call ran on it: a refusal under
                # contention only if nothing else is wrong without it (nothing lost), else what it was
                rest = [call for call in part if call.record is not result.culprits[0]]
                without = _judge(rest, fairness, relax, acks, steps)
                if without.ok is None and uncertain:  # undecided without it: so is this part
                    undecided = undecided or without
                    continue
                if not without.ok:
                    result = _with(result, kind=facts.MISSED_CLAIMABLE)
            if not result.ok:
                return _with(result, calls=len(calls), steps=total)
        if undecided is not None:
            return _with(undecided, calls=len(calls), steps=total)
        return Linearizability(True, len(calls), total, order=() if partition else result.order)


@contextlib.contextmanager
def _no_cyclic_gc():
    """The search makes millions of small objects and no cycles; Python's cycle collector
    would scan them again and again (a third of the time on 100k calls).  Reference counting
    still frees them; the collector is back on when the check ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _with(result: Linearizability, **changes: Any) -> Linearizability:
    return Linearizability(**{**result.__dict__, **changes})


# --- calls ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    index: int
    record: Record
    op: str
    invoke: float
    complete: float  # math.inf when the answer is not known
    known: bool  # the call completed, with an answer
    at: When
    did_nothing: bool  # StorageError: left out (R17)
    judged: bool  # its answer is judged (not an ack or nack of harel's Protocol answering None)

    @classmethod
    def of(cls, index: int, record: Record, acks_answer: bool = True) -> _Call:
        known = record.ok
        judged = known and (acks_answer or record.op not in ("ack", "nack") or record.result is not None)
        complete = record.complete if known else math.inf
        did_nothing = record.did_nothing
        if record.at is not None:
            at = When.at(float(record.at))
        else:  # a call without an answer may take effect after it gave up (a late request)
            at = When(record.invoke, complete)
        return cls(index, record, record.op, record.invoke, complete, known, at, did_nothing, judged)

    def arg(self, name: str, default: Any = None) -> Any:
        return self.record.args.get(name, default)

    @property
    def group(self) -> str | None:
        """The group the call surely concerns, or None (a claim that got nothing, or whose
        answer is unknown, may concern any group)."""
        if self.op == "publish":
            return self.arg("group_id")
        if self.op in ("ack", "nack"):
            return _field(self.arg("lease"), "group_id")
        answer = self.record.result
        return _field(answer, "group_id") if self.known and answer is not None else None


def _field(lease: Any, name: str) -> Any:
    """A field of a lease, recorded as a Lease or as its JSON dict."""
    return lease.get(name) if isinstance(lease, dict) else getattr(lease, name, None)


def _message(lease: Any) -> tuple[Any, Any]:
    """The message a lease is for: its group and seq."""
    return _field(lease, "group_id"), _field(lease, "seq")


def _successors(model: QueueModel, call: _Call) -> list[tuple[QueueModel, Any]]:
    """The model states after ``call`` that agree with its answer: none if the answer is not
    allowed, one usually, one per allowed message for a claim whose answer is unknown.
    Each comes with what the model made of the call (the Claimed message of a claim).  A call
    that changes nothing gives ``model`` itself back (not a copy): states are never changed
    once made."""
    args, answer, now = call.record.args, call.record.result, call.at
    if call.op == "publish":
        if call.known and answer is not None:
            return []
        after = model.copy()
        after.publish(args["group_id"], args["event"], args.get("priority", 0), args.get("routing_key"))
        return [(after, None)]
    if call.op == "claim":
        if call.known and answer is None:
            allowed_none = model.may_answer_none(now, args.get("min_priority", 0), args.get("routing_keys"))
            return [(model, None)] if allowed_none else []
        allowed = model.claim_outcomes(now, args.get("min_priority", 0), args.get("routing_keys"))
        visibility = float(args["visibility"])
        if not call.known:  # it may have leased any allowed head (None: as if left out)
            states = []
            for claimed in sorted((c for c in allowed if c is not None), key=lambda c: c.seq):
                branch = model.copy()
                branch.take(claimed, f"?{call.index}", now, visibility)
                states.append((branch, claimed))
            return states
        claimed = _match(answer, allowed)
        if claimed is False:
            return []
        if claimed is None:
            return [(model, None)]
        after = model.copy()
        after.take(claimed, _field(answer, "token"), now, visibility)
        return [(after, claimed)]
    token = _field(args["lease"], "token")
    delay = float(args.get("delay", 0))

    def release(by_seq: bool) -> tuple[QueueModel, bool]:
        after = model.copy()
        acted = after.ack(token, now, by_seq=by_seq) if call.op == "ack" else after.nack(token, delay, now, by_seq=by_seq)
        return after, acted

    after, acted = release(by_seq=False)
    if acted:  # the lease is current (or, acking by seq, its message is there): it acts
        return [(after, None)] if not call.judged or answer is True else []
    states = [] if call.judged and answer is not False else [(model, None)]
    if "R10" in model.relax and (not call.judged or answer is True):  # it may also act by seq
        by_seq, acted_by_seq = release(by_seq=True)
        if acted_by_seq:
            states.append((by_seq, None))
    return states


def _match(lease: Any, allowed: frozenset[Claimed | None]) -> Claimed | None | bool:
    """The allowed outcome a claim's answer is, or False if it is none of them."""
    if lease is None:
        return None if None in allowed else False
    for claimed in allowed:
        if claimed is not None and (claimed.group_id, claimed.event) == (_field(lease, "group_id"), _field(lease, "event")):
            return claimed
    return False


# --- partitions -----------------------------------------------------------------------------


def _partitions(calls: list[_Call]) -> list[list[_Call]]:
    """One list of calls per group, plus the claims that may concern it (module docstring)."""
    by_group: dict[str, list[_Call]] = defaultdict(list)
    floating: list[_Call] = []  # claims that answered None, or whose answer is unknown
    for call in calls:
        group = call.group
        if group is None:
            floating.append(call)
        else:
            by_group[group].append(call)
    last_none = max((c for c in floating if c.known), key=lambda c: c.invoke, default=None)
    answered = sorted((c for c in floating if c.known), key=lambda c: c.invoke)
    invokes = [c.invoke for c in answered]
    longest = max((c.complete - c.invoke for c in answered), default=0.0)
    unanswered = [c for c in floating if not c.known]
    parts = []
    for own in by_group.values():
        start = min(c.invoke for c in own)
        end = max(c.complete for c in own)
        blocked = _Blocked(own)
        # The answered ones that overlap [start, end]: invoked after start - longest, by end.
        nearby = answered[bisect.bisect_left(invokes, start - longest):bisect.bisect_right(invokes, end)]
        extra = blocked.not_throughout([c for c in nearby if c.complete >= start])
        extra += [c for c in unanswered if c.complete >= start]
        if last_none is not None and last_none not in extra and last_none.invoke > end:
            extra.append(last_none)
        parts.append(sorted(own + extra, key=lambda c: c.index))
    if not parts and floating:  # claims only, never a publish: each must have answered None
        parts.append(floating)
    return parts


class _Blocked:
    """When a group's head is *surely* held, whatever order the calls are placed in: from a
    claim's answer to the first ack or nack naming its lease, while the lease is live by the
    transport's clock (and the same for a park).  A claim that answered None within such a
    window is right about this group in every order, so the group's partition need not place
    it (the model would always allow it there: the speed of long histories rests on this)."""

    def __init__(self, own: list[_Call]) -> None:
        # A window ends at the first ack or nack of the *message*, not only of the lease: an
        # ack or nack by seq (R20) with an older lease releases it too, and so does one by the
        # lease that parked it (R10a).
        releases: dict[Any, list[_Call]] = defaultdict(list)
        for call in own:
            if call.op in ("ack", "nack"):
                releases[_message(call.arg("lease"))].append(call)
        windows = []
        for call in own:
            if not call.known:
                continue
            if call.op == "claim" and call.record.result is not None:
                released = releases[_message(call.record.result)]
                end = min((r.invoke for r in released), default=math.inf)
                windows.append((call.complete, end, call.at.lo + float(call.arg("visibility"))))
            elif call.op == "nack" and call.record.result is True and float(call.arg("delay", 0)) > 0:
                # any other release that may come after the park ends it
                released = releases[_message(call.arg("lease"))]
                end = min((r.invoke for r in released if r is not call and r.complete >= call.invoke), default=math.inf)
                windows.append((call.complete, end, call.at.lo + float(call.arg("delay"))))
        windows.sort()
        self._windows = windows

    def not_throughout(self, claims: list[_Call]) -> list[_Call]:
        """Those of ``claims`` (sorted by invocation) for which the group is not surely held
        the whole time: one sweep over the claims and the windows together."""
        kept, windows, n, last = [], self._windows, len(self._windows), 0
        for claim in claims:
            while last < n and windows[last][0] < claim.invoke:
                last += 1  # windows[:last] began before the claim did
            if not any(claim.complete < end and claim.at.hi <= until
                       for _, end, until in windows[max(0, last - 2):last]):
                kept.append(claim)
        return kept


# --- the search -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Placed:
    """A call placed in the order being built (a persistent stack: ``below`` is the rest)."""

    call: int  # position in the partition's call list
    choice: int  # which of the call's successor states was taken
    outcome: Any  # what the model made of the call there (the Claimed message of a claim)
    before: QueueModel
    placed_before: tuple  # the set of placed calls before this one (see _placed_sets)
    below: _Placed | None
    depth: int


@dataclass
class _Search:
    ok: bool | None
    steps: int
    top: _Placed | None  # the order found (ok), or the deepest one reached before failing
    stuck: int | None  # the call whose return came up unplaced at the deepest point


def _event_positions(calls: Sequence[_Call]) -> tuple[list[int], list[int], list[int], list[bool]]:
    """The calls' invocations and returns as positions 1..2n, sorted by time (an invocation
    before a return at the same instant, so that calls touching at one instant count as
    overlapping): each call's invocation position and return position, then each position's
    call and whether it is a return (position 0, the head of :func:`_linked_events`, is
    neither)."""
    n = len(calls)
    events = sorted(
        [(c.invoke, 0, i) for i, c in enumerate(calls)] + [(c.complete, 1, i) for i, c in enumerate(calls)]
    )
    invoke_at = [0] * n
    return_at = [0] * n
    call_of = [0] * (2 * n + 1)
    is_return = [False] * (2 * n + 1)
    for position, (_, kind, i) in enumerate(events, start=1):
        call_of[position] = i
        if kind:
            return_at[i], is_return[position] = position, True
        else:
            invoke_at[i] = position
    return invoke_at, return_at, call_of, is_return


def _linked_events(
    invoke_at: list[int], return_at: list[int]
) -> tuple[list[int], Callable[[int], None], Callable[[int], None]]:
    """The events of :func:`_event_positions` as a doubly linked list, all in it at first:
    ``nxt`` (``nxt[p]`` is the event after position ``p``, ``nxt[0]`` the first, ``2n + 1``
    the end); ``lift(i)`` takes call ``i``'s two events out of the list, ``unlift(i)`` puts
    them back (the call lifted last first, as the search undoes its placements)."""
    n = len(invoke_at)
    end = 2 * n + 1
    nxt = list(range(1, 2 * n + 2))
    prv = list(range(-1, 2 * n))

    def lift(i: int) -> None:
        for position in (invoke_at[i], return_at[i]):
            nxt[prv[position]] = nxt[position]
            if nxt[position] != end:
                prv[nxt[position]] = prv[position]

    def unlift(i: int) -> None:
        for position in (return_at[i], invoke_at[i]):
            nxt[prv[position]] = position
            if nxt[position] != end:
                prv[nxt[position]] = position

    return nxt, lift, unlift


def _placed_sets(calls: Sequence[_Call]) -> Callable[[tuple, int], tuple]:
    """``with_call(placed, i)``: the set of placed calls ``placed`` with call ``i`` added.

    The set is Lowe's memo key: (base, beyond, maybe) where every call answered whose rank
    (order of invocation) is below ``base`` is placed, ``beyond`` holds the ranks placed above
    it, and ``maybe`` the calls without answer placed; the empty set is ``(0, frozenset(),
    frozenset())``.  Calls are placed nearly in order, so ``beyond`` stays small: the key is
    cheap to build and hash however long the history (a bitset would cost the history's length
    at every step)."""
    answered = sorted((i for i in range(len(calls)) if calls[i].known), key=lambda i: (calls[i].invoke, i))
    rank = {i: r for r, i in enumerate(answered)}

    def with_call(placed: tuple[int, frozenset[int], frozenset[int]], i: int):
        base, beyond, maybe = placed
        r = rank.get(i)
        if r is None:
            return base, beyond, maybe | {i}
        if r != base:
            return base, beyond | {r}, maybe
        base += 1
        if beyond:
            left = set(beyond)
            while base in left:
                left.remove(base)
                base += 1
            beyond = frozenset(left)
        return base, beyond, maybe

    return with_call


def _state_keys() -> Callable[[QueueModel], tuple]:
    """``key_of(state)``: ``state.key()``, computed once per state (states are never changed
    once made, so the key is kept by the state's identity)."""
    keys: dict[int, tuple] = {}  # id(state) -> (state, state.key())

    def key_of(state: QueueModel) -> tuple:
        found = keys.get(id(state))
        if found is None or found[0] is not state:
            found = keys[id(state)] = (state, state.key())
        return found[1]

    return key_of


def _search(calls: Sequence[_Call], model: QueueModel, max_steps: int) -> _Search:
    """Wing and Gong's search with Lowe's memo (the module docstring) for an order of ``calls``
    that ``model`` accepts: ok True with that order, False with the deepest point reached, None
    once more than ``max_steps`` calls have been tried.  The loop is the hot path: what it works
    with is built once, before it, by the helpers above."""
    invoke_at, return_at, call_of, is_return = _event_positions(calls)
    end = 2 * len(calls) + 1  # past the last event; position 0 is the head of the list
    nxt, lift, unlift = _linked_events(invoke_at, return_at)
    with_call = _placed_sets(calls)
    key_of = _state_keys()
    seen: set[tuple] = set()
    state, placed, top = model, (0, frozenset(), frozenset()), None
    deepest: tuple[_Placed | None, int | None] = (None, None)
    deepest_depth = -2
    steps = 0

    def place(i: int, first_choice: int) -> bool:
        nonlocal state, placed, top, steps
        steps += 1
        successors = _successors(state, calls[i])
        with_i = with_call(placed, i)
        for choice in range(first_choice, len(successors)):
            after, outcome = successors[choice]
            key = (with_i, key_of(after))
            if key in seen:
                continue
            seen.add(key)
            top = _Placed(i, choice, outcome, state, placed, top, 0 if top is None else top.depth + 1)
            state, placed = after, with_i
            lift(i)
            return True
        return False

    position = nxt[0]
    while nxt[0] != end:
        if steps > max_steps:
            return _Search(None, steps, top, None)
        i = call_of[position]
        if not is_return[position]:
            position = nxt[0] if place(i, 0) else nxt[position]
            continue
        if not calls[i].known:  # only calls that may be left out remain
            break
        depth = -1 if top is None else top.depth
        if depth > deepest_depth:
            deepest, deepest_depth = (top, i), depth
        while True:  # undo the last placement and try what comes after it
            if top is None:
                return _Search(False, steps, *deepest)
            undone, top = top, top.below
            state, placed = undone.before, undone.placed_before
            unlift(undone.call)
            if place(undone.call, undone.choice + 1):
                position = nxt[0]
            else:
                position = nxt[invoke_at[undone.call]]
            break
    return _Search(True, steps, top, None)


def _order(top: _Placed | None) -> list[_Placed]:
    order = []
    while top is not None:
        order.append(top)
        top = top.below
    return order[::-1]


# --- judging and explaining -----------------------------------------------------------------


def _judge(calls: list[_Call], fairness: str, relax: frozenset[str], acks: str, max_steps: int) -> Linearizability:
    def model(rules_left_out: frozenset[str]) -> QueueModel:
        return QueueModel(fairness, relax=rules_left_out, acks=acks)

    found = _search(calls, model(relax), max_steps)
    if found.ok is not False:
        order = tuple(calls[p.call].record for p in _order(found.top)) if found.ok else ()
        return Linearizability(found.ok, len(calls), found.steps, order=order)
    steps = found.steps
    for rule, kind in RELAXES:
        if rule in relax:
            continue
        relaxed = _search(calls, model(relax | {rule}), max_steps)
        steps += relaxed.steps
        if relaxed.ok:
            explained = _first_misfit(calls, _order(relaxed.top), model(relax))
            if explained is not None:
                return _with(explained, kind=kind, relaxed=rule, calls=len(calls), steps=steps)
    explained, at_stuck = _explain_stuck(calls, found, model(relax))
    stuck = calls[found.stuck]
    if explained.kind in (facts.MISSED_CLAIMABLE, facts.NONE_UNDER_CONTENTION) and _taken_past(stuck, calls, at_stuck):
        # the None may be wrong, or only see its group in flight behind a claim out of order:
        # what the history shows without its Nones decides (a None changes nothing, so what
        # the rest breaks, a call that answered broke; one search, where a None at a time
        # would be one per None)
        answered = [call for call in calls if not _found_nothing(call)]
        without = _judge(answered, fairness, relax, acks, max_steps)
        steps += without.steps
        if without.ok is False:
            explained = without
    return _with(explained, calls=len(calls), steps=steps)


def _first_misfit(calls: list[_Call], order: list[_Placed], model: QueueModel) -> Linearizability | None:
    """Replay an order the relaxed model accepts on the stricter ``model``; explain the first
    call it refuses.  A call without a known answer is replayed with the same outcome, or left
    out where that outcome needed the relaxed rule (such a call may not have happened): the
    blame goes to a call whose answer the transport did give."""
    left_out = []
    for placed in order:
        call = calls[placed.call]
        states = _successors(model, call)
        if not call.known:
            same = [state for state, outcome in states if outcome == placed.outcome]
            if same:
                model = same[0]
            else:
                left_out.append((call, model))
            continue
        if not states:
            return _explain(calls, call, model)
        model = states[0][0]  # a call with a known answer has one way to happen
    if left_out:
        return _explain(calls, *left_out[0])
    return None


def _explain_stuck(calls: list[_Call], found: _Search, model: QueueModel) -> tuple[Linearizability, QueueModel]:
    """The deepest point of the search: replay the order that got there and explain the call
    whose answer came back while no order could place it; with the model there."""
    for placed in _order(found.top):
        model = _successors(model, calls[placed.call])[placed.choice][0]
    return _explain(calls, calls[found.stuck], model), model


def _taken_past(stuck: _Call, calls: list[_Call], model: QueueModel) -> bool:
    """Whether a claim took a message past a head the None claim ``stuck`` missed, where
    nothing was lost: every head it missed was handed out afterwards, and another
    claim took a later message of one of their groups (``not-head`` in ``model``, the state at
    the deepest point).  The None may then only have seen its group in flight (a ``nack(0)``
    that sent its message to the back, then a claim of the one behind it), and the history is
    judged again without its claims that answered None (:func:`_judge`): if the rest fits, the
    None is what broke; if not, the rest says what did.  A head never handed out again leaves
    the None a loss as it was."""
    heads = [head for head in _allowed(model, stuck) if head is not None]
    if not heads or not all(_handed_out_after(head, stuck, calls) for head in heads):
        return False
    missed = {(head.group_id, head.event) for head in heads}
    return any(
        call.op == "claim" and call.known and call.record.result is not None and call is not stuck
        and call.record.worker != DRAIN_WORKER and call.group in {group for group, _ in missed}
        and (call.group, _field(call.record.result, "event")) not in missed
        and claim_fact(_allowed(model, call), _as_lease(call.record.result), model, call.at,
                       call.arg("min_priority", 0), call.arg("routing_keys")) == facts.NOT_HEAD
        for call in calls)


def _allowed(model: QueueModel, call: _Call) -> frozenset[Claimed | None]:
    """What ``model`` allows the claim ``call`` to answer, by its arguments."""
    return model.claim_outcomes(call.at, call.arg("min_priority", 0), call.arg("routing_keys"))


def _found_nothing(call: _Call) -> bool:
    """A claim that answered None, the final drain's aside."""
    return call.op == "claim" and call.known and call.record.result is None and call.record.worker != DRAIN_WORKER


def _handed_out_after(head: Claimed, call: _Call, calls: list[_Call]) -> bool:
    """Whether a claim made after ``call`` (a branch's, or the final drain's) handed out
    ``head``'s message: then it was not lost."""
    return any(c.op == "claim" and c.known and c.invoke > call.invoke and c.record.result is not None
               and _field(c.record.result, "group_id") == head.group_id
               and _field(c.record.result, "event") == head.event for c in calls)


def _explain(calls: list[_Call], call: _Call, model: QueueModel) -> Linearizability:
    """Why ``model`` refuses ``call``'s answer, in the lockstep machine's words."""
    args, answer, now = call.record.args, call.record.result, call.at
    clock = f"clock at {now.lo}" if now.lo == now.hi else f"clock in [{now.lo}, {now.hi}]"
    who = f"{call.record.worker}: "
    holder = None
    if call.op == "claim":
        min_priority, keys = args.get("min_priority", 0), args.get("routing_keys")
        allowed = model.claim_outcomes(now, min_priority, keys)
        kind = claim_fact(allowed, _as_lease(answer), model, now, min_priority, keys)
        step = f"{who}claim({args.get('worker_id')!r}, visibility={args.get('visibility')})"
        expected, answered = show_outcomes(allowed), _show_lease(answer)
        group = _field(answer, "group_id")
        if group is not None and group in model.holds():
            holder = model.holds()[group][0]
    elif call.op == "publish":
        kind, expected, answered = facts.PUBLISH_ANSWERED, "None", repr(answer)
        step = f"{who}publish({args.get('group_id')!r}, {args.get('event')!r})"
    else:
        lease = args["lease"]
        delay = float(args.get("delay", 0))
        expected_answer = model.copy().ack(_field(lease, "token"), now) if call.op == "ack" else \
            model.copy().nack(_field(lease, "token"), delay, now)
        kind = release_fact(call.op, expected_answer, delay)
        ref = f"lease of {_field(lease, 'group_id')!r} seq {_field(lease, 'seq')} token {_field(lease, 'token')!r}"
        step = f"{who}{call.op}({ref}" + (f", delay={delay:g})" if call.op == "nack" else ")")
        expected, answered = repr(expected_answer), repr(answer)
        group = _field(lease, "group_id")
        if group in model.holds():
            holder = model.holds()[group][0]
    if call.record.worker == DRAIN_WORKER and kind != facts.EVENT_CHANGED \
            and not (kind == facts.NOT_HEAD and _drained_later(call, calls, allowed)):
        kind = facts.DRAIN_DIFFERS  # the final drain gave something else than what was left (a changed text says so)
    elif call.op == "claim" and answer is None and kind == facts.MISSED_CLAIMABLE and _raced(call, calls, allowed):
        kind = facts.NONE_UNDER_CONTENTION  # if the rest is linearizable without it (check_linearizable)
    culprits = [call.record]
    culprits += [c.record for c in calls if c.op == "claim" and holder is not None and c.known
                 and c.record.result is not None and _field(c.record.result, "token") == holder
                 and c.record is not call.record]
    return Linearizability(
        False, len(calls), 0, kind=kind, step=step, expected=expected, answered=answered,
        state=describe_queue(model, clock), culprits=tuple(culprits),
    )


def _drained_later(call: _Call, calls: list[_Call], allowed: Any) -> bool:
    """Whether the heads the model allowed, of the group the drain's ``call`` took a later
    message of, came out of the drain afterwards: then the order broke, and nothing was lost."""
    group = _field(call.record.result, "group_id")
    heads = [head for head in allowed if head is not None and head.group_id == group]
    return bool(heads) and all(_handed_out_after(head, call, calls) for head in heads)


def _raced(call: _Call, calls: list[_Call], allowed: Any) -> bool:
    """Whether a claim that answered None while ``allowed`` heads were claimable ran at the
    same time as other callers' calls on every one of their groups (SPEC.md R19: Postgres's ``SKIP
    LOCKED`` passes over a group whose row another transaction holds).  The claim then shows
    ``none-under-contention`` if the history is linearizable without it: nothing was lost
    (:func:`check_linearizable`)."""
    touched = {other.group for other in calls
               if other is not call and other.record.worker not in (call.record.worker, DRAIN_WORKER)
               and other.invoke < call.complete and call.invoke < other.complete}
    groups = {head.group_id for head in allowed if head is not None}
    return bool(groups) and groups <= touched


class _LeaseView:
    """A recorded lease (a dict) seen as a Lease, for the machine's claim_fact."""

    def __init__(self, lease: Any) -> None:
        self.group_id, self.event = _field(lease, "group_id"), _field(lease, "event")
        self.seq, self.token = _field(lease, "seq"), _field(lease, "token")


def _as_lease(answer: Any) -> Any:
    return None if answer is None else _LeaseView(answer)


def _show_lease(answer: Any) -> str:
    if answer is None:
        return "None"
    return f"the head of {_field(answer, 'group_id')!r} (event {_field(answer, 'event')!r}, token {_field(answer, 'token')!r})"
