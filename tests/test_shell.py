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
    assert isinstance(statement, Statement) and statement.fetch and "UPDATE t_harel_transport_groups" in statement.sql
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


def _sends(path) -> list[int]:
    """The lines of ``path`` that send an answer into steps (``x.send(...)``): a step loop."""
    import ast

    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "send"]


def test_the_step_loop_is_written_once_per_direction_in_the_shell():
    """Every driver carries its steps out through run_steps, run_steps_async or
    run_steps_within (_shell.py), with a perform of its own; no backend writes the loop again."""
    import pathlib

    import harel_ref.transport._shell as shell

    folder = pathlib.Path(shell.__file__).parent
    loops = {path.name: lines for path in sorted(folder.glob("*.py")) if path.name != "_shell.py"
             if (lines := _sends(path))}
    assert not loops, f"step loops written outside _shell.py (file: lines): {loops}"
    assert len(_sends(pathlib.Path(shell.__file__))) == 3  # run_steps, run_steps_async, run_steps_within


def test_the_step_loop_check_finds_a_loop_written_again(tmp_path):
    """The check above fails on a backend that writes its own loop."""
    written = tmp_path / "backend.py"
    written.write_text("def drive(steps):\n    answer = None\n    while True:\n        answer = perform(steps.send(answer))\n")
    assert _sends(written) == [4]


def _opener(cls):
    """What opens an asyncio twin: its classmethod ``create`` or ``from_url``, else the class."""
    return next((getattr(cls, name) for name in ("create", "from_url") if name in vars(cls)), cls)


@pytest.mark.parametrize("name", [n for n in CLASSES if not n.startswith("Async")])
def test_each_asyncio_twin_opens_with_every_argument_of_its_sync_class(name):
    """A pair stays in step: the asyncio twin takes each argument its sync class takes, with the
    same default (or passes them on, as libsql's **options do), and may take more of its own
    (a pool's size, a loop's budget).  A transport with no twin is one only the process uses
    (the in-memory store; harel-ref's checkers call it from a thread)."""
    import inspect

    twin = getattr(transports, "Async" + name, None)
    if twin is None:
        assert name == "InMemoryTransport"
        return
    sync = inspect.signature(getattr(transports, name).__init__).parameters
    opener = inspect.signature(_opener(twin)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in opener.values()):
        return
    missing = [p for p in sync if p != "self" and p not in opener]
    assert not missing, f"Async{name} does not take {missing}"
    differ = [p for p in sync if p != "self" and sync[p].default != opener[p].default]
    assert not differ, f"Async{name} has other defaults for {differ}"


def test_a_stop_iteration_raised_by_perform_is_no_end_of_the_steps():
    """Only the steps' own end ends the loop: a driver whose perform raises StopIteration (a
    client built on next()) raises, instead of answering None for an operation half done."""
    from harel_ref.transport._shell import run_steps

    def steps():
        yield "first"
        yield "second"
        return "done"

    def perform(step):
        if step == "second":
            raise StopIteration
        return step

    with pytest.raises(StopIteration):
        run_steps(steps(), perform)
    assert run_steps(steps(), lambda step: step) == "done"
