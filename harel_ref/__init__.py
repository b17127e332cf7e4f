"""harel-ref: the executable specification and certification kit for harel's transports.

What a transport author needs is importable from here::

    from harel_ref import Backend, Capabilities, certify, make_machine

- the Protocol and its parts (``Transport``, ``AsyncTransport``, ``Lease``, the errors) and the
  in-memory reference (``InMemoryTransport``); the other references are in
  ``harel_ref.transport``;
- certification: ``certify``, ``Report``, ``Profile``, ``CertificationError``
  (``harel_ref.certify`` has the rest);
- the lockstep machine: ``Backend``, ``Capabilities``, ``make_machine``, ``Divergence``;
- ``check_at_once``: calls made at once, judged by harel-ref's checker (what a race's
  regression test runs).

``harel_ref.model`` (the specification as a pure-Python model) and ``harel_ref.stateful`` (the
checkers) are importable on their own too.  ``harel_ref`` is the only top-level name this
package installs.  The certification and checker names load on first use.
"""

from __future__ import annotations

import importlib
import sys
import types

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
    "check_at_once",
    "make_machine",
]
__version__ = "0.1.0"

# name -> the module that defines it, imported on first use (they import hypothesis)
_LAZY = {
    "Backend": "harel_ref.stateful",
    "Capabilities": "harel_ref.stateful",
    "Divergence": "harel_ref.stateful",
    "make_machine": "harel_ref.stateful",
    "check_at_once": "harel_ref.stateful._at_once",
    "CertificationError": "harel_ref.certify",
    "Profile": "harel_ref.certify",
    "Report": "harel_ref.certify",
    "certify": "harel_ref.certify",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # loaded once; see _Package for why this must come after the import
    return value


class _Package(types.ModuleType):
    """``harel_ref.certify`` names two things: the function (``from harel_ref import certify``)
    and the subpackage (``from harel_ref.certify import Report``, found in ``sys.modules``).

    When a subpackage is first imported, the import system sets it as an attribute of its
    parent, which would make ``from harel_ref import certify`` answer the module whenever the
    subpackage happened to be imported first (the pytest plugin imports it at start-up).  That
    one assignment is declined, so the name means the function whatever came first."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
