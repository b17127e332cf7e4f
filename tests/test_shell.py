"""One shell over every backend (harel_ref/transport/_shell.py): the Protocol's five methods are
written once, and a backend is its core (steps, no I/O) and a driver per twin."""

from __future__ import annotations

import pytest

import harel_ref.transport as transports
from harel_ref.transport import Lease
from harel_ref.transport._shell import AsyncShell, Shell
from harel_ref.transport._sql import SqlCore, Statement, Tables

PROTOCOL = ("publish", "claim", "ack", "nack", "close")
CLASSES = sorted(name for name in transports.__all__ if name.endswith("Transport") and name not in
                 ("Transport", "AsyncTransport"))


@pytest.mark.parametrize("name", CLASSES)
def test_every_transport_is_the_shell_and_writes_none_of_the_five_methods(name):
    cls = getattr(transports, name)
    shell = AsyncShell if name.startswith("Async") else Shell
    assert issubclass(cls, shell), f"{name} is not a {shell.__name__}"
    written = [method for method in PROTOCOL for klass in cls.__mro__[:cls.__mro__.index(shell)]
               if method in vars(klass)]
    assert not written, f"{name} writes {written} itself instead of leaving them to the shell"


def test_a_core_is_steps_without_io():
    """SqlCore's claim, driven by hand: it yields its statement, takes the rows it is sent, and
    returns the lease (or, sent no rows, yields the promotion of lapsed groups, then None)."""
    core = SqlCore(Tables.named("t"))
    steps = core.claim("w1:token", 10.0, 2.0, 0, None)
    statement = next(steps)
    assert isinstance(statement, Statement) and statement.fetch and "UPDATE t_harel_transport_messages" in statement.sql
    with pytest.raises(StopIteration) as done:
        steps.send([(7, b"g1", b"event")])
    assert done.value.value == Lease("g1", "event", 7, "w1:token")

    steps = core.claim("w1:token", 10.0, 2.0, 0, None)
    next(steps)
    promotion = steps.send([])
    assert "claimable_at" in promotion.sql and promotion.params == (10.0,)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert done.value.value is None


def test_the_shell_checks_arguments_then_open_then_reads_the_clock_once(tmp_path):
    """The order of the shell's steps, the same for every backend: a bad argument is refused
    even by a closed transport (R13 before R14), a closed one never reads the clock, and an
    open one reads it once per claim, ack and nack."""
    readings = []

    def clock():
        readings.append(None)
        return 100.0

    queue = transports.SqliteTransport(tmp_path / "q.db", clock=clock)
    queue.publish("g1", "e")
    lease = queue.claim("w1", 5.0)
    queue.nack(lease)
    queue.ack(queue.claim("w1", 5.0))
    assert len(readings) == 4  # two claims, a nack and an ack; the publish reads none
    queue.close()
    with pytest.raises(TypeError, match="worker_id"):
        queue.claim(None, 5.0)
    with pytest.raises(transports.TransportClosedError):
        queue.claim("w1", 5.0)
    assert len(readings) == 4
