"""Which lockstep machine each search runs: a property's focused machine, or the shared one
(SPEC.md C5), built from the property table's settings (:mod:`harel_ref.stateful._properties`)."""

from __future__ import annotations

from collections.abc import Callable

from harel_ref.stateful import Backend, Capabilities, make_machine
from harel_ref.stateful._machine import TICK
from harel_ref.stateful._properties import PROPERTIES, SHARED, machine_settings

__all__ = ["focus_machine", "shared_properties"]


def shared_properties(caps: Capabilities) -> tuple[str, ...]:
    """The lockstep properties the shared search (SPEC.md C5) covers for a transport of
    ``caps``: every one that applies.  None for a transport that acks by seq: fencing judges
    its stale acks with a fenced model, single-in-flight and no-loss what they break with the
    declared one, and one machine cannot do both."""
    if caps.acks == "by-seq":
        return ()
    return tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep" and row.needs(caps) is None)


def focus_machine(
    factory: Callable,
    property: str,
    capabilities: Capabilities | None = None,
    *,
    is_async: bool = False,
) -> type:
    """The lockstep machine class that the search for ``property`` runs, or the shared search
    (``property`` ``"shared"``: the rules of every property of :func:`shared_properties`,
    judging everything they judge).

    Reports print failing steps against this class, so a reproduction is: build the class
    with the same arguments, then run the printed steps.
    """
    caps = capabilities if capabilities is not None else Capabilities()
    if property == SHARED:
        covered = shared_properties(caps)
        if not covered:
            raise ValueError("a transport that acks by seq has no shared search: its properties are searched one by one")
    elif property not in PROPERTIES:
        raise ValueError(f"unknown property {property!r}; choose from {list(PROPERTIES)} or {SHARED!r}")
    elif PROPERTIES[property].search != "lockstep":
        raise ValueError(f"{property!r} is searched by running programs at once, not by a lockstep machine")
    else:
        covered = (property,)
    settings = machine_settings(covered, caps, TICK)
    name = "".join(word.capitalize() for word in property.split("-")) + "Machine"
    backend = Backend(property, factory, settings.pop("capabilities"), is_async=is_async)
    return make_machine(backend, name=name, **settings)
