"""What the checkers need to know about a transport: how to open it and what it can do.

A *factory* is ``factory(clock, namespace) -> transport``.  The checkers call it with a fresh
``namespace`` for every example and expect a fresh, empty, isolated queue.  Called again with
the *same* namespace it must open the *same* storage: that is how the machine checks durability
(close, then reopen) and two instances sharing one queue.  For an async transport the factory is
a coroutine function (or returns an awaitable) giving an :class:`~harel_ref.AsyncTransport`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Backend", "Capabilities", "Factory", "GROUPS", "HAREL_IMPLIES", "STAND_INS", "accepted_groups"]

Factory = Callable[[Callable[[], float], str], Any]

FAIRNESS_POLICIES = ("claim", "ack", "unspecified")
CLOCK_MODES = ("injectable", "wall")
PROTOCOLS = ("harel-ref", "harel")
ACKS = ("fenced", "until-reclaimed", "by-seq")

GROUPS = ("g1", "g2", "g3", "grüppe-✓")
"""The group ids the lockstep machine uses (a transport that accepts any text gets these)."""
STAND_INS = ("g-4.~", "g4", "G4", "4", "1", "2", "3", "a", "b", "c")
"""Group ids used instead of those of ``GROUPS`` that a transport does not accept
(``Capabilities.group_ids``), the first it accepts of them."""


HAREL_IMPLIES = {"routing": False, "acks": "by-seq"}
"""What declaring harel's Protocol implies, unless declared too: its calls take no routing keys,
and harel's own transports ack by seq (R20)."""


@dataclass(frozen=True)
class Capabilities:
    """What a transport declares it supports.  Each field gates rules and properties.

    - ``priority``: groups carry a priority 0-4 and ``claim(min_priority=...)`` honours it.
    - ``routing``: groups carry a routing key and ``claim(routing_keys=...)`` honours it.
    - ``parking``: ``nack(lease, delay > 0)`` parks the message (SPEC.md R9).
    - ``durable``: closing and reopening on the same namespace keeps every message and lease.
    - ``shared``: two transports open on one namespace at once see one queue.
    - ``fairness``: when a group's ``last_claimed_at`` is stamped: ``"claim"`` (the SQL
      backends), ``"ack"`` (the Postgres/Mongo/Redis family) or ``"unspecified"`` (any
      claimable group may be chosen).
    - ``clock``: ``"injectable"`` if the transport reads time from the ``clock`` it is given,
      ``"wall"`` if its server keeps time (the checkers then allow every outcome consistent
      with when each call may have happened).
    - ``protocol``: ``"harel-ref"`` (this package's Protocol) or ``"harel"``: the Protocol the
      ``harel`` package ships (events are ``harel.spec.states.Event`` objects, ``ack`` and
      ``nack`` answer None, no routing keys; SPEC.md R20).  The checkers speak it natively.
    - ``acks``: ``"fenced"`` if ack and nack act only under the lease's token (R10);
      ``"until-reclaimed"`` if they act under it until the message is claimed again, also after
      the lease nacked it (R10a: SQS, whose receipt handle stays good until the message is
      received again); ``"by-seq"`` if they act on the lease's message whoever holds it
      (harel's SQL and in-memory transports).  The model then follows what a stale ack or nack does, and the checkers
      report what that breaks (R20).
    - ``resolution``: the shortest time the transport keeps, in seconds (SQS: 1, whole seconds
      of visibility); every lease and delay the checkers give it is a whole multiple of it, and
      on a wall clock they last that many multiples (float products: round them to the
      nearest multiple, do not truncate).  0 (the default) is any duration.
    - ``group_ids``: a regular expression every group id it accepts matches in full (SQS:
      ``[!-~]{1,128}``, printable ASCII); the checkers then use only such ids.  Empty (the
      default) is any non-empty string of Unicode text.
    - ``event_bytes``: the longest event it takes, in UTF-8 bytes, whatever its characters
      (SQS: a body of 256 KiB holds 43,690 NULs once escaped); the checkers then draw no longer
      ones.  0 (the default) is any length: the checkers draw events of up to 1 MiB.
    """

    priority: bool = True
    routing: bool = True
    parking: bool = True
    durable: bool = False
    shared: bool = False
    fairness: Literal["claim", "ack", "unspecified"] = "claim"
    clock: Literal["injectable", "wall"] = "injectable"
    protocol: Literal["harel-ref", "harel"] = "harel-ref"
    acks: Literal["fenced", "until-reclaimed", "by-seq"] = "fenced"
    resolution: float = 0.0
    group_ids: str = ""
    event_bytes: int = 0

    def accepts_group_id(self, group_id: str) -> bool:
        """Whether ``group_id`` is one the transport declares it accepts (``group_ids``)."""
        return not self.group_ids or re.fullmatch(self.group_ids, group_id) is not None

    @classmethod
    def harel(cls, **fields: object) -> Capabilities:
        """What a transport of harel's Protocol is, unless it says otherwise: acks by seq,
        no routing keys, no durability or sharing claimed (a ``make(clock)`` factory opens a
        fresh queue every time)."""
        return cls(**{"protocol": "harel", "acks": "by-seq", "routing": False, **fields})

    def __post_init__(self) -> None:
        for name in ("priority", "routing", "parking", "durable", "shared"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Capabilities.{name} must be True or False, got {getattr(self, name)!r}")
        if self.fairness not in FAIRNESS_POLICIES:
            raise ValueError(f"Capabilities.fairness must be one of {FAIRNESS_POLICIES}, got {self.fairness!r}")
        if self.clock not in CLOCK_MODES:
            raise ValueError(f"Capabilities.clock must be one of {CLOCK_MODES}, got {self.clock!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"Capabilities.protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.acks not in ACKS:
            raise ValueError(f"Capabilities.acks must be one of {ACKS}, got {self.acks!r}")
        if isinstance(self.resolution, bool) or not isinstance(self.resolution, (int, float)) \
                or not math.isfinite(self.resolution) or self.resolution < 0:
            raise ValueError(f"Capabilities.resolution must be a number of seconds >= 0, got {self.resolution!r}")
        if not isinstance(self.group_ids, str):
            raise TypeError(f"Capabilities.group_ids must be a regular expression (a str), got {self.group_ids!r}")
        try:
            re.compile(self.group_ids)
        except re.error as exc:
            raise ValueError(f"Capabilities.group_ids is not a regular expression: {exc} in {self.group_ids!r}") from None
        if isinstance(self.event_bytes, bool) or not isinstance(self.event_bytes, int) or self.event_bytes < 0:
            raise ValueError(f"Capabilities.event_bytes must be a whole number of bytes >= 0, got {self.event_bytes!r}")
        if self.group_ids:
            accepted_groups(self)  # two at least of the ids the checkers use must match
        if self.protocol == "harel" and self.routing:
            raise ValueError("harel's Protocol has no routing keys: Capabilities(protocol='harel') needs routing=False")


@dataclass(frozen=True)
class Backend:
    """A transport under test: a name, its factory, its capabilities, sync or async, and how
    many examples of a lockstep search the certifier runs at once by default (``lanes``, SPEC.md
    C2a; None: as the clock says, one on an injectable clock)."""

    name: str
    factory: Factory
    capabilities: Capabilities = field(default_factory=Capabilities)
    is_async: bool = False
    lanes: int | None = None


def accepted_groups(caps: Capabilities) -> tuple[str, ...]:
    """``GROUPS``, each one the transport does not accept replaced by a stand-in it does."""
    groups: list[str] = []
    for group in GROUPS:
        if not caps.accepts_group_id(group):
            group = next((s for s in STAND_INS if caps.accepts_group_id(s) and s not in groups), None)
        if group is not None:
            groups.append(group)
    if len(groups) < 2:
        raise ValueError(f"group_ids={caps.group_ids!r} accepts fewer than two of the group ids the "
                         f"checkers use ({', '.join(GROUPS + STAND_INS)}): widen it")
    return tuple(groups)
