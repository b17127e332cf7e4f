"""harel's own Protocol, spoken natively (SPEC.md R20).

The ``harel`` package ships its own transport Protocol (``harel.engine.transport`` and
``harel.engine.aio_transport``).  It differs from this package's in four ways, and the checkers
bridge each of them here, in one place, so that the machine, the parallel search, the soak and
the certifier see the transport they always see:

- events are ``harel.spec.states.Event`` objects: each event text the checkers generate is sent
  as one Event, built the same way every time from the text (:func:`to_event`), and an Event a
  claim hands back is compared with it by equality (:func:`from_event`);
- a lease is ``harel.engine.transport.Lease(seq, group_id, event, token)``, and the SQL
  backends leave ``token`` empty: the checkers are given a lease of their own whose token is
  unique per claim and carries harel's token, and :func:`to_harel_lease` rebuilds harel's lease
  from it (in any process: nothing is remembered);
- ``ack`` and ``nack`` answer None: the checkers judge what follows, not the answer;
- ``claim`` takes no routing keys (a harel transport is checked with ``routing=False``).

``harel`` itself is imported only when a harel transport is opened (``harel-ref[harel]``).
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import os
from typing import Any

from harel_ref.transport import Lease

__all__ = ["AsyncHarelAdapter", "HarelAdapter", "call_factory", "from_event", "to_event", "to_harel_lease"]

EVENT_KIND = "harel-ref"
"""The ``kind`` of every Event the checkers publish; the event text is in ``data["text"]``."""

_claims = itertools.count()


def _event_class() -> type:
    try:
        from harel.spec.states import Event
    except ImportError as exc:  # pragma: no cover - the extra is installed in the test suite
        raise ImportError("checking a transport of harel's Protocol needs harel: pip install 'harel-ref[harel]'") from exc
    return Event


def to_event(text: Any) -> Any:
    """The harel Event that stands for the event text ``text``: the same Event (equal, with the
    same ``id``) every time.  Anything but a str is passed on as it is (bad input, R13)."""
    if not isinstance(text, str):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return _event_class()(id=f"{EVENT_KIND}-{digest}", kind=EVENT_KIND, data={"text": text})


def from_event(event: Any) -> str:
    """The event text an Event stands for, if it is equal to the Event published for that text;
    otherwise a description that no published text equals (so the model refuses it)."""
    text = getattr(event, "data", {}).get("text") if isinstance(getattr(event, "data", None), dict) else None
    if isinstance(text, str) and event == to_event(text):
        return text
    return f"<not an event harel-ref published: {event!r:.200}>"


def to_lease(harel_lease: Any) -> Lease | None:
    """The checkers' lease for a lease harel handed out: a token unique per claim (in every
    process: the pid is part of it) that ends with harel's own token."""
    if harel_lease is None:
        return None
    unique = f"{os.getpid()}.{next(_claims)}"
    return Lease(
        group_id=harel_lease.group_id,
        event=from_event(harel_lease.event),
        seq=harel_lease.seq,
        token=f"{unique}|{harel_lease.token}",
    )


def to_harel_lease(lease: Any) -> Any:
    """harel's lease for one of the checkers' leases; anything else is passed on as it is."""
    if not isinstance(lease, Lease):
        return lease
    from harel.engine.transport import Lease as HarelLease

    _, _, token = lease.token.partition("|")
    return HarelLease(seq=lease.seq, group_id=lease.group_id, event=to_event(lease.event), token=token)


def _no_routing(routing_key: Any = None, routing_keys: Any = None) -> None:
    if routing_key is not None or routing_keys is not None:
        raise TypeError("harel's Protocol has no routing keys (declare routing=False)")


class HarelAdapter:
    """A transport of harel's (sync) Protocol, seen through this package's Protocol."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def publish(self, group_id, event, priority=0, routing_key=None):
        _no_routing(routing_key=routing_key)
        return self.transport.publish(group_id, to_event(event), priority)

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        _no_routing(routing_keys=routing_keys)
        return to_lease(self.transport.claim(worker_id, visibility, min_priority))

    def ack(self, lease):
        self.transport.ack(to_harel_lease(lease))  # whatever it returns, harel ignores it

    def nack(self, lease, delay=0):
        self.transport.nack(to_harel_lease(lease), delay)

    def close(self):
        return self.transport.close()


class AsyncHarelAdapter:
    """The same for harel's asyncio Protocol (``harel.engine.aio_transport``)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    async def publish(self, group_id, event, priority=0, routing_key=None):
        _no_routing(routing_key=routing_key)
        return await self.transport.publish(group_id, to_event(event), priority)

    async def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        _no_routing(routing_keys=routing_keys)
        return to_lease(await self.transport.claim(worker_id, visibility, min_priority))

    async def ack(self, lease):
        await self.transport.ack(to_harel_lease(lease))  # whatever it returns, harel ignores it

    async def nack(self, lease, delay=0):
        await self.transport.nack(to_harel_lease(lease), delay)

    async def close(self):
        return await self.transport.close()


def takes_namespace(factory: Any) -> bool:
    """Whether ``factory`` takes a namespace (``factory(clock, namespace)``, also as a keyword
    ``namespace=``); else it is harel.testing's ``make(clock)``."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: assume the full form
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)
            or any(p.kind == p.KEYWORD_ONLY and p.name == "namespace" for p in parameters))


def call_factory(factory: Any, clock: Any, namespace: str) -> Any:
    """``factory(clock, namespace)``, or ``factory(clock)`` for a one-argument factory (which
    must give a fresh, empty queue on every call)."""
    if not takes_namespace(factory):
        return factory(clock)
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "namespace" in parameters and parameters["namespace"].kind == inspect.Parameter.KEYWORD_ONLY:
        return factory(clock, namespace=namespace)
    return factory(clock, namespace)
