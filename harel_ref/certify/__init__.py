"""Certify a transport against the specification, one verdict per property.

From Python::

    from harel_ref.certify import certify
    from harel_ref.stateful import Capabilities

    def factory(clock, namespace):         # a fresh, isolated queue for a new namespace;
        return MyTransport(clock=clock, prefix=namespace)  # the same storage for a known one

    report = certify(factory, Capabilities(durable=True, shared=True), profile="quick")
    for verdict in report.verdicts:
        print(verdict.property, verdict.verdict, verdict.reason)
    report.write("reports")                # report.json and REPORT.md
    raise SystemExit(report.exit_code)

The same engine runs behind ``harel-ref certify module:factory`` and behind
``pytest --harel-transport module:factory``.  Each property in :data:`PROPERTIES` gets its own
seeded Hypothesis search over the lockstep machine, narrowed to what that property needs, so a
transport that breaks fencing still gets a verdict on FIFO.  A failure carries the shrunk steps
as runnable Python (built on :func:`focus_machine`) and the model's expectation beside the
transport's answer.

Whatever the transport does, the certification goes on: a call that panics, crashes or hangs
past ``call_deadline`` is a failure of the property being searched.  A :class:`Progress` passed
as ``progress`` is told the plan (with an estimate of the time), each example as it starts and
each verdict as it is reached.
"""

from harel_ref.stateful._properties import PROPERTIES

from ._certify import certify
from ._focus import focus_machine
from ._profiles import DEFAULT_CALL_DEADLINE, DEFAULT_SHRINK_LIMIT, PROFILES, Profile, default_level
from ._progress import Plan, Progress
from ._memory import DEFAULT_MEMORY_LIMIT, MemoryLimitReached
from ._report import CONTRACT, EXIT_CODES, LEVELS, VERDICTS, Failure, PropertyVerdict, Report
from ._target import CertificationError

__all__ = [
    "CONTRACT",
    "DEFAULT_CALL_DEADLINE",
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_SHRINK_LIMIT",
    "EXIT_CODES",
    "LEVELS",
    "PROFILES",
    "PROPERTIES",
    "VERDICTS",
    "CertificationError",
    "Failure",
    "MemoryLimitReached",
    "Plan",
    "Profile",
    "Progress",
    "PropertyVerdict",
    "Report",
    "certify",
    "default_level",
    "focus_machine",
]
