"""How the certifier starts its worker processes: forked from a server that has the certifier
imported, each given what a spawned process would take from its parent as it starts.

A process started by ``spawn`` is a new interpreter that imports the certifier and Hypothesis
again: about 0.3 s of CPU before it does anything.  A certification starts several (its search
processes, its pool of branch processes, and the pool again after each crash of a transport),
and the test suite hundreds.  Forked from multiprocessing's fork server, which imported those
modules once (:data:`PRELOADED`), a worker is ready in a few milliseconds, and it still
inherits none of its parent's threads or connections: the server is a process of its own,
started once per parent, that does nothing but fork.

A fork server's child takes some things from the server, not from the process that asked for
it.  Each worker is handed, as it starts, what its parent has then (:class:`_World`):

- the **environment**: the parent names a server it started there for its workers
  (``stateful/backends/_server.py``), and a test sets variables for the processes it starts;
- **standard output and error**: a test captures them, each test in a file of its own;
- the **umask**, and whether **SIGINT** is ignored (a spawned interpreter keeps an ignored
  SIGINT ignored, else it raises KeyboardInterrupt);

and it runs its ``atexit`` functions as it ends, as a spawned process does (a fork server's
child ends with ``os._exit``): a transport's clean-up is registered there.  ``sys.path``
and the working directory come with every start, as for ``spawn``.  Not handed over: resource
limits, and what the interpreter read from the environment as the server started.  A SIGTERM
to the whole process group ends the server with the rest; the workers, which get it too, end
on their own, but their pools see them gone at once (exit code 255) and do not wait for
their clean-up.

The workers are spawned instead where there is no fork server (Windows), where its socket's
path would be too long (a deep ``$TMPDIR``), and where the server would import another
``harel_ref`` than this process runs (Python 3.11's fork server imports its preloaded modules
on its own ``sys.path``, whose first entry is the working directory).

A certification stops the fork server it started as it ends (:func:`fork_server_of_its_own`),
and removes the scratch directory multiprocessing made for its socket, so that nothing it
started outlives it; a fork server that ran before it is left running, and the memory watch
counts that server's new children as the certification's (``_memory.py``).  Setting the
preloaded modules is process-wide: a fork server the caller starts later preloads them too.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, reduction, util
from pathlib import Path
from typing import Any

__all__ = ["PRELOADED", "fork_server", "fork_server_of_its_own", "kill_fork_server", "new_worker", "worker_context"]

PRELOADED = ("harel_ref.certify", "harel_ref.stateful.parallel", "harel_ref.stateful._processes")
"""What the fork server imports before it forks anything: what every worker needs."""

SOCKET_PATH_ROOM = 107 if sys.platform.startswith("linux") else 103
"""The longest path of a Unix socket (``sun_path`` holds 108 bytes on Linux, 104 on macOS and
the BSDs, its NUL included)."""

STOP_GRACE = 5.0
"""Seconds the fork server has to exit once told to, before it is killed (it waits for no
worker, but a worker that outlived its pool keeps it alive)."""


def worker_context() -> Any:
    """The multiprocessing context to start workers from, and to make what they share with
    their parent (``Pipe``, ``Queue``, ``Barrier``); make each worker with :func:`new_worker`."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _room_for_the_socket() \
            or _another_harel_ref_first():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context


def _room_for_the_socket() -> bool:
    """Whether the fork server's socket, ``listener-XXXXXXXX`` in multiprocessing's scratch
    directory under ``$TMPDIR``, can be bound."""
    if fork_server() is not None:
        return True
    return len(os.fsencode(util.get_temp_dir())) + len("/listener-12345678") <= SOCKET_PATH_ROOM


def _another_harel_ref_first() -> bool:
    """Whether the fork server would find another ``harel_ref`` than this process runs: in the
    working directory or on ``$PYTHONPATH``, which it searches before the installed one."""
    import harel_ref

    here = Path(harel_ref.__file__).resolve().parent
    for entry in [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]:
        found = Path(entry, "harel_ref", "__init__.py")
        if found.is_file():
            return found.resolve().parent != here
    return False


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
    """What the parent has as the process starts (when this is pickled), not when it is made:
    its environment, umask, whether SIGINT is ignored, and (from a fork server, on POSIX) its
    standard output and error."""

    def __init__(self, forked: bool) -> None:
        self.forked = forked

    def __reduce__(self) -> tuple[Callable, tuple]:
        streams = []
        for fd in (1, 2) if self.forked else ():
            try:
                os.fstat(fd)
            except OSError:  # closed in the parent: the child keeps the server's
                continue
            streams.append((fd, _Descriptor(fd)))
        quiet = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        return tuple, ((dict(os.environ), streams, _umask(), quiet, self.forked),)  # arrives as a plain tuple


def _umask() -> int:
    """This process's umask, read without setting it where Linux tells it (setting it, even
    back at once, races with a thread that makes a file)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o22)
    os.umask(umask)
    return umask


def new_worker(context: Any, target: Callable[..., Any], args: tuple, name: str) -> Any:
    """A daemon ``Process`` of ``context`` (:func:`worker_context`), not yet started, that runs
    ``target(*args)`` in what its parent has when it starts (:class:`_World`)."""
    world = _World(context.get_start_method() == "forkserver")
    return context.Process(target=_enter_and_run, args=(world, target, *args), name=name, daemon=True)


def _enter_and_run(world: tuple, target: Callable[..., Any], *args: Any) -> Any:
    """Take on the parent's world and run ``target``; forked, end as a spawned process ends."""
    environment, streams, umask, quiet, forked = world
    os.environ.clear()
    os.environ.update(environment)
    for fd, inherited in streams:
        if inherited != fd:
            os.dup2(inherited, fd)
            os.close(inherited)
    os.umask(umask)
    signal.signal(signal.SIGINT, signal.SIG_IGN if quiet else signal.default_int_handler)
    if not forked:
        return target(*args)  # the interpreter's exit runs the atexit functions
    try:
        return target(*args)
    finally:
        _end_as_spawned()


def _end_as_spawned() -> None:
    """What a spawned process does after its target and a fork server's child would not (it
    ends with ``os._exit``): multiprocessing's own ending (its children and finalizers), which
    the process's bootstrap would run next anyway, then the ``atexit`` functions, in which a
    transport may have registered its clean-up."""
    util._exit_function()  # runs once: the bootstrap's call after this one does nothing
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()


def fork_server() -> int | None:
    """The pid of this process's fork server while it runs, else None.  (multiprocessing keeps
    it private; None where a Python keeps it elsewhere.)"""
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


_holders = threading.Lock()
_held: list[tuple[bool, str | None]] = []  # one per block inside: was a server running, the scratch


@contextlib.contextmanager
def fork_server_of_its_own() -> Iterator[None]:
    """A fork server started inside is stopped as the block ends (told to exit, killed after
    :data:`STOP_GRACE` seconds), and the scratch directory multiprocessing made for its socket
    is removed; one that ran before is left as it was.  Blocks inside one another, or in
    several threads, stop it once, as the last of them ends."""
    with _holders:
        if not _held:
            _held.append((fork_server() is not None, _scratch_directory()))
        else:
            _held.append(_held[0])
    try:
        yield
    finally:
        with _holders:
            running_before, scratch_before = _held.pop()
            last = not _held
        if last:
            try:
                if not running_before:
                    _stop_fork_server(STOP_GRACE)
            finally:
                if fork_server() is None and _scratch_directory() not in (None, scratch_before):
                    _remove_scratch_directory()


def kill_fork_server() -> None:
    """Kill this process's fork server at once, and remove its scratch directory (a run that
    must end now: the last resort of a certification that did not stop)."""
    _stop_fork_server(0.0)
    if (scratch := _scratch_directory()) is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _stop_fork_server(grace: float) -> None:
    """Tell the fork server to exit (its lifeline closed), wait ``grace`` seconds, then kill
    it; multiprocessing forgets it first, so a stop cut short leaves no half-known server."""
    server = getattr(forkserver, "_forkserver", None)
    lock = getattr(server, "_lock", None)
    if lock is None or not lock.acquire(timeout=STOP_GRACE):  # a start under way holds it
        return
    try:
        pid, lifeline, address = fork_server(), server._forkserver_alive_fd, server._forkserver_address
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    finally:
        lock.release()
    if pid is None:
        return
    with contextlib.suppress(OSError, TypeError):
        os.close(lifeline)
    deadline = time.monotonic() + grace
    with contextlib.suppress(ChildProcessError, ProcessLookupError):  # reaped or gone meanwhile
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    if isinstance(address, str) and not address.startswith("\0"):
        with contextlib.suppress(OSError):
            os.unlink(address)


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
            with contextlib.suppress(OSError):
                finalizer()  # removes the directory, forgets it, and is not run again at exit
