"""What the checkers need to know about a transport: how to open it and what it can do.

A *factory* is ``factory(clock, namespace) -> transport``.  The checkers call it with a fresh
``namespace`` for every example and expect a fresh, empty, isolated queue.  Called again with
the *same* namespace it must open the *same* storage: that is how the machine checks durability
(close, then reopen) and two instances sharing one queue.  For an async transport the factory is
a coroutine function (or returns an awaitable) giving an :class:`~harel_ref.AsyncTransport`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Backend", "Capabilities", "Factory"]

Factory = Callable[[Callable[[], float], str], Any]

FAIRNESS_POLICIES = ("claim", "ack", "unspecified")
CLOCK_MODES = ("injectable", "wall")
PROTOCOLS = ("harel-ref", "harel")
ACKS = ("fenced", "by-seq")


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
    - ``acks``: ``"fenced"`` if ack and nack act only under the lease's token (R10), ``"by-seq"``
      if they act on the lease's message whoever holds it (harel's SQL and in-memory
      transports).  The model then follows what a stale ack or nack does, and the checkers
      report what that breaks (R20).
    """

    priority: bool = True
    routing: bool = True
    parking: bool = True
    durable: bool = False
    shared: bool = False
    fairness: Literal["claim", "ack", "unspecified"] = "claim"
    clock: Literal["injectable", "wall"] = "injectable"
    protocol: Literal["harel-ref", "harel"] = "harel-ref"
    acks: Literal["fenced", "by-seq"] = "fenced"

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
        if self.protocol == "harel" and self.routing:
            raise ValueError("harel's Protocol has no routing keys: Capabilities(protocol='harel') needs routing=False")


@dataclass(frozen=True)
class Backend:
    """A transport under test: a name, its factory, its capabilities, sync or async."""

    name: str
    factory: Factory
    capabilities: Capabilities = field(default_factory=Capabilities)
    is_async: bool = False
