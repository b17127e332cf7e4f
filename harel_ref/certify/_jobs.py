"""Searches in separate processes (``certify(jobs=N)``, ``harel-ref certify --jobs N``).

The searches of a certification are independent: each is seeded, opens its own transports on
namespaces of its own, and reports what it found as data.  :class:`SearchProcesses` runs them
in ``jobs`` worker processes, started afresh (forked from a fork server,
:mod:`harel_ref.stateful._forking`) so that nothing of the parent's threads or connections is
inherited.  Each worker builds the factory again from the target's recipe (the factory must
be importable by name, as for ``--processes``), runs the searches it takes from a shared queue,
and sends back, as plain data, its progress and what each search found.  The engine weighs the
findings in the order a serial run would have made them, so a run with jobs gives the report
a serial run gives (:mod:`harel_ref.certify._engine`).

A worker that dies (a transport that crashes the interpreter) costs the search it was running
an "unknown" verdict, and another worker takes its place.  Closing the pool ends the workers at
once: a stopped certification does not wait for searches nobody will read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from harel_ref.stateful._forking import new_worker, worker_context

from ._signals import raise_if_stopped, signals_deferred, stop_on_signals, stopped_by

__all__ = ["SearchProcesses", "WorkerDied"]

READY_TIMEOUT = 60.0
"""Seconds a new worker may take to import the certifier and build the factory."""

CLOSE_GRACE = 5.0
"""Seconds the workers have in all, at close, to finish cleaning up before they are ended."""


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """A spawned process runs the parent's ``__main__`` again, to find what it defines, unless
    it is hidden while the process starts.  A worker needs nothing from it (it builds the
    factory by its module's name), and a user's script that calls ``certify`` without an
    ``if __name__ == "__main__":`` guard would otherwise run again in every worker."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _join_all(processes: Iterable[Any], grace: float) -> int:
    """Wait for ``processes`` to end, ``grace`` seconds in all; then end those left, SIGTERM
    first and SIGKILL a second later.  Returns how many had to be ended."""
    processes = list(processes)
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    left = [process for process in processes if process.is_alive()]
    for process in left:
        process.terminate()
    for process in processes:
        process.join(timeout=1.0)
        if process.is_alive():
            process.kill()
            process.join()
    return len(left)


class WorkerDied(Exception):
    """The process running a search ended without an answer."""


def _serve(target: Any, run: Callable, clean_up: Callable, tasks, results, started) -> None:
    """A worker: build the factory, then run searches until told to stop (a None task)."""
    with stop_on_signals():  # the parent's SIGTERM at close stops a search even if Python swallows it
        try:
            _serve_tasks(target, run, clean_up, tasks, results, started)
        except KeyboardInterrupt:
            if stopped_by() is None:  # raised by the transport: reported as a failure
                raise
            # a signal (close()'s, or one to the whole group): the parent is stopping, quietly
            _exit_stopped(results)
        if stopped_by() is not None:  # a signal during the clean-up, deferred: as quietly, not
            _exit_stopped(results)  # raised by stop_on_signals as it ends (a traceback)


def _exit_stopped(results) -> NoReturn:
    """End a worker stopped by a signal, without sending what it still has to say.

    As a process ends, multiprocessing waits for each queue's feeder thread to write out what
    was put on the queue.  A stopping parent reads no more, so that wait lasts for ever once
    the pipe is full (a search's progress fills it); and a signal's exception raised while the
    worker was putting can leave the feeder waiting for a wake-up that never comes (seen under
    load: one run in about forty ended by the parent after its grace, with the worker waiting
    in ``Queue._finalize_join``).  Nobody will read what is left, so it is dropped."""
    results.cancel_join_thread()
    sys.exit(128 + stopped_by())


def _serve_tasks(target: Any, run: Callable, clean_up: Callable, tasks, results, started) -> None:
    try:
        target = dataclasses.replace(target, factory=target.recipe.load())
    except BaseException as exc:
        results.put(("broken", None, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", None, None))
    try:
        while (job := tasks.get()) is not None:
            number, task, context = job
            results.put(("started", number, multiprocessing.current_process().pid))
            try:
                found = run(target, context, task, started, lambda *event, n=number: results.put(("event", n, event)))
            except BaseException as exc:  # the certifier failed: the parent stops the run with it
                if stopped_by() is None:  # (a signal stops the parent too: it needs no word)
                    results.put(("failed", number, "".join(traceback.format_exception(exc))))
                raise
            results.put(("done", number, found))
    finally:
        with signals_deferred():
            clean_up(target)


class SearchProcesses:
    """``jobs`` worker processes that run searches of one target.

    ``run(target, context, task, started, event)`` is the function a worker calls for each
    task submitted: ``started`` is a shared counter of the searches begun (for the time budget's shares),
    ``event(*args)`` sends progress home.  ``clean_up(target)`` runs as a worker ends (it drops
    what the worker's transports left on a server).  Both are module-level functions, so that
    they can be sent."""

    def __init__(self, target: Any, jobs: int, run: Callable, clean_up: Callable) -> None:
        if target.recipe is None:
            raise ValueError("searches in other processes need a factory they can import by name")
        self._mp = worker_context()
        self._args = (dataclasses.replace(target, factory=None), run, clean_up)
        self._tasks, self._results = self._mp.Queue(), self._mp.Queue()
        self.started = self._mp.Value("i", 0)
        self._workers: dict[int, Any] = {}  # pid -> process
        self._running: dict[int, int] = {}  # task number -> the pid running it
        self._pending: set[int] = set()
        for _ in range(jobs):
            self._spawn()

    def _spawn(self) -> None:
        process = new_worker(self._mp, _serve, (*self._args, self._tasks, self._results, self.started),
                             name="harel-ref-search")
        with _main_hidden():
            process.start()
        self._workers[process.pid] = process

    def ready(self) -> str | None:
        """Wait until every worker has built the factory; None, or why one could not."""
        waiting = len(self._workers)
        while waiting:
            try:
                kind, _, detail = self._results.get(timeout=READY_TIMEOUT)
            except queue.Empty:
                return f"a search process did not start within {READY_TIMEOUT:g} s"
            if kind == "broken":
                return f"a search process could not build the factory: {detail}"
            waiting -= 1
        return None

    def submit(self, number: int, task: Any, context: dict[str, Any]) -> None:
        """Run ``run(target, context, task, ...)`` in a worker; its outcome comes back numbered."""
        self._pending.add(number)
        self._tasks.put((number, task, context))

    def outcomes(self) -> Iterator[tuple[str, int, Any]]:
        """What the workers say until every task submitted is done: ``("event", number,
        args)``, ``("done", number, found)``, ``("died", number, WorkerDied)``; a search in
        which the certifier itself failed raises RuntimeError."""
        while self._pending:
            raise_if_stopped()  # a signal whose exception Python swallowed (see _signals)
            try:
                kind, number, detail = self._results.get(timeout=1.0)
            except queue.Empty:
                yield from self._deaths()
                continue
            if kind == "started":
                self._running[number] = detail
            elif kind == "event":
                yield kind, number, detail
            elif kind == "done":
                self._pending.discard(number)
                self._running.pop(number, None)
                yield kind, number, detail
            elif kind == "failed":
                raise RuntimeError(f"the certifier failed in a search process:\n{detail}")

    def _deaths(self) -> Iterator[tuple[str, int, Any]]:
        for pid, process in list(self._workers.items()):
            if process.exitcode is None:
                continue
            del self._workers[pid]
            for number in [n for n, runner in self._running.items() if runner == pid]:
                self._pending.discard(number)
                del self._running[number]
                yield "died", number, WorkerDied(f"the search process ended with exit code {process.exitcode}")
            self._spawn()

    def terminate(self) -> None:
        """SIGTERM every worker, without waiting: each removes what its transports made and
        ends on its own (a certification that did not stop, and is about to exit)."""
        for process in self._workers.values():
            if process.is_alive():
                process.terminate()

    def close(self) -> None:
        """End the workers.  Idle ones are told to stop; busy ones (a stopped certification)
        get SIGTERM, which a worker takes as a stop and still cleans up (not SIGINT: a
        certifier started as a background job inherits SIGINT ignored, as its workers do, so
        that the terminal's Ctrl-C passes them by), and are ended if they do not stop within
        a few seconds."""
        for _ in self._workers:
            self._tasks.put(None)
        if self._pending:
            for process in self._workers.values():
                if process.is_alive():
                    os.kill(process.pid, signal.SIGTERM)
        if ended := _join_all(self._workers.values(), grace=CLOSE_GRACE):
            print(f"harel-ref: warning: {ended} search process(es) had not stopped {CLOSE_GRACE:g} s after they were "
                  "told, and were ended (SIGTERM)", file=sys.stderr)
        for channel in (self._tasks, self._results):
            channel.close()
            channel.cancel_join_thread()
