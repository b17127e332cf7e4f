"""The certifier's workers are forked from a fork server (stateful/_forking.py), yet each sees
what a spawned process would: its parent's environment and standard streams as they are when
it starts, not as they were when the server started."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from multiprocessing import forkserver
from pathlib import Path

import pytest

from harel_ref.certify._memory import descendants
from harel_ref.stateful import _forking
from harel_ref.stateful._forking import fork_server, fork_server_of_its_own, new_worker, worker_context

VARIABLE = "HAREL_REF_FORKING_TEST"


def _tell(path: str) -> None:
    """A worker: say what it sees, on its streams and in ``path`` (made with its umask), and
    write ``path.atexit`` as it ends."""
    print(f"out of {os.getpid()}", flush=True)
    print(f"err of {os.getpid()}", file=sys.stderr, flush=True)
    with open(path, "w") as seen:
        seen.write(os.environ.get(VARIABLE, "unset"))
    Path(f"{path}.sigint").write_text("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "raises")
    atexit.register(Path(f"{path}.atexit").write_text, "ran")


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


def _short_scratch(request) -> Path:
    """A new directory for multiprocessing's scratch, as short a path as $TMPDIR allows (a
    test's tmp_path under xdist is too long for the fork server's socket), removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="hr-"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    if len(os.fsencode(scratch)) + len("/pymp-12345678/listener-12345678") > _forking.SOCKET_PATH_ROOM:
        pytest.skip(f"$TMPDIR is too deep for a fork server's socket ({scratch}): workers are spawned")
    return scratch


def _run(process) -> None:
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


def _forking_context():
    context = worker_context()
    if context.get_start_method() != "forkserver":
        pytest.skip(f"no fork server here ({sys.platform}, or $TMPDIR too deep for its socket): workers are spawned")
    return context


def test_a_worker_sees_what_its_parent_has_as_it_starts(tmp_path, capfd, monkeypatch):
    """The environment, the streams and the umask set after the server started; and the
    worker's atexit functions run as it ends."""
    context = _forking_context()
    monkeypatch.delenv(VARIABLE, raising=False)
    with fork_server_of_its_own():
        with _streams_to(tmp_path / "streams"):  # the server, if it starts here, keeps these streams
            _run(new_worker(context, _tell, (str(tmp_path / "first"),), name="first"))
        assert (tmp_path / "first").read_text() == "unset"
        assert "out of" in (tmp_path / "streams").read_text()
        capfd.readouterr()

        monkeypatch.setenv(VARIABLE, "set after the server started")
        umask, interrupt = os.umask(0o077), signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            worker = new_worker(context, _tell, (str(tmp_path / "worker"),), name="worker")
            _run(worker)
        finally:
            os.umask(umask)
            signal.signal(signal.SIGINT, interrupt)
        assert (tmp_path / "worker").read_text() == "set after the server started"
        assert (tmp_path / "worker").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "worker.atexit").read_text() == "ran"
        assert (tmp_path / "worker.sigint").read_text() == "ignored"
        assert (tmp_path / "first.sigint").read_text() == "raises"
        out, err = capfd.readouterr()
        assert f"out of {worker.pid}" in out and f"err of {worker.pid}" in err

        # The control: a process the same server forks without new_worker sees the server's world.
        plain = context.Process(target=_tell, args=(str(tmp_path / "plain"),))
        _run(plain)
        assert (tmp_path / "plain").read_text() == "unset"
        assert not (tmp_path / "plain.atexit").exists()
        out, err = capfd.readouterr()
        assert f"out of {plain.pid}" not in out and f"err of {plain.pid}" not in err
    assert fork_server() is None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the server's children in /proc (Linux)")
def test_a_certification_forks_its_workers_from_a_fork_server_it_stops_as_it_ends(tmp_path, monkeypatch, request):
    """Nothing the certification started outlives it: its search processes are children of a
    fork server, which is gone at its end with the scratch directory of its socket."""
    from harel_ref.certify import certify
    from harel_ref.certify._target import Target

    _forking._stop_fork_server(_forking.STOP_GRACE)  # one an earlier test of this process left
    scratch = _short_scratch(request)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # multiprocessing's scratch goes here,
    monkeypatch.setitem(multiprocessing.current_process()._config, "tempdir", None)  # made anew
    monkeypatch.setenv("HAREL_BROKEN_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    target = Target.from_spec("broken:sqlite_in_broken_dir")
    seen = []

    def progress(prop, verdict):
        if verdict is None and (server := fork_server()) is not None:
            seen.append((server, descendants(server), forkserver._forkserver._forkserver_address))

    report = certify(target.factory, profile="quick/8", properties=["fifo", "close"], _target=target, jobs=2,
                     progress=progress)
    assert report.verdict("fifo").verdict == "passed"
    assert seen, "no fork server ran: the workers were spawned"
    server, children, socket = seen[0]
    assert len(children) >= 2  # the two search processes
    assert fork_server() is None and not os.path.exists(f"/proc/{server}")
    assert Path(socket).parent.parent == scratch and list(scratch.iterdir()) == []
    assert _forking._scratch_directory() is None


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the memory limit reads /proc (Linux)")
def test_the_memory_limit_counts_the_workers_of_a_fork_server_that_ran_before(tmp_path, monkeypatch):
    """A fork server this process started before the certification (another certification's,
    or a pool of branch processes made by hand) forks the certification's search processes:
    their memory is the certification's, and a search process that hoards it is stopped."""
    from harel_ref.certify import MemoryLimitReached, certify
    from harel_ref.certify._target import Target

    with fork_server_of_its_own():
        _run(new_worker(_forking_context(), _tell, (str(tmp_path / "before"),), name="before"))
        assert fork_server() is not None
        monkeypatch.syspath_prepend(str(Path(__file__).parent))
        target = Target.from_spec("broken:hoards_memory")
        with pytest.raises(MemoryLimitReached):
            certify(target.factory, profile="quick", properties=["fifo", "close"], _target=target, jobs=2,
                    memory_limit=256 << 20)
        assert fork_server() is not None  # left as it was


STUCK_WITH_PROCESSES = """
import os, signal, time
from harel_ref.certify import certify
from harel_ref.certify._target import Target
from harel_ref.stateful._forking import fork_server

def swallow_a_stop(prop, verdict):  # the run's own SIGTERM, in a callback that lets nothing through
    if verdict is None and prop == "close":
        print("fork server", fork_server(), flush=True)
        sent = False
        while True:
            try:
                if not sent:
                    sent = True
                    os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(60)
            except BaseException:
                pass

target = Target.from_spec("broken:sqlite_in_broken_dir")
certify(target.factory, profile="quick", properties=["fifo", "close"], _target=target, jobs=2,
        progress=swallow_a_stop)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds what is left in /proc (Linux)")
def test_a_run_with_search_processes_ended_by_its_last_resort_leaves_nothing(tmp_path, request):
    """The last resort ends the process with os._exit (SPEC.md C8): the fork server and the
    scratch directory of its socket, which nothing else would remove then, are removed too."""
    import subprocess

    scratch = _short_scratch(request)
    command = subprocess.run([sys.executable, "-c", STUCK_WITH_PROCESSES], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "TMPDIR": str(scratch), "HAREL_BROKEN_DIR": str(tmp_path)})
    assert command.returncode == 128 + signal.SIGTERM, command.stderr[-2000:]
    assert "has not stopped" in command.stderr, command.stderr[-2000:]
    server = command.stdout.split("fork server ", 1)[1].split()[0]
    assert server != "None" and not os.path.exists(f"/proc/{server}")  # its workers were forked
    assert list(scratch.iterdir()) == []
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _environment_holds(pid, f"TMPDIR={scratch}")]
    assert left == []


def _environment_holds(pid: str, variable: str) -> bool:
    try:
        return variable.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False
