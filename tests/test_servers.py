"""The throwaway servers of harel_ref.testing.servers leave nothing behind, however the process
that started them ends: a clean exit removes them (``atexit``), and a process that was killed,
which runs nothing, is cleaned up after by each server's watchdog (a search process of a
certification that did not stop left an ElasticMQ running and its directory in /tmp)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from server_support import require_server

STARTS = """
import sys
from harel_ref.testing import servers
server = getattr(servers, sys.argv[1])()
process = getattr(server, "_process", None)
print(process.pid if process else "", server.directory, flush=True)
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
    pid, directory = owner.stdout.readline().rstrip("\n").split(" ")
    assert os.path.isdir(directory) and (not pid or os.path.exists(f"/proc/{pid}"))
    owner.kill()  # SIGKILL: no atexit, no finally
    owner.wait()
    deadline = time.monotonic() + 90  # the watchdog looks once a second; a loaded machine is slow
    while not _gone(pid, directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(pid, directory), (server, pid, directory)
    if server == "PostgresServer":
        assert directory not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_server_closed_cleanly_ends_its_watchdog():
    require_server("HAREL_REDIS_URL", "redis-server", "redis-server")
    from harel_ref.testing.servers import RedisServer

    with RedisServer() as server:
        watchdog = server._watchdog
        assert watchdog is not None and watchdog.poll() is None
        server.restart()  # a restarted server gets a watchdog of its own for its new process
        assert watchdog.poll() is not None and server._watchdog.poll() is None
        watchdog = server._watchdog
    assert watchdog.poll() is not None and not server.directory.exists()
