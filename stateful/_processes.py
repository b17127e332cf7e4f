"""Branches in separate processes, for transports whose storage processes share (SQLite and
libSQL files, servers).

A pool of long-lived worker processes (spawned, so nothing of the parent's threads or
connections is inherited) builds the factory once from a :class:`FactoryRecipe`.  For each run
the parent sends every worker its branch; each opens its own transport on the run's namespace
with a frozen clock, waits at a barrier shared by the workers, runs its calls, closes the
transport and sends back its records.  Invoke and complete times are ``time.perf_counter``,
which is the same system-wide monotonic clock in every process on Linux.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BranchProcesses", "FactoryRecipe"]

TIMEOUT = 120.0
"""Seconds a worker may take over one branch before the run is abandoned as hung."""


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
            from stateful.backends import load

            return load(self.bundled)(self.directory).factory
        if self.path and self.path not in sys.path:
            sys.path.insert(0, self.path)
        module_name, _, attribute = self.spec.partition(":")
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
        return found


class BranchProcesses:
    """``branches`` worker processes; use as a context manager, or call :meth:`close`."""

    def __init__(self, recipe: FactoryRecipe, *, branches: int = 3, is_async: bool = False,
                 protocol: str = "harel-ref") -> None:
        self._is_async = is_async
        self._protocol = protocol
        self._broken: str | None = None  # why the pool cannot run branches any more
        context = multiprocessing.get_context("spawn")
        self._barriers = {parties: context.Barrier(parties) for parties in range(2, branches + 1)}
        self._pipes = []
        self._workers = []
        for number in range(branches):
            mine, theirs = context.Pipe()
            worker = context.Process(
                target=_worker, args=(recipe, number, theirs, self._barriers, is_async, protocol),
                name=f"harel-ref-branch-{number}", daemon=True,
            )
            worker.start()
            theirs.close()
            self._pipes.append(mine)
            self._workers.append(worker)

    def __enter__(self) -> BranchProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, namespace: str, frozen: float | None, program: Any, leases: dict[str, Any],
            visibility: float, delay: float) -> list[Any]:
        """Run ``program``'s branches, one per worker, at once; return their records.
        ``frozen`` is the clock of the branches, or None for the wall clock."""
        if self._broken is not None:
            raise RuntimeError(self._broken)
        parties = len(program.branches)
        if parties > len(self._workers):
            raise ValueError(f"this pool has {len(self._workers)} workers, the program {parties} branches")
        for pipe, ops in zip(self._pipes, program.branches):
            pipe.send(("branch", namespace, frozen, ops, leases, visibility, delay, parties))
        answers = [self._answer(number) for number in range(parties)]
        failed = [detail for kind, detail in answers if kind == "error"]
        if failed:
            self._barriers[parties].reset()
            raise RuntimeError(f"a branch process failed: {failed[0]}")
        return [record for _, records in answers for record in records]

    def probe(self, factory: Callable, open_transport: Callable) -> None:
        """Check that a message one worker publishes is seen by a transport of this process:
        else the storage is not shared across processes and ``--processes`` cannot work."""
        from stateful._machine import FakeClock

        namespace = f"harel_ref_probe_{uuid.uuid4().hex[:8]}"
        self._pipes[0].send(("probe", namespace))
        kind, detail = self._answer(0)
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
                "storage is not shared across processes (an in-memory store?); run without --processes"
            )

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._workers = [], []

    def _answer(self, number: int) -> tuple[str, Any]:
        """Worker ``number``'s answer.  A worker that hangs or dies breaks the pool: every later
        run raises the same error (the pipes may hold answers out of step)."""
        pipe, worker = self._pipes[number], self._workers[number]
        try:
            if pipe.poll(TIMEOUT):
                return pipe.recv()
            self._broken = f"branch process {number} gave no answer within {TIMEOUT:g} s: the transport hangs"
        except (EOFError, OSError):
            worker.join(timeout=5)
            self._broken = (f"branch process {number} died (exit code {worker.exitcode}) while running a "
                            "branch: the transport crashed the process")
        raise RuntimeError(self._broken)


def _worker(recipe: FactoryRecipe, number: int, pipe: Any, barriers: dict, is_async: bool, protocol: str) -> None:
    """A branch process: build the factory, then run the branches it is sent until None."""
    from stateful._async import open_transport
    from stateful._machine import FakeClock
    from stateful.parallel import _Calls, _Recorder

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
                pipe.send(("ok", []))
                continue
            _, namespace, frozen, ops, leases, visibility, delay, parties = job
            wall = frozen is None  # the transport keeps its own time
            clock = time.time if wall else FakeClock(frozen)
            transport = open_transport(factory, clock, namespace, loop, protocol)
            try:
                calls = _Calls(_Recorder(f"b{number}", wall), dict(leases), f"b{number}.", visibility, delay)
                barriers[parties].wait(timeout=TIMEOUT)
                if loop is not None:
                    loop.run_until_complete(calls.run_async(ops, transport.transport, frozen))
                else:
                    calls.run(ops, transport, frozen, errors_raise=False)
            finally:
                transport.close()
            pipe.send(("ok", calls.recorder.records))
        except BaseException as exc:
            if job[0] == "branch":
                barriers[job[-1]].abort()  # the other branches must not wait for this one
            pipe.send(("error", f"{type(exc).__name__}: {exc} (in process {os.getpid()})"))
    if loop is not None:
        loop.close()
