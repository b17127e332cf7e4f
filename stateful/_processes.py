"""Branches in separate processes, for transports whose storage processes share (SQLite and
libSQL files, servers).

A pool of long-lived worker processes (started afresh, :mod:`._forking`, so nothing of the
parent's threads or connections is inherited) builds the factory once from a
:class:`FactoryRecipe`.  For each run the parent sends every worker its branch; each opens its own transport on the run's namespace
with a frozen clock, waits at a barrier shared by the workers, runs its calls, closes the
transport and sends back its records.  Invoke and complete times are ``time.perf_counter``,
which is the same system-wide monotonic clock in every process on Linux.

A worker makes its calls under the call deadline it was given (:func:`harel_ref.stateful._async.limit_calls`)
and sends a :class:`~harel_ref.stateful._async.TransportFault` back as one, so the parent raises the same
fault.  A worker that dies (a segfault in a C extension, ``os._exit``) or gives no answer at all
breaks the pool: the run raises :class:`~harel_ref.stateful._async.TransportCrashed` or
:class:`~harel_ref.stateful._async.TransportHung`, declared on the parent's call limits (the search stops
there), and the pool starts fresh workers for its next run.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ._forking import new_worker, worker_context
from ._start import StartLine, wait_until
from ._values import BRANCH_COUNTS
from ._async import TransportCrashed, TransportFault, TransportHung, TransportPanic, current_limits, limit_calls

__all__ = ["BranchProcesses", "FactoryRecipe"]

TIMEOUT = 120.0
"""Seconds a worker may take over one branch before the run is abandoned as hung, when calls
have no deadline (with one, see :func:`branch_timeout`)."""

_FAULTS = {cls.__name__: cls for cls in (TransportPanic, TransportCrashed, TransportHung)}


def branch_timeout(deadline: float | None) -> float:
    """How long the parent waits for a branch: opening, up to four calls and closing, each
    within the call ``deadline``, with room to spare."""
    return TIMEOUT if deadline is None else 6 * deadline + 30.0


@dataclass(frozen=True)
class FactoryRecipe:
    """How another process builds the factory again: import ``spec`` (``module:attribute``,
    with ``path`` put first on ``sys.path``), or open the bundled backend ``bundled`` over
    ``directory``."""

    spec: str | None = None
    path: str | None = None
    bundled: str | None = None
    directory: str | None = None

    def load(self) -> Callable:
        if self.bundled is not None:
            from harel_ref.stateful.backends import load

            return load(self.bundled)(self.directory).factory
        if self.path and self.path not in sys.path:
            sys.path.insert(0, self.path)
        module_name, _, attribute = self.spec.partition(":")
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
        return found

    @classmethod
    def by_name(cls, factory: Callable) -> FactoryRecipe | None:
        """The recipe that imports ``factory`` as ``module:name`` (from the current directory
        too), or None when importing that name would not give back this very factory (a
        closure, a lambda, a method, anything defined in ``__main__``)."""
        module_name = getattr(factory, "__module__", None)
        qualname = getattr(factory, "__qualname__", "")
        if not module_name or "<" in qualname or "." in qualname or module_name == "__main__":
            return None
        module = sys.modules.get(module_name)
        if module is None or getattr(module, qualname, None) is not factory:
            return None
        return cls(spec=f"{module_name}:{qualname}", path=os.getcwd())


class BranchProcesses:
    """``branches`` worker processes (by default as many as a program of the concurrent search
    has at most); use as a context manager, or call :meth:`close`."""

    def __init__(self, recipe: FactoryRecipe, *, branches: int = max(BRANCH_COUNTS), is_async: bool = False,
                 protocol: str = "harel-ref", deadline: float | None = None,
                 start_line: StartLine | None = None) -> None:
        self._recipe = recipe
        self._branches = branches
        self._is_async = is_async
        self._protocol = protocol
        self._deadline = deadline
        self._pipes: list[Any] = []
        self._workers: list[Any] = []
        self._start_line = start_line if start_line is not None else StartLine()
        self._one_run = threading.RLock()  # the workers run one program's branches at a time
        self._closed = False
        self._start()

    def _start(self) -> None:
        """Start the workers (again, after a fault stopped them)."""
        context = worker_context()
        self._barriers = {parties: context.Barrier(parties) for parties in range(2, self._branches + 1)}
        for number in range(self._branches):
            mine, theirs = context.Pipe()
            worker = new_worker(
                context, _worker,
                (self._recipe, number, theirs, self._barriers, self._is_async, self._protocol, self._deadline),
                name=f"harel-ref-branch-{number}",
            )
            worker.start()
            theirs.close()
            self._pipes.append(mine)
            self._workers.append(worker)

    def __enter__(self) -> BranchProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def turn(self) -> threading.RLock:
        """The pool's turn, for ``with``: threads that run programs through it at once take
        turns.  A run holds it from the calls its prefix makes after its last lapse through its
        branches (on a wall clock a wait for the pool between them would let those leases lapse
        first), not while it sleeps for a lapse, nor while it drains (SPEC.md C9a); :meth:`run`
        takes it too."""
        return self._one_run

    def run(self, namespace: str, frozen: float | None, program: Any, leases: dict[str, Any],
            visibility: float, delay: float) -> list[Any]:
        """Run ``program``'s branches, one per worker, at once; return their records.
        ``frozen`` is the clock of the branches, or None for the wall clock."""
        with self._one_run:
            return self._run(namespace, frozen, program, leases, visibility, delay)

    def _run(self, namespace: str, frozen: float | None, program: Any, leases: dict[str, Any],
             visibility: float, delay: float) -> list[Any]:
        """:meth:`run`, the pool's to make alone.

        Each worker opens its transport, waits at a barrier, then waits for the run's start
        line (:class:`StartLine`) before its first call: a process woken by a barrier goes
        a millisecond or more after the others, longer than a call takes, and the branches
        then ran one after another (measured: 0 of 200 runs overlapped)."""
        parties = len(program.branches)
        if parties > self._branches:
            raise ValueError(f"this pool has {self._branches} workers, the program {parties} branches")
        if self._closed:  # a run left to finish by a stop must not start workers nobody ends
            raise RuntimeError("the branch processes were closed")
        if not self._workers:
            self._start()
        start = self._start_line.next(parties)
        for number, (ops, moment) in enumerate(zip(program.branches, start)):
            self._send(number, ("branch", namespace, frozen, ops, leases, visibility, delay, parties, moment))
        answers = [self._answer(number) for number in range(parties)]
        if all(kind == "ok" for kind, _ in answers):
            self._start_line.learn(start, [ready for _, (_, ready) in answers],
                                   [record for _, (records, _) in answers for record in records])
            answers = [(kind, records) for kind, (records, _) in answers]
        faults = [detail for kind, detail in answers if kind == "fault"]
        failed = [detail for kind, detail in answers if kind == "error"]
        if faults or failed:
            self._barriers[parties].reset()
        if faults:
            name, message = faults[0]
            if name == TransportHung.__name__:  # its worker is stuck in the call
                self._stop()
                raise current_limits().declare(TransportHung(message))
            raise _FAULTS[name](message)
        if failed:
            raise RuntimeError(f"a branch process failed: {failed[0]}")
        return [record for _, records in answers for record in records]

    def probe(self, factory: Callable, open_transport: Callable) -> None:
        """Check that a message one worker publishes is seen by a transport of this process:
        else the storage is not shared across processes and ``--processes`` cannot work."""
        from harel_ref.stateful._machine import FakeClock

        namespace = f"harel_ref_probe_{uuid.uuid4().hex[:8]}"
        self._send(0, ("probe", namespace))
        kind, detail = self._answer(0)
        if kind == "fault":
            kind, detail = "error", detail[1]
        if kind == "error":
            raise RuntimeError(f"a worker process could not open and publish: {detail}")
        loop = asyncio.new_event_loop() if self._is_async else None
        try:
            transport = open_transport(factory, FakeClock(), namespace, loop, self._protocol)
            try:
                lease = transport.claim("probe", 60.0)
            finally:
                transport.close()
        finally:
            if loop is not None:
                loop.close()
        if lease is None or getattr(lease, "event", None) != "probe":
            raise RuntimeError(
                "a message published by another process was not seen here: the transport's "
                "storage is not shared across processes (an in-memory store?)"
            )

    def close(self, grace: float = 10.0) -> None:
        """End the workers: each finishes its branch and closes its transport, and those still
        running after ``grace`` seconds in all are killed."""
        self._closed = True
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._stop(grace)

    def kill(self) -> None:
        """End every worker at once, whatever it is doing (a certification that did not stop)."""
        self._closed = True
        self._stop(0.0)

    def _stop(self, grace: float = 0.0) -> None:
        """Stop every worker (killed after ``grace`` seconds in all); the next run starts new ones."""
        deadline = time.monotonic() + grace
        for worker in self._workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._workers = [], []

    def _send(self, number: int, message: tuple) -> None:
        """Send worker ``number`` its next task.  A worker that died since its last answer (its
        pipe is broken) is a crash of the transport, as in :meth:`_answer`."""
        try:
            self._pipes[number].send(message)
        except (BrokenPipeError, OSError):
            self._crashed(number, "before it was sent its task")

    def _answer(self, number: int) -> tuple[str, Any]:
        """Worker ``number``'s answer: ``("ok", (records, the moment it was ready))``, ``("error", text)`` or ``("fault",
        (class name, message))``.  A worker that dies or gives no answer in time is a fault of
        the transport: the workers are stopped (the pipes may hold answers out of step), and
        the fault is declared and raised."""
        pipe, worker = self._pipes[number], self._workers[number]
        timeout = branch_timeout(self._deadline)
        try:
            if pipe.poll(timeout):
                return pipe.recv()
            fault: TransportFault = TransportHung(
                f"hung: branch process {number} gave no answer within {timeout:g} s (in pid {worker.pid})")
        except (EOFError, OSError):
            self._crashed(number, "while running a branch")
        self._stop()
        raise current_limits().declare(fault)

    def _crashed(self, number: int, when: str) -> NoReturn:
        """Worker ``number`` died: stop the pool (the next run starts new workers), then
        declare and raise the crash."""
        worker = self._workers[number]
        worker.join(timeout=5)
        fault = TransportCrashed(
            f"crashed: worker process died with {_exit_cause(worker.exitcode)} (branch process {number} died "
            f"(exit code {worker.exitcode}) {when})")
        self._stop()
        raise current_limits().declare(fault) from None  # the broken pipe or EOF says nothing more


def _exit_cause(exitcode: int | None) -> str:
    """``SIGSEGV`` for a process a signal killed (exit code -11), else ``exit code N``."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _worker(recipe: FactoryRecipe, number: int, pipe: Any, barriers: dict, is_async: bool, protocol: str,
            deadline: float | None = None) -> None:
    """A branch process: build the factory, then run the branches it is sent until None, each
    call within ``deadline`` seconds."""
    with limit_calls(deadline):
        _serve(recipe, number, pipe, barriers, is_async, protocol)


def _serve(recipe: FactoryRecipe, number: int, pipe: Any, barriers: dict, is_async: bool, protocol: str) -> None:
    from harel_ref.stateful._async import open_transport
    from harel_ref.stateful._machine import ClockedTransport, FakeClock, MovingClock
    from harel_ref.stateful.parallel import _Calls, _Recorder, close_all

    try:
        factory = recipe.load()
    except BaseException as exc:  # answer every job with the reason, so the parent says it
        factory_error = f"{type(exc).__name__}: {exc}"
    else:
        factory_error = None
    loop = asyncio.new_event_loop() if is_async else None
    while (job := pipe.recv()) is not None:
        try:
            if factory_error is not None:
                raise RuntimeError(f"the factory could not be loaded in a worker process: {factory_error}")
            if job[0] == "probe":
                transport = open_transport(factory, FakeClock(), job[1], loop, protocol)
                transport.publish("probe", "probe")
                transport.close()
                pipe.send(("ok", ([], 0.0)))
                continue
            _, namespace, frozen, ops, leases, visibility, delay, parties, moment = job
            wall = frozen is None  # the transport keeps its own time
            clock = time.time if wall else MovingClock(frozen)  # frozen at each call's first reading
            transport = open_transport(factory, clock, namespace, loop, protocol)
            if not wall:
                transport = ClockedTransport(transport, clock)
            try:
                calls = _Calls(_Recorder(f"b{number}", wall), dict(leases), f"b{number}.", visibility, delay)
                barriers[parties].wait(timeout=TIMEOUT)
                ready = time.perf_counter()
                wait_until(moment)
                if loop is not None:
                    loop.run_until_complete(calls.run_async(ops, transport.transport, frozen))
                else:
                    calls.run(ops, transport, frozen, errors_raise=False)
            finally:
                close_all([transport], None)  # quietly: what the branch ran into is the error
            pipe.send(("ok", (calls.recorder.records, ready)))
        except BaseException as exc:
            if job[0] == "branch":
                barriers[job[-2]].abort()  # the other branches must not wait for this one (job[-2]: parties)
            where = f"in branch process {number}, pid {os.getpid()}"
            if isinstance(exc, TransportFault):
                pipe.send(("fault", (type(exc).__name__, f"{exc} ({where})")))
            else:
                pipe.send(("error", f"{type(exc).__name__}: {exc} ({where})"))
    if loop is not None:
        loop.close()
