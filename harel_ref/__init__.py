"""harel-ref: the executable specification and certification kit for harel's transports.

What a transport author needs is importable from here::

    from harel_ref import Backend, Capabilities, certify, make_machine

- the Protocol and its parts (``Transport``, ``AsyncTransport``, ``Lease``, the errors) and the
  in-memory reference (``InMemoryTransport``); the other references are in
  ``harel_ref.transport``;
- certification: ``certify``, ``Report``, ``Profile``, ``CertificationError``
  (``harel_ref.certify`` has the rest);
- the lockstep machine: ``Backend``, ``Capabilities``, ``make_machine``, ``Divergence``.

``model`` (the specification as a pure-Python model) and ``stateful`` (the checkers) are
importable on their own too.  The certification and checker names load on first use.
"""

from __future__ import annotations

import importlib

from .transport import (
    AsyncTransport,
    ClockError,
    InMemoryTransport,
    Lease,
    OutcomeUnknownError,
    StorageError,
    Transport,
    TransportClosedError,
    TransportError,
)

__all__ = [
    "AsyncTransport",
    "Backend",
    "Capabilities",
    "CertificationError",
    "ClockError",
    "Divergence",
    "InMemoryTransport",
    "Lease",
    "OutcomeUnknownError",
    "Profile",
    "Report",
    "StorageError",
    "Transport",
    "TransportClosedError",
    "TransportError",
    "certify",
    "make_machine",
]
__version__ = "0.1.0"

# name -> the module that defines it, imported on first use (they import hypothesis)
_LAZY = {
    "Backend": "stateful",
    "Capabilities": "stateful",
    "Divergence": "stateful",
    "make_machine": "stateful",
    "CertificationError": "harel_ref.certify",
    "Profile": "harel_ref.certify",
    "Report": "harel_ref.certify",
    "certify": "harel_ref.certify",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
