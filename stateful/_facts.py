"""What a checker can observe: a closed set of kinds of fact, each with its data.

A checker (the lockstep machine, the linearizability checker, the parallel search, the soak,
the history checker) reports what it saw as a :class:`Fact`: a kind from :data:`KINDS` (a claim
took a group whose head a live lease held; an ack of a lease no longer current took effect; the
drain found other messages than the queue holds), the step, what the model allows beside what
the transport answered, the queue per the model, and what the example did before it
(``after``: a reopen, a refused bad input, a clock that stepped back, a stale ack or nack whose
answer said nothing; see :data:`CONTEXTS`).

A checker never says which property a fact breaks.  The property table
(:mod:`harel_ref.stateful._properties`) maps each kind to the one property that owns it, and
:mod:`harel_ref.certify._verdicts` turns the facts of a certification into verdicts, as
Porcupine's checker answers Ok or Illegal and leaves the domain to the model.

The kinds are plain strings, so that a fact crosses a process boundary and a report unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CONTEXTS", "FAULTS", "HOLDINGS", "KINDS", "Fact", "ShowsAFact", "raised_error"]

# --- claims: what was wrong with a claim's answer, by what the model's state shows ------------

CLAIMED_LEASED = "claimed-leased"
CLAIMED_AT_LEASE_END = "claimed-at-lease-end"
CLAIMED_PARKED = "claimed-parked"
CLAIMED_HELD_BY_WORKER = "claimed-held-by-worker"
MISSED_LAPSED_LEASE = "missed-lapsed-lease"
MISSED_ENDED_PARK = "missed-ended-park"
MISSED_ABOVE_FLOOR = "missed-above-floor"
MISSED_KEYED = "missed-keyed"
MISSED_CLAIMABLE = "missed-claimable"
BELOW_FLOOR = "below-floor"
OUTSIDE_KEYS = "outside-keys"
NOT_HEAD = "not-head"
UNKNOWN_MESSAGE = "unknown-message"
EVENT_CHANGED = "event-changed"
PASSED_OVER = "passed-over"
TIE_ORDER = "tie-order"
TOKEN_REUSED = "token-reused"
SEQ_CHANGED = "seq-changed"
SEQ_ORDER = "seq-order"

# --- acks, nacks and publishes ---------------------------------------------------------------

STALE_ACTED = "stale-acted"
STALE_RAISED = "stale-raised"
CURRENT_REFUSED = "current-refused"
PARK_REFUSED = "park-refused"
ACKED_HELD_MESSAGE = "acked-held-message"
PUBLISH_ANSWERED = "publish-answered"
DRAIN_DIFFERS = "drain-differs"
QUEUE_DIFFERS = "queue-differs"

# --- bad input and close -----------------------------------------------------------------------

BAD_INPUT_ACCEPTED = "bad-input-accepted"
CLOSED_CALL_ANSWERED = "closed-call-answered"
CLOSED_WITHOUT_SAYING = "closed-without-saying"
CLOSED_ANOTHER = "closed-another"

# --- calls made at once ------------------------------------------------------------------------

RAISED_UNDER_CONTENTION = "raised-under-contention"
NONE_UNDER_CONTENTION = "none-under-contention"

# --- what a recorded history shows (the history checker's breaches) --------------------------

OVERLAP = "overlap"
OUT_OF_ORDER = "out-of-order"
LOST = "lost"
DUPLICATED = "duplicated"
UNEXPECTED = "unexpected"
REDELIVERED = "redelivered"

# --- faults: what the transport did instead of answering ----------------------------------------

RAISED = "raised"
PANICKED = "panicked"
CRASHED = "crashed"
HUNG = "hung"

KINDS: dict[str, str] = {
    CLAIMED_LEASED: "a claim took a group whose head a live lease held (R2)",
    CLAIMED_AT_LEASE_END: "a claim took a group at the exact end of its head's lease, still live then (R3)",
    CLAIMED_PARKED: "a claim took a group whose head was parked (R9)",
    CLAIMED_HELD_BY_WORKER: "a claim took a group whose earlier holder still worked on it: its lease live, never "
                            "acked or nacked by it (R20)",
    MISSED_LAPSED_LEASE: "a claim passed over a group whose head's lease had lapsed (R3, R6)",
    MISSED_ENDED_PARK: "a claim passed over a group whose head's park had ended (R9)",
    MISSED_ABOVE_FLOOR: "a claim with a priority floor answered None while a group at or above it was claimable (R4)",
    MISSED_KEYED: "a claim with routing keys answered None while a group with one of them was claimable (R4)",
    MISSED_CLAIMABLE: "a claim answered None while a group was claimable (R4)",
    BELOW_FLOOR: "a claim took a group below its priority floor (R4, R12)",
    OUTSIDE_KEYS: "a claim took a group without one of its routing keys (R4, R12)",
    NOT_HEAD: "a claim took a message of a claimable group that is not its head (R6)",
    UNKNOWN_MESSAGE: "a claim answered a message the queue does not hold: never published, or acked (R1, R7)",
    EVENT_CHANGED: "a claim answered a group's message with an event no publish was given: cut short, re-encoded, "
                   "changed in type (R1)",
    PASSED_OVER: "a claim took a claimable group while one serviced less recently was claimable too (R4, R5)",
    TIE_ORDER: "a claim took one of several claimable groups stamped alike, not the first of them to arrive (R4)",
    TOKEN_REUSED: "a claim handed out a token handed out before (R16)",
    SEQ_CHANGED: "a message's seq changed between two leases of it (R16)",
    SEQ_ORDER: "a message's seq is out of order with another message of its group (R1, R16)",
    STALE_ACTED: "an ack or nack of a lease no longer current took effect (R10)",
    STALE_RAISED: "an ack or nack of a lease no longer current raised, instead of answering that it did nothing (R10)",
    CURRENT_REFUSED: "an ack, or a nack without delay, of a current lease did nothing (R7, R8)",
    PARK_REFUSED: "a nack with a delay of a current lease did nothing (R9)",
    ACKED_HELD_MESSAGE: "an ack deleted a message whose holder still worked on it (R20)",
    PUBLISH_ANSWERED: "publish answered something other than None (R1)",
    DRAIN_DIFFERS: "draining at the end found other messages than the queue holds (R1, R7)",
    QUEUE_DIFFERS: "a claim answered wrong, and a drain right after it found a group holding more messages than "
                   "published and not acked (one acked and left, or stored twice), or, at the drain at the end, "
                   "fewer (R1, R7)",
    BAD_INPUT_ACCEPTED: "a call with a bad argument, or while the clock answered no time, did not raise the error "
                        "R13 asks for",
    CLOSED_CALL_ANSWERED: "a call after close() answered instead of raising (R14)",
    CLOSED_WITHOUT_SAYING: "a call after close() raised an error that does not say the transport is closed (R14)",
    CLOSED_ANOTHER: "a call on an instance still open raised once another instance on its storage was closed (R14)",
    RAISED_UNDER_CONTENTION: "a call raised while other callers ran, and not when the calls ran one after another (R19)",
    NONE_UNDER_CONTENTION: "a claim answered None while a group was claimable and other callers were touching it "
                           "(R19)",
    OVERLAP: "two leases of one group were surely held at once (history)",
    OUT_OF_ORDER: "messages of one group were delivered or acked out of publish order (history)",
    LOST: "a message published was neither acked nor left at the drain (history)",
    DUPLICATED: "a message was acked, or drained, more than once (history)",
    UNEXPECTED: "a message delivered or drained was never published (history)",
    REDELIVERED: "a message was delivered again after an ack of it had answered (history)",
    RAISED: "a call raised an error the spec never asks for",
    PANICKED: "a call panicked (a BaseException out of native code)",
    CRASHED: "a call killed the thread or process it ran in",
    HUNG: "a call did not return within the call deadline",
}
"""Every kind of fact, with what it says (and the rules of SPEC.md it is about)."""

HOLDINGS = frozenset({CLAIMED_HELD_BY_WORKER, ACKED_HELD_MESSAGE})
"""The kinds judged against each worker's own view of its leases (SPEC.md R20): what a stale
ack or nack *by seq* breaks."""

FAULTS = frozenset({RAISED, PANICKED, CRASHED, HUNG})
"""The kinds that are no answer at all: no property owns them; the search that met one says
whose they are (:func:`harel_ref.stateful._properties.fault_owner`)."""

REOPENED = "reopened"
REFUSED = "refused"
STEPPED_BACK = "stepped-back"
RELEASED_STALE = "released-stale"

CONTEXTS: dict[str, str] = {
    REOPENED: "a reopen",
    REFUSED: "bad input was refused",
    STEPPED_BACK: "the clock stepped back",
    RELEASED_STALE: "a stale ack or nack that answered nothing",
}
"""What an example did before a fact, that may be what caused it, as a step's note says it:
``(after a reopen)``.  ``released-stale`` is recorded only for a transport whose ack and nack
answer nothing (harel's Protocol), where what a stale one did shows only later."""


@dataclass(frozen=True)
class Fact:
    """One thing a checker observed: its ``kind`` (:data:`KINDS`), the ``step`` that showed it,
    what the model allows (``expected``) beside what the transport answered (``answered``), the
    queue per the model (``state``), and what came before it (``after``, :data:`CONTEXTS`).
    ``rule``: for a fault, the machine rule during which the transport raised, and ``call``
    the transport's method that raised (``publish``; ``open`` for opening it), where known.
    ``queue_as_modelled``: for a claim's answer that a lost, duplicated or changed message
    could explain, whether a drain right after it found every group holding the very messages
    the model holds (True), more (False: the fact is then ``queue-differs``), or None:
    undecided (a group came out short, a message changed, no drain could be made).
    ``claimed_before``, ``parked_before``: whether a claim of the example had taken a lease, and
    a nack asked for a park, before it (None: not known, as in a history)."""

    kind: str
    step: str
    expected: str = ""
    answered: str = ""
    state: str = ""
    after: tuple[str, ...] = ()
    rule: str | None = None
    call: str = ""
    queue_as_modelled: bool | None = None
    claimed_before: bool | None = None
    parked_before: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind of fact {self.kind!r}; the kinds are {sorted(KINDS)}")
        if unknown := set(self.after) - set(CONTEXTS):
            raise ValueError(f"unknown contexts {sorted(unknown)}; the contexts are {sorted(CONTEXTS)}")
        object.__setattr__(self, "after", tuple(c for c in CONTEXTS if c in self.after))  # in one order

    def note(self) -> str:
        """What came before, as a step's note: ``  (after a reopen)``, or empty."""
        if not self.after:
            return ""
        return f"  (after {'; '.join(CONTEXTS[c] for c in self.after)})"


# a value in an error's message: a quoted text or bytes (a quote inside a word, as in "can't",
# is none), a word with a digit in it (an address, a namespace such as ns_3f9c..., a number)
_VALUES = re.compile(r"""(?<!\w)b?'(?:[^'\\]|\\.)*'|(?<!\w)b?"(?:[^"\\]|\\.)*"|\w*\d\w*""")


def raised_error(fact: Fact) -> str | None:
    """What makes two ``raised`` facts one bug, wherever they were met: the transport's method
    that raised, the error's class and its message with the values in it left out (``publish:
    DataError: PostgreSQL text fields cannot contain NUL (…) bytes``, whatever the group id and
    the step).  None for any other kind: a panic, a crash or a hang is judged where it
    happened (it may have broken what ran the call)."""
    if fact.kind != RAISED:
        return None
    error, _, message = fact.answered.partition(": ")  # the class, as _exception_outcome writes it
    return f"{fact.call}: {error}: {_VALUES.sub('…', message)}"


class ShowsAFact:
    """What carries a :class:`Fact` (a divergence, a report's failure) reads as the fact: its
    kind, the step with what came before it, what the model allows, what the transport
    answered, the queue."""

    fact: Fact

    @property
    def kind(self) -> str:
        return self.fact.kind

    @property
    def step(self) -> str:
        """The call that showed the fact, and what came before it: ``claim(...)  (after a reopen)``."""
        return self.fact.step + self.fact.note()

    @property
    def expected(self) -> str:
        return self.fact.expected

    @property
    def answered(self) -> str:
        return self.fact.answered

    @property
    def state(self) -> str:
        return self.fact.state

    @property
    def after(self) -> tuple[str, ...]:
        return self.fact.after
