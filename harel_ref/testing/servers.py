"""Throwaway PostgreSQL, Redis, MongoDB-protocol and SQS servers for tests and certification
runs: Postgres and Redis from the Debian binaries, Mongo as mongo-java-server and SQS as
ElasticMQ, both from Maven Central.

    from harel_ref.testing.servers import PostgresServer, RedisServer

    with PostgresServer() as pg:        # initdb in a temporary directory, a free loopback port
        url = pg.url                    # postgresql://postgres@127.0.0.1:<port>/postgres
        pg.stop(fast=True)              # a fast shutdown, then
        pg.start()                      # the same data directory again
    with RedisServer(appendonly=True) as redis:
        url = redis.url                 # redis://127.0.0.1:<port>/0
        redis.restart()                 # a restart: what AOF keeps comes back
    with MongoServer() as mongo:        # mongo-java-server 1.47.0, in memory
        url = mongo.url                 # mongodb://127.0.0.1:<port>
    with SqsServer() as sqs:            # ElasticMQ 1.7.1, in memory
        url = sqs.url                   # http://127.0.0.1:<port>

Each server lives in its own temporary directory (data, socket, log), listens on 127.0.0.1 only,
on a port the kernel picked free, and is stopped and deleted on ``close()`` (or at the end of the
``with``, or when the process exits).  Several can run at once: one per pytest-xdist worker.

Postgres refuses to run as root.  Run as root (CI is), the server runs as the ``postgres`` user
Debian's package creates, through ``runuser``, and its directory is handed to that user.

The binaries are found on ``PATH``, then in ``/usr/lib/postgresql/<version>/bin`` (Debian keeps
``initdb`` and ``pg_ctl`` there, off ``PATH``).  A missing binary raises :class:`ServerUnavailable`
naming the Debian package to install (``postgresql``, ``redis-server``, ``maven``,
``default-jre-headless``).

The Mongo server runs a small Java main (:data:`MONGO_MAIN`, compiled by Java's source launcher)
on the classpath Maven resolves for mongo-java-server (:func:`maven_classpath`, cached under
``~/.cache/harel-ref/maven``; the first resolution downloads about 5 MB from Maven Central).
The main reports MongoDB 4.4, wire version 9, which PyMongo 4 requires (mongo-java-server
1.47.0 reports 8), and binds 127.0.0.1 only.  The SQS server is ElasticMQ's own main on its
resolved classpath (about 30 MB), with a configuration file that binds 127.0.0.1 and keeps
AWS's limits (``sqs-limits = strict``).
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

__all__ = ["MongoServer", "PostgresServer", "RedisServer", "ServerUnavailable", "SqsServer", "maven_classpath"]


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


WATCHDOG = """\
directory=$1; server=$2; shift 2
read -r _
"$@" >/dev/null 2>&1
waited=0
while [ -n "$server" ] && kill -0 "$server" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
[ -n "$server" ] && kill -9 "$server" 2>/dev/null
rm -rf "$directory"
"""
"""The watchdog of a running server (:meth:`_Server._watch`).  It reads its stdin, a pipe whose
other end only the process that started the server holds and never writes to: the read ends
when that process is gone (the kernel closes its end).  Then it runs the server's stop command,
waits up to 30 s for the server's process (if it is a child) to end, kills it if it has not,
and deletes the server's directory."""


class _Server:
    """What the servers share: a temporary directory, start/stop, cleanup at exit, and a
    watchdog for an exit that runs no clean-up.

    A process that started a server removes it as it exits (``atexit``), but a process killed
    (SIGKILL, or a search process ended by a certification that did not stop) runs nothing:
    its server would live on, an orphan holding memory and a port, and its directory would
    stay.  So each running server has a watchdog (:data:`WATCHDOG`), a shell of its own
    session (a terminal's Ctrl-C passes it by) that waits, without polling, for that process
    to be gone, then stops the server and deletes the directory.  A clean close ends the
    watchdog.  A child forked from the owner (not exec'd) holds no end of the pipe, which would
    keep the watchdog waiting for the child too, and leaves the server alone as it exits: the
    server is its owner's."""

    port: int
    directory: Path
    _running = False
    _watchdog: subprocess.Popen[bytes] | None = None

    def __init__(self, prefix: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=prefix))
        self.port = _free_port()
        self._owner = os.getpid()
        _WATCHED.add(self)
        atexit.register(self.close)

    def _watch(self, stop: list[str], server: subprocess.Popen[bytes] | None = None) -> None:
        """Start the running server's watchdog (ending the one before, of a server restarted):
        ``stop`` is the command that stops it once this process is gone, ``server`` its
        process where it is a child of this one."""
        self._unwatch()
        pid = "" if server is None else str(server.pid)
        self._watchdog = subprocess.Popen(
            ["/bin/sh", "-c", WATCHDOG, "harel-ref-watchdog", str(self.directory), pid, *stop],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def _watch_stopped(self) -> None:
        """After a stop: a watchdog that only deletes the directory, not one that would signal
        a process id the stopped server no longer holds."""
        self._watch([])

    def _unwatch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.kill()  # before its pipe closes: it must not stop the server
            self._watchdog.wait()
            self._watchdog.stdin.close()
            self._watchdog = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the server and delete its directory (harmless twice; nothing in a forked child)."""
        if os.getpid() != self._owner:
            return
        if self._running:
            try:
                self.stop()
            except Exception:  # a server already gone: its directory still goes
                pass
        self._unwatch()
        shutil.rmtree(self.directory, ignore_errors=True)


_WATCHED: weakref.WeakSet[_Server] = weakref.WeakSet()
"""Every server of this process: a forked child closes its copies of their watchdogs' pipes."""


def _forget_watchdogs_in_child() -> None:
    for server in list(_WATCHED):
        if server._watchdog is not None:
            server._watchdog.stdin.close()  # the child's copy: the owner's stays open
            server._watchdog = None


os.register_at_fork(after_in_child=_forget_watchdogs_in_child)


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

    @staticmethod
    def _server_user(command: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def _as_server_user(self, command: list[str]) -> None:
        command = self._server_user(command)
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
        self._watch(self._server_user([self._pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]))
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
        self._watch(["kill", str(self._process.pid)], self._process)
        _wait_for_port(self.port, 30, "redis-server", self.log)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (Redis flushes its AOF and exits), or SIGKILL with ``kill``."""
        if self._process is not None:
            self._process.kill() if kill else self._process.terminate()
            self._process.wait(timeout=30)
            self._process = None
            self._watch_stopped()
        self._running = False

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()


# --- servers that run on the JVM, from Maven Central ------------------------------------------

MONGO_ARTIFACTS = ("de.bwaldvogel:mongo-java-server:1.47.0", "de.bwaldvogel:mongo-java-server-memory-backend:1.47.0",
                   "de.bwaldvogel:mongo-java-server-h2-backend:1.47.0", "org.slf4j:slf4j-nop:2.0.17")
"""mongo-java-server, its in-memory backend and its H2 backend (a file, for a server that keeps
its data across a restart); slf4j-nop: no logging to the console."""

MONGO_MAIN = """\
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.AbstractMongoBackend;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import java.util.List;

public class HarelRefMongo {
    public static void main(String[] args) throws Exception {
        // host port [file]: in memory, or in an H2 file that a clean stop writes out
        AbstractMongoBackend backend = args.length > 2 ? new H2Backend(args[2]) : new MemoryBackend();
        backend.version(new MongoVersion() {  // PyMongo 4 needs wire version 9 (MongoDB 4.4)
            public List<Integer> getVersionArray() { return List.of(4, 4, 0); }
            public int getWireVersion() { return 9; }
        });
        MongoServer server = new MongoServer(backend);
        try {
            server.bind(args[0], Integer.parseInt(args[1]));
        } catch (Exception e) {  // the port is taken (a BindException, which netty throws unchecked): say so and
            // end, or netty's threads would keep the JVM up
            e.printStackTrace();
            System.exit(1);
        }
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdownNow));
        System.out.println("harel-ref: listening");
        System.out.flush();
        Thread.currentThread().join();
    }
}
"""
"""The Java main of :class:`MongoServer`: a mongo-java-server on ``host port``, in memory or in
the H2 file given third."""


def _cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "harel-ref" / "maven"


def maven_classpath(name: str, artifacts: tuple[str, ...]) -> str:
    """The classpath of ``artifacts`` (``group:artifact:version``) and what they depend on,
    resolved by Maven from Maven Central once and cached under ``name`` and a digest of the
    artifacts (several processes resolving at once wait for one another)."""
    digest = hashlib.sha256("\n".join(artifacts).encode()).hexdigest()[:12]  # other versions, another entry
    directory = _cache_directory() / f"{name}-{digest}"
    directory.mkdir(parents=True, exist_ok=True)
    classpath_file = directory / "classpath.txt"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if classpath_file.exists():
            classpath = classpath_file.read_text().strip()
            if classpath and all(os.path.exists(jar) for jar in classpath.split(os.pathsep)):
                return classpath
        maven = shutil.which("mvn")
        if maven is None:
            raise ServerUnavailable("mvn not found: install Debian's maven package (apt-get install maven)")
        dependencies = "".join(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
            for group, artifact, version in (coordinates.split(":") for coordinates in artifacts))
        (directory / "pom.xml").write_text(
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>harel-ref</groupId><artifactId>{name}</artifactId><version>1</version>"
            f"<dependencies>{dependencies}</dependencies></project>\n")
        try:
            result = subprocess.run(
                [maven, "-q", "-B", "dependency:build-classpath", f"-Dmdep.outputFile={classpath_file}"],
                cwd=directory, capture_output=True, text=True, timeout=600,
            )
        except subprocess.TimeoutExpired as exc:
            classpath_file.unlink(missing_ok=True)
            raise ServerUnavailable(f"Maven did not resolve {', '.join(artifacts)} within 600 s") from exc
        if result.returncode != 0 or not classpath_file.exists():
            classpath_file.unlink(missing_ok=True)
            raise ServerUnavailable(f"Maven could not resolve {', '.join(artifacts)} ({result.returncode}): "
                                    f"{(result.stdout + result.stderr).strip()[-2000:]}")
        return classpath_file.read_text().strip()


class _JavaServer(_Server):
    """A server that is one Java process, stopped by SIGTERM (killed after 30 s)."""

    _process: subprocess.Popen[bytes] | None = None

    def __init__(self, prefix: str) -> None:
        self._java = shutil.which("java")
        if self._java is None:
            raise ServerUnavailable("java not found: install Debian's default-jre-headless package (Java 17 or later)")
        super().__init__(prefix)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
            self._watch_stopped()
        self._running = False

    def restart(self) -> None:
        """Stop the server and start it again on the same port: empty in memory, as it was
        when persistent."""
        self.stop()
        self.start()


class MongoServer(_JavaServer):
    """mongo-java-server (an in-memory server of MongoDB's wire protocol, atomic per document,
    without multi-document transactions) on 127.0.0.1.

    In memory it keeps nothing across a restart.  ``persistent=True`` keeps the data in an H2
    file in its directory instead: a clean stop (SIGTERM) writes it out, and a restart finds
    every acknowledged write again."""

    def __init__(self, *, start: bool = True, persistent: bool = False) -> None:
        self.persistent = persistent
        self._classpath = maven_classpath("mongo-java-server", MONGO_ARTIFACTS)
        super().__init__("harel-ref-mongo-")
        self.log = self.directory / "server.log"
        self._main = self.directory / "HarelRefMongo.java"
        self._main.write_text(MONGO_MAIN)
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it, and wait until it listens.  At its first start, a port another process took
        since it was chosen (the JVM binds a second or two later) is chosen again, twice at
        most; a restart keeps its port, which its clients know."""
        first = not self.log.exists()
        for attempt in range(3):
            started_at = self.log.stat().st_size if self.log.exists() else 0  # a restart's log goes on
            why = self._launch(started_at)
            if why is None:
                return
            tail = self.log.read_text(errors="replace")[-2000:]
            if attempt == 2 or not (first and b"BindException" in self.log.read_bytes()[started_at:]):
                break
            self.port = _free_port()
        raise ServerUnavailable(f"mongo-java-server did not listen on 127.0.0.1:{self.port} {why}; "
                                f"its log ends:\n{tail}")

    def _launch(self, started_at: int) -> str | None:
        """Run the server on ``self.port``: None once it listens, else why not (it is stopped)."""
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [self._java, "-Xss512k", "-XX:+UseSerialGC", "-cp", self._classpath, str(self._main),
                 "127.0.0.1", str(self.port), *([str(self.directory / "data.mv.db")] if self.persistent else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._running = True
        self._watch(["kill", str(self._process.pid)], self._process)
        deadline = time.monotonic() + 60
        while b"harel-ref: listening" not in self.log.read_bytes()[started_at:]:  # bound by this process, not another
            ended = self._process.poll()
            if ended is not None or time.monotonic() > deadline:
                self.stop()
                return "within 60 s" if ended is None else f"and ended (exit code {ended})"
            time.sleep(0.05)
        return None



ELASTICMQ_ARTIFACTS = ("org.elasticmq:elasticmq-server_2.13:1.7.1",)
"""ElasticMQ, an in-memory server of SQS's API (FIFO queues, message groups, visibility)."""

ELASTICMQ_CONFIG = """\
include classpath("application.conf")
node-address {{ protocol = http, host = 127.0.0.1, port = {port}, context-path = "" }}
rest-sqs {{ enabled = true, bind-port = {port}, bind-hostname = "127.0.0.1", sqs-limits = strict }}
rest-stats {{ enabled = false }}
"""


ELASTICMQ_PERSISTENCE = """\
messages-storage {{ enabled = true, uri = "jdbc:h2:{directory}/messages" }}
queues-storage {{ enabled = true, path = "{directory}/queues.conf" }}
"""


class SqsServer(_JavaServer):
    """ElasticMQ on 127.0.0.1: SQS's HTTP API, any credentials accepted, region ``us-east-1``.

    It keeps its queues in memory: a restart starts empty.  ``persistent=True`` keeps queues
    and messages in files of its directory (an H2 database) instead; what a restart keeps then
    is in docs/sqs.md."""

    def __init__(self, *, start: bool = True, persistent: bool = False) -> None:
        self.persistent = persistent
        self._classpath = maven_classpath("elasticmq", ELASTICMQ_ARTIFACTS)
        super().__init__("harel-ref-sqs-")
        self.log = self.directory / "server.log"
        self._config = self.directory / "elasticmq.conf"
        self._config.write_text(ELASTICMQ_CONFIG.format(port=self.port)
                                + (ELASTICMQ_PERSISTENCE.format(directory=self.directory) if persistent else ""))
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [self._java, "-XX:+UseSerialGC", f"-Dconfig.file={self._config}", "-cp", self._classpath,
                 "org.elasticmq.server.Main"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._running = True
        self._watch(["kill", str(self._process.pid)], self._process)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:  # exited early, or never listened
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise ServerUnavailable(f"ElasticMQ did not listen on 127.0.0.1:{self.port}; its log ends:\n{tail}")
            time.sleep(0.05)

