"""harel-ref: the executable specification and certification kit for harel's transports.

- ``harel_ref.transport``: the Protocol, the Lease and the reference transports.
- ``model``: the specification as a pure-Python model (SPEC.md, rule by rule).
- ``stateful``: the lockstep state machine and the checkers that compare a transport with it.
"""

from .transport import (
    AsyncTransport,
    InMemoryTransport,
    Lease,
    Transport,
    TransportClosedError,
    TransportError,
)

__all__ = [
    "AsyncTransport",
    "InMemoryTransport",
    "Lease",
    "Transport",
    "TransportClosedError",
    "TransportError",
]
__version__ = "0.1.0"
