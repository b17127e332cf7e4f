"""Worker processes for tests/test_kill_faults.py: they work a queue until they are SIGKILLed.

Run as ``python tests/kill_worker.py BACKEND`` this is a *zygote*: it imports the transport, the
history recorder and the driver once, then forks a worker for every ``spawn`` command read
from stdin (one JSON object a line), so that a hundred short-lived workers do not pay a hundred
Python start-ups on a busy machine.  It answers on stdout, one JSON object a line:

- ``{"cmd": "spawn", "config": {...}}`` -> ``{"event": "spawned", "name": ..., "pid": ...}``
- ``{"cmd": "kill", "pid": P}`` -> SIGKILL to ``P`` if it is a child not yet reaped (so a pid
  the system has reused is never hit) -> ``{"event": "kill-sent", "pid": P, "sent": bool}``
- ``{"event": "exit", "pid": P, "signal": S, "code": C}`` when a child ends (sent unasked)
- ``{"cmd": "quit"}`` or end of stdin: SIGKILL the children left, reap them, exit.

A worker (:func:`work`) opens the transport on the shared file, records every call in its own
JSON-lines history (:class:`harel_ref.stateful.history.History`, flushed line by line so it survives the
kill) and loops: publish, or claim then ack / nack(0) / nack(delay) / ack after the lease
lapsed.  It marks where it is in a small memory-mapped *phase file* (``"claim:update-groups"``:
the claim's one statement has changed the rows, but its rows are not read yet, so its
autocommit has not happened; ``claim:invoking`` and
``claim:returned`` while the history lines of the call are written), which the driver reads after the
death to tell where a kill landed.  Given a *plan* ``{"op", "stage", "nth"}`` it kills itself
(``os.kill(os.getpid(), SIGKILL)``) the ``nth`` time ``op`` reaches ``stage``: that is how
kills land inside claim and ack transactions by design, not by luck.

The seam: :class:`PhasedConnection` wraps the DB-API connection that the transport's
``_connect()`` returns (sqlite3 or libsql alike) and reports each statement after it ran.
The transports themselves are used unchanged.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import select
import signal
import sys
import time
import traceback
from typing import Any

from harel_ref.transport import Lease
from harel_ref.transport._base import check_claim_args, new_token
from harel_ref.transport._sql import Plan, Statement, claim_statement, claimed
from harel_ref.stateful.history import History, RecordingTransport

PHASE_BYTES = 96

# --- Where the worker is --------------------------------------------------------------------


def stage_of(sql: str) -> str:
    """A statement's short name: ``begin``, ``select``, ``update-groups``, ``commit``..."""
    words = sql.split()
    verb = words[0].upper()
    if verb in ("INSERT", "UPDATE", "DELETE"):
        table = next((w for w in words[1:] if "harel_transport_" in w), "?")
        return f"{verb.lower()}-{table.rsplit('_', 1)[-1]}"
    return verb.lower()


class Phase:
    """The worker's current ``op:stage``, kept in a memory-mapped file the driver can read
    after the process died; and the worker's own death plan."""

    def __init__(self, path: str, plan: dict[str, Any] | None) -> None:
        with open(path, "wb") as file:
            file.write(b"\0" * PHASE_BYTES)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), PHASE_BYTES)
        self.plan = plan
        self.op = "open"
        self.wrote = False  # the current transaction changed a row
        self._count = 0

    def set(self, text: str) -> None:
        self._map[:] = text.encode()[:PHASE_BYTES].ljust(PHASE_BYTES, b"\0")

    def reached(self, stage: str) -> None:
        """``self.op`` got to ``stage``; die here if that is the plan."""
        if stage == "begin":
            self.wrote = False
        elif stage.split("-")[0] in ("insert", "update", "delete"):
            self.wrote = True
        self.set(f"{self.op}:{stage}")
        plan = self.plan
        if plan is None or plan["op"] != self.op or plan["stage"] != stage:
            return
        if stage == "commit" and not self.wrote:
            return  # an empty transaction (a claim that found nothing): not worth a death
        self._count += 1
        if self._count >= plan["nth"]:
            self.set(f"{self.op}:{stage}:self")
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be caught


class PhasedConnection:
    """A DB-API connection that reports every statement to the :class:`Phase` once it ran."""

    def __init__(self, conn: Any, phase: Phase) -> None:
        self._conn = conn
        self._phase = phase

    def execute(self, sql: str, params: Any = ()) -> Any:
        cursor = self._conn.execute(sql, params)
        self._phase.reached(stage_of(sql))
        return cursor

    def __getattr__(self, name: str) -> Any:  # in_transaction, close, ...
        return getattr(self._conn, name)


class PhasedRecording(RecordingTransport):
    """RecordingTransport that also marks the phase (``claim:call`` ... ``claim:returned``)."""

    def __init__(self, transport: Any, history: History, worker: str, phase: Phase) -> None:
        super().__init__(transport, history, worker)
        self.phase = phase

    def _call(self, op: str, method: Any, **args: Any) -> Any:
        self.phase.op = op
        self.phase.set(f"{op}:invoking")  # the invocation line is being written
        with self.history.record(self.worker, op, **args) as call:
            self.phase.reached("call")
            result = method(**args)
            self.phase.reached("returned")  # answered; the answer is being written
            call.complete(result)
        self.phase.op = "idle"
        self.phase.set("idle:between")
        return result


# --- The transports -------------------------------------------------------------------------


def transport_class(backend: str, variant: str) -> type:
    if backend == "sqlite":
        from harel_ref.transport.sqlite import SqliteTransport as base
    elif backend == "libsql":
        from harel_ref.transport.libsql import LibsqlTransport as base
    else:
        raise ValueError(f"unknown backend {backend!r}")
    if variant == "correct":
        parent = base
    elif variant == "two-step-claim":
        parent = _two_step_claim(base)
    else:
        raise ValueError(f"unknown variant {variant!r}")

    class Phased(parent):
        phase: Phase

        def _connect(self) -> Any:
            return PhasedConnection(super()._connect(), self.phase)

    return Phased


RESERVATION = 3600.0


def _two_step_claim(base: type) -> type:
    """BROKEN ON PURPOSE: a claim that commits in two transactions.  The first leases the head
    for an hour ("reserved"), the second shortens the lease to ``visibility``.  It passes every
    test without crashes; a worker killed between the two leaves its group blocked for an hour,
    and the message and everything behind it are lost to the drain."""

    class TwoStepClaim(base):
        def claim(self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys=None) -> Lease | None:
            worker_id, visibility, min_priority, routing_keys = check_claim_args(
                worker_id, visibility, min_priority, routing_keys
            )
            with self._lock:
                self._check_open()
                token = new_token(worker_id)
                statement = claim_statement(self._tables, token, self._clock(), RESERVATION, min_priority, routing_keys)
                lease = claimed(self._run("claim", _one(statement), transaction=True), token)
                if lease is not None:
                    self.phase.reached("reserved")  # the first transaction committed, not the second
                    until = self._clock() + visibility
                    self._run("claim", _shorten(self._tables.groups, lease, until), transaction=True)
                return lease

    return TwoStepClaim


def _one(statement: Statement) -> Plan[Any]:
    return (yield statement)


def _shorten(groups: str, lease: Lease, until: float) -> Plan[None]:
    yield Statement(f"UPDATE {groups} SET lock_expiry = ?, claimable_at = ? WHERE group_id = ? AND locked_by = ?",
                    (until, until, lease.group_id, lease.token))


# --- One worker -----------------------------------------------------------------------------


def work(config: dict[str, Any]) -> None:
    """Work the queue until killed (the driver kills a worker that outlives its plan)."""
    rng = random.Random(config["seed"])
    name = config["name"]
    phase = Phase(config["phase"], config.get("plan"))
    cls = transport_class(config["backend"], config["variant"])
    cls.phase = phase
    history = History(config["history"])
    queue = PhasedRecording(cls(config["db"], prefix=config["prefix"], busy_timeout=30.0), history, name, phase)
    phase.op = "idle"
    phase.set("idle:between")
    groups = config["groups"]
    published = 0
    while True:
        if rng.random() < config.get("publish_share", 0.45):
            published += 1
            queue.publish(f"g{rng.randrange(groups)}", f"{name}-{published}")
        else:
            visibility = rng.uniform(0.2, 0.5)
            lease = queue.claim(name, visibility)
            if lease is not None:
                phase.op = "idle"
                phase.reached("holding")  # the lease is ours, nothing done with it yet
                fate = rng.random()
                if fate < 0.72:
                    queue.ack(lease)
                elif fate < 0.82:
                    queue.nack(lease)
                elif fate < 0.88:
                    queue.nack(lease, rng.uniform(0.05, 0.3))
                elif fate < 0.94:
                    time.sleep(visibility + 0.02)  # too slow: the lease lapsed, maybe re-claimed
                    queue.ack(lease)
                else:
                    time.sleep(rng.uniform(0, visibility / 2))
                    queue.ack(lease)
        time.sleep(rng.uniform(0, config.get("pause", 0.004)))


# --- The zygote -----------------------------------------------------------------------------


def _say(line: dict[str, Any]) -> None:
    os.write(1, (json.dumps(line) + "\n").encode())


def zygote(backend: str) -> None:
    if backend == "libsql":
        import libsql  # noqa: F401  (imported once, before any fork; connections only after)
    children: set[int] = set()
    buffered = b""
    running = True
    while running or children:
        if running:
            readable, _, _ = select.select([0], [], [], 0.005)
            if readable:
                chunk = os.read(0, 65536)
                if not chunk:
                    running = False
                buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                command = json.loads(line)
                if command["cmd"] == "spawn":
                    pid = _fork(command["config"])
                    children.add(pid)
                    _say({"event": "spawned", "name": command["config"]["name"], "pid": pid})
                elif command["cmd"] == "kill":
                    sent = command["pid"] in children
                    if sent:
                        os.kill(command["pid"], signal.SIGKILL)
                    _say({"event": "kill-sent", "pid": command["pid"], "sent": sent})
                elif command["cmd"] == "quit":
                    running = False
            if not running:
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
        else:
            time.sleep(0.005)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            _say({"event": "exit", "pid": pid,
                  "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                  "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None})


def _fork(config: dict[str, Any]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # stdout is the zygote's answer channel
        work(config)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        code = 1
    os._exit(code)


if __name__ == "__main__":
    zygote(sys.argv[1])
