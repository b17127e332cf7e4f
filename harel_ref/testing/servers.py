"""Throwaway PostgreSQL and Redis servers, started from the Debian binaries, for tests and
certification runs.

    from harel_ref.testing.servers import PostgresServer, RedisServer

    with PostgresServer() as pg:        # initdb in a temporary directory, a free loopback port
        url = pg.url                    # postgresql://postgres@127.0.0.1:<port>/postgres
        pg.stop(fast=True)              # a fast shutdown, then
        pg.start()                      # the same data directory again
    with RedisServer(appendonly=True) as redis:
        url = redis.url                 # redis://127.0.0.1:<port>/0
        redis.restart()                 # a restart: what AOF keeps comes back

Each server lives in its own temporary directory (data, socket, log), listens on 127.0.0.1 only,
on a port the kernel picked free, and is stopped and deleted on ``close()`` (or at the end of the
``with``, or when the process exits).  Several can run at once: one per pytest-xdist worker.

Postgres refuses to run as root.  Run as root (CI is), the server runs as the ``postgres`` user
Debian's package creates, through ``runuser``, and its directory is handed to that user.

The binaries are found on ``PATH``, then in ``/usr/lib/postgresql/<version>/bin`` (Debian keeps
``initdb`` and ``pg_ctl`` there, off ``PATH``).  A missing binary raises :class:`ServerUnavailable`
naming the Debian package to install (``postgresql``, ``redis-server``).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PostgresServer", "RedisServer", "ServerUnavailable"]


class ServerUnavailable(RuntimeError):
    """The server cannot be started here (its binary is missing, or it would not start)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return candidate
    raise ServerUnavailable(f"{name} not found: install Debian's {package} package (apt-get install {package})")


def _wait_for_port(port: int, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise ServerUnavailable(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g}s; its log ends:\n{tail}")


class _Server:
    """What both servers share: a temporary directory, start/stop, cleanup at exit."""

    port: int
    directory: Path
    _running = False

    def __init__(self, prefix: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=prefix))
        self.port = _free_port()
        atexit.register(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the server and delete its directory (harmless twice)."""
        if self._running:
            try:
                self.stop()
            except Exception:  # a server already gone: its directory still goes
                pass
        shutil.rmtree(self.directory, ignore_errors=True)


class PostgresServer(_Server):
    """A PostgreSQL server of its own: ``initdb`` then ``pg_ctl start``, trust authentication
    for the ``postgres`` superuser on 127.0.0.1.

    ``durable=False`` (the tests) turns off ``fsync`` for speed: a process that is killed or
    shut down keeps everything it committed (the kernel still has it); only a crash of the
    machine could lose some.  Benchmarks use ``durable=True``.
    """

    def __init__(self, *, durable: bool = False, start: bool = True) -> None:
        self._initdb = _binary("initdb", "postgresql")
        self._pg_ctl = _binary("pg_ctl", "postgresql")
        super().__init__("harel-ref-postgres-")
        self.durable = durable
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        if os.geteuid() == 0:  # postgres refuses root: hand the directory to its own user
            shutil.chown(self.directory, "postgres", "postgres")
        self._as_server_user([self._initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                              "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self, command: list[str]) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise ServerUnavailable(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory}"
                   f" -c max_connections=200 -c shared_buffers=64MB")
        if not self.durable:
            options += " -c fsync=off -c full_page_writes=off"
        self._as_server_user([self._pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options,
                              "-w", "-t", "60", "start"])
        self._running = True
        _wait_for_port(self.port, 30, "postgres", self.log)

    def stop(self, *, fast: bool = True) -> None:
        """``pg_ctl stop``: ``fast`` (the default) rolls back open transactions and closes every
        connection at once; otherwise ``immediate``, an abort that recovers from WAL at the next
        start (as after a crash of the server)."""
        self._as_server_user([self._pg_ctl, "-D", str(self.data), "-m", "fast" if fast else "immediate",
                              "-w", "-t", "60", "stop"])
        self._running = False


class RedisServer(_Server):
    """A redis-server of its own on 127.0.0.1, no RDB snapshots.

    ``appendonly=True`` keeps every write in an append-only file synced every second
    (``appendfsync everysec``, Redis's default): a restart finds the data again.  With
    ``appendonly=False`` the server keeps nothing across a restart.
    """

    def __init__(self, *, appendonly: bool = False, start: bool = True) -> None:
        self._binary = _binary("redis-server", "redis-server")
        super().__init__("harel-ref-redis-")
        self.appendonly = appendonly
        self.log = self.directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                   "--save", "", "--appendonly", "yes" if self.appendonly else "no",
                   "--logfile", str(self.log), "--daemonize", "no", "--protected-mode", "no"]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        self._running = True
        _wait_for_port(self.port, 30, "redis-server", self.log)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (Redis flushes its AOF and exits), or SIGKILL with ``kill``."""
        if self._process is not None:
            self._process.kill() if kill else self._process.terminate()
            self._process.wait(timeout=30)
            self._process = None
        self._running = False

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()
