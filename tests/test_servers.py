"""The throwaway servers of harel_ref.testing.servers leave nothing behind, however the process
that started them ends: a clean exit removes them (``atexit``), and a process that was killed,
which runs nothing, is cleaned up after by each server's watchdog (a search process of a
certification that did not stop left an ElasticMQ running and its directory in /tmp)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from server_support import require_server

STARTS = """
import os, sys, time
from harel_ref.testing import servers
server = getattr(servers, sys.argv[1])()
process = getattr(server, "_process", None)
forked = os.fork() if sys.argv[2:] == ["fork"] else -1  # a child of the owner, not exec'd, that lives on
if forked == 0:
    time.sleep(600)
    os._exit(0)
print(process.pid if process else "", server.directory, forked, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _gone(pid: str, directory: str) -> bool:
    return not os.path.isdir(directory) and not (pid and os.path.exists(f"/proc/{pid}"))


@pytest.mark.parametrize("server", ["RedisServer", "SqsServer", "PostgresServer"])
def test_a_server_whose_process_was_killed_is_stopped_and_its_directory_removed(server):
    """Redis and ElasticMQ are children of the process (a kill), Postgres is not (``pg_ctl``)."""
    if server == "RedisServer":
        require_server("HAREL_REDIS_URL", "redis-server", "redis-server")
    elif server == "PostgresServer":
        require_server("HAREL_POSTGRES_URL", "pg_ctl", "postgresql")
    else:
        require_server("HAREL_SQS_URL", "java", "default-jre-headless")
    owner = subprocess.Popen([sys.executable, "-c", STARTS, server], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    pid, directory, _ = owner.stdout.readline().rstrip("\n").split(" ")
    assert os.path.isdir(directory) and (not pid or os.path.exists(f"/proc/{pid}"))
    owner.kill()  # SIGKILL: no atexit, no finally
    owner.wait()
    deadline = time.monotonic() + 90  # the watchdog looks once a second; a loaded machine is slow
    while not _gone(pid, directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(pid, directory), (server, pid, directory)
    if server == "PostgresServer":
        assert directory not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_child_forked_from_the_owner_does_not_keep_its_server_alive():
    """A child forked without exec (multiprocessing's fork context, ``os.fork``) gets a copy of
    the owner's end of the watchdog's pipe; it closes it at once, so the server goes with its
    owner while the child lives on."""
    require_server("HAREL_REDIS_URL", "redis-server", "redis-server")
    owner = subprocess.Popen([sys.executable, "-c", STARTS, "RedisServer", "fork"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    pid, directory, child = owner.stdout.readline().rstrip("\n").split(" ")
    try:
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 90
        while not _gone(pid, directory) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.path.exists(f"/proc/{child}")  # the child still runs, and the server is gone
        assert _gone(pid, directory), (pid, directory)
    finally:
        os.kill(int(child), signal.SIGKILL)


def test_a_server_closed_cleanly_ends_its_watchdog():
    require_server("HAREL_REDIS_URL", "redis-server", "redis-server")
    from harel_ref.testing.servers import RedisServer

    with RedisServer() as server:
        watchdog = server._watchdog
        assert watchdog is not None and watchdog.poll() is None
        server.restart()  # a restarted server gets a watchdog of its own for its new process
        assert watchdog.poll() is not None and server._watchdog.poll() is None
        stopped = server._process.pid
        server.stop()  # its watchdog no longer names the process id, which another may take
        assert str(stopped) not in server._watchdog.args and server._watchdog.poll() is None
        server.start()
        watchdog = server._watchdog
    assert watchdog.poll() is not None and not server.directory.exists()


def test_a_mongo_server_whose_port_was_taken_before_it_bound_starts_on_another():
    """The port is chosen free, and the JVM binds it a second or two later: another process
    (a server of another test) can take it between.  The first start then chooses another
    port; the suite failed so once, under load.  A restart keeps the port its clients know."""
    import socket

    from harel_ref.testing.servers import MongoServer

    require_server("HAREL_MONGO_URL", "java", "default-jre-headless")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        server = MongoServer(start=False)
        server.port = taken
        try:
            server.start()
            assert server.port != taken and "BindException" in server.log.read_text()
            port = server.port
            server.restart()
            assert server.port == port
        finally:
            server.close()
