"""The certifier's workers are forked from a fork server (stateful/_forking.py), yet each sees
what a spawned process would: its parent's environment and standard streams as they are when
it starts, not as they were when the server started."""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing import forkserver
from pathlib import Path

import pytest

from harel_ref.certify._memory import descendants
from harel_ref.stateful._forking import fork_server, new_worker, worker_context

VARIABLE = "HAREL_REF_FORKING_TEST"


def _tell(path: str) -> None:
    """A worker: say what it sees, on its streams and in ``path``."""
    print(f"out of {os.getpid()}", flush=True)
    print(f"err of {os.getpid()}", file=sys.stderr, flush=True)
    with open(path, "w") as seen:
        seen.write(os.environ.get(VARIABLE, "unset"))


@contextlib.contextmanager
def _streams_to(path):
    """Standard output and error of this process into ``path`` for a while."""
    saved = [os.dup(fd) for fd in (1, 2)]
    with open(path, "w") as scratch:
        for fd in (1, 2):
            os.dup2(scratch.fileno(), fd)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _run(process) -> None:
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no fork server: its workers are spawned")
def test_a_worker_sees_the_environment_and_streams_its_parent_has_as_it_starts(tmp_path, capfd, monkeypatch):
    context = worker_context()
    assert context.get_start_method() == "forkserver"
    monkeypatch.delenv(VARIABLE, raising=False)
    with _streams_to(tmp_path / "streams"):  # the server, if it starts here, keeps these streams
        _run(new_worker(context, _tell, (str(tmp_path / "first"),), name="first"))
    assert (tmp_path / "first").read_text() == "unset"
    assert "out of" in (tmp_path / "streams").read_text()
    capfd.readouterr()

    monkeypatch.setenv(VARIABLE, "set after the server started")
    worker = new_worker(context, _tell, (str(tmp_path / "worker"),), name="worker")
    _run(worker)
    assert (tmp_path / "worker").read_text() == "set after the server started"
    out, err = capfd.readouterr()
    assert f"out of {worker.pid}" in out and f"err of {worker.pid}" in err

    # The control: a process the same server forks without new_worker sees the server's world.
    plain = context.Process(target=_tell, args=(str(tmp_path / "plain"),))
    _run(plain)
    assert (tmp_path / "plain").read_text() == "unset"
    out, err = capfd.readouterr()
    assert f"out of {plain.pid}" not in out and f"err of {plain.pid}" not in err


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no fork server: its workers are spawned")
def test_a_certification_forks_its_workers_from_a_fork_server_it_stops_as_it_ends(tmp_path, monkeypatch):
    """Nothing the certification started outlives it, the fork server included; its search
    processes are children of that server."""
    from harel_ref.certify import certify
    from harel_ref.certify._target import Target

    if fork_server() is not None:  # an earlier test of this process left one: this test needs none
        forkserver._forkserver._stop()
    monkeypatch.setenv("HAREL_BROKEN_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    target = Target.from_spec("broken:sqlite_in_broken_dir")
    servers_seen = []

    def progress(prop, verdict):
        if verdict is None:
            servers_seen.append((fork_server(), descendants(fork_server()) if fork_server() else set()))

    report = certify(target.factory, profile="quick/8", properties=["fifo", "close"], _target=target, jobs=2,
                     progress=progress)
    assert report.verdict("fifo").verdict == "passed"
    server, children = servers_seen[0]
    assert server is not None and len(children) >= 2  # the two search processes
    assert fork_server() is None and not os.path.exists(f"/proc/{server}")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the memory limit reads /proc (Linux)")
def test_the_memory_limit_counts_the_workers_of_a_fork_server_that_ran_before(monkeypatch):
    """A fork server this process started before the certification (another certification's,
    or a pool of branch processes made by hand) forks the certification's search processes:
    their memory is the certification's, and a search process that hoards it is stopped."""
    from harel_ref.certify import MemoryLimitReached, certify
    from harel_ref.certify._target import Target

    _run(new_worker(worker_context(), _tell, (os.devnull,), name="before"))
    assert fork_server() is not None
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    target = Target.from_spec("broken:hoards_memory")
    with pytest.raises(MemoryLimitReached):
        certify(target.factory, profile="quick", properties=["fifo", "close"], _target=target, jobs=2,
                memory_limit=256 << 20)
    assert fork_server() is not None  # left as it was
