"""How the certifier starts its worker processes: forked from a server that has the certifier
imported, each with its parent's environment and standard streams as they are when it starts.

A process started by ``spawn`` is a new interpreter that imports the certifier and Hypothesis
again: about 0.3 s of CPU before it does anything.  A certification starts several (its search
processes, its pool of branch processes, and the pool again after each crash of a transport),
and the test suite hundreds.  Forked from multiprocessing's fork server, which imported those
modules once (:data:`PRELOADED`), a worker is ready in a few milliseconds, and it still
inherits none of its parent's threads or connections: the server is a process of its own,
started once per parent, that does nothing but fork.

A fork server's child takes from the server what a spawned process takes from its parent, so
two things are handed over at each start, as ``spawn`` would give them:

- the **environment**: the parent names a server it started there for its workers
  (``stateful/backends/_server.py``), and a test sets variables for the processes it starts;
- **standard output and error**: a test captures them, each test in a file of its own.

``sys.path`` and the working directory come with every start, as for ``spawn``.  Where there
is no fork server (Windows), or its socket's path would be too long (a deep ``$TMPDIR``), the
workers are spawned.

A certification stops the fork server it started as it ends (:func:`fork_server_of_its_own`),
so that nothing it started outlives it; a fork server that ran before it is left running, and
the memory watch counts its new children as the certification's (``_memory.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, util
from multiprocessing import reduction
from typing import Any

__all__ = ["PRELOADED", "fork_server", "fork_server_of_its_own", "new_worker", "worker_context"]

PRELOADED = ("harel_ref.certify", "harel_ref.stateful.parallel", "harel_ref.stateful._processes")
"""What the fork server imports before it forks anything: what every worker needs."""


def worker_context() -> Any:
    """The multiprocessing context to start workers from, and to make what they share with
    their parent (``Pipe``, ``Queue``, ``Barrier``); make each worker with :func:`new_worker`."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _room_for_the_socket():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context


SOCKET_PATH_ROOM = 107
"""The longest path of a Unix socket (``sun_path`` is 108 bytes on Linux, its NUL included)."""


def _room_for_the_socket() -> bool:
    """Whether the fork server's socket, ``listener-XXXXXXXX`` in multiprocessing's scratch
    directory under ``$TMPDIR``, can be bound: a deep ``$TMPDIR`` makes its path too long, and
    the workers are then spawned."""
    if fork_server() is not None:
        return True
    return len(os.fsencode(util.get_temp_dir())) + len("/listener-12345678") <= SOCKET_PATH_ROOM


class _Descriptor:
    """One of the parent's file descriptors, duplicated into the child as it starts (pickled
    only while multiprocessing starts a process, which passes the descriptor along)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable, tuple]:
        return _received, (reduction.DupFd(self.fd),)


def _received(duplicate: Any) -> int:
    return duplicate.detach()


class _World:
    """The parent's environment and standard streams, read as the process starts (when it is
    pickled), not when it is made."""

    def __reduce__(self) -> tuple[Callable, tuple]:
        streams = []
        for fd in (1, 2):
            try:
                os.fstat(fd)
            except OSError:  # closed in the parent: the child keeps the server's
                continue
            streams.append((fd, _Descriptor(fd)))
        return tuple, ((dict(os.environ), streams),)  # arrives as (environment, [(fd, its copy)])


def new_worker(context: Any, target: Callable[..., Any], args: tuple, name: str) -> Any:
    """A daemon ``Process`` of ``context`` (:func:`worker_context`), not yet started, that runs
    ``target(*args)`` with the environment and standard streams its parent has when it starts."""
    return context.Process(target=_enter_and_run, args=(_World(), target, *args), name=name, daemon=True)


def _enter_and_run(world: tuple[dict[str, str], list[tuple[int, int]]], target: Callable[..., Any],
                   *args: Any) -> Any:
    """Take on the parent's environment and streams, then run ``target``."""
    environment, streams = world
    os.environ.clear()
    os.environ.update(environment)
    for fd, inherited in streams:
        if inherited != fd:
            os.dup2(inherited, fd)
            os.close(inherited)
    return target(*args)


def fork_server() -> int | None:
    """The pid of this process's fork server while it runs, else None.  (multiprocessing keeps
    it private; None where a Python keeps it elsewhere.)"""
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


@contextlib.contextmanager
def fork_server_of_its_own() -> Iterator[None]:
    """A fork server started inside is stopped as the block ends (its workers should have
    ended: they are not waited for), and the scratch directory multiprocessing made for its
    socket is removed; one that ran before is left as it was."""
    running_before = fork_server() is not None
    scratch_before = _scratch_directory()
    try:
        yield
    finally:
        stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
        if not running_before and fork_server() is not None and stop is not None:
            stop()  # closes the server's lifeline and waits for it to exit
        if _scratch_directory() not in (None, scratch_before):
            _remove_scratch_directory()


def _scratch_directory() -> str | None:
    """multiprocessing's scratch directory (``pymp-*`` under ``$TMPDIR``), if it made one."""
    return getattr(multiprocessing.current_process(), "_config", {}).get("tempdir")


def _remove_scratch_directory() -> None:
    """Run multiprocessing's own removal of its scratch directory now, not as the process
    exits (a caller's ``$TMPDIR`` is left as it was found)."""
    made = _scratch_directory()
    for finalizer in list(getattr(util, "_finalizer_registry", {}).values()):
        if getattr(finalizer, "_callback", None) is getattr(util, "_remove_temp_dir", None) and \
                getattr(finalizer, "_args", ())[1:] == (made,):
            finalizer()  # removes the directory, forgets it, and is not run again at exit
