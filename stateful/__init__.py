"""Checkers that compare a transport with the specification, :mod:`harel_ref.model`.

The lockstep machine (after zarr's ``zarr.testing.stateful``) is shipped for anyone's
transport.  Describe the transport as a :class:`Backend` (a factory and its
:class:`Capabilities`) and run it::

    from harel_ref.stateful import Backend, Capabilities, make_machine

    def factory(clock, namespace):      # fresh, isolated queue per namespace;
        return MyTransport(clock=clock)  # the same namespace again = the same storage

    TestMyTransport = make_machine(Backend("mine", factory, Capabilities())).TestCase

Hypothesis prints a failing run as runnable steps, and the :class:`Divergence` beneath them
shows what the model allowed beside what the transport answered.

For concurrent callers: :mod:`harel_ref.stateful.parallel` runs programs whose branches run at once,
:mod:`harel_ref.stateful.soak` runs workers against the wall clock, :mod:`harel_ref.stateful.history` records
calls, and :func:`check_linearizable` judges a history against the model (SPEC.md R19).
"""

from ._async import BlockingTransport
from ._backend import Backend, Capabilities, Factory
from ._linearize import Linearizability, check_linearizable
from ._machine import FOCUS_RULES, RULES, Divergence, FakeClock, TransportMachine, make_machine
from .profiles import PROFILES, load_from_env

__all__ = [
    "FOCUS_RULES",
    "PROFILES",
    "RULES",
    "Backend",
    "BlockingTransport",
    "Capabilities",
    "Divergence",
    "Factory",
    "FakeClock",
    "Linearizability",
    "TransportMachine",
    "check_linearizable",
    "load_from_env",
    "make_machine",
]
