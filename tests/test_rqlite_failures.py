"""The rqlite transport's failure classes, without a cluster.

Every row of the failure table (``_FAILURES`` in harel_ref/transport/rqlite.py, printed in
docs/rqlite-failures.md) is provoked here against fake rqlite nodes: HTTP servers on 127.0.0.1
written on raw sockets, so that a test can break a request at any phase (refuse the connection,
leave it in the accept queue, read the request and never answer, reset it, answer garbage or a
truncated body, fail TLS before or after the handshake), in front of one SQLite database that
answers like rqlite 8.43.4.  What httpx cannot be made to raise over a socket (a pool timeout,
a proxy error...) is raised by an ``httpx.MockTransport`` in front of the same database.

Each case opens a transport on two nodes, ``first`` then ``second``, breaks ``first`` for one
publish, and checks what the failure's class promises:

- *not applied*: the publish went on to ``second`` and succeeded; the message is there once;
- *may have applied*: ``second`` saw nothing; the caller got ``OutcomeUnknownError``; where the
  broken node had applied the publish before failing, the message is there once, not twice;
- *refused*: ``second`` saw nothing; the caller got ``StorageError``; nothing was written.

Every case runs through ``RqliteTransport`` and ``AsyncRqliteTransport`` alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os
import shutil
import socket
import sqlite3
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harel_ref.transport import AsyncRqliteTransport, OutcomeUnknownError, RqliteTransport, StorageError
from harel_ref.transport import rqlite as rqlite_module
from harel_ref.transport.rqlite import _FAILURES, _MAY_HAVE_APPLIED, _NOT_APPLIED, _REFUSED
from harel_ref.stateful import FakeClock

# Seconds a request that a case makes time out waits (``opened``'s ``short``): every other
# request of such a case, to a healthy node, gets PATIENT.
TIMEOUT = 1.0
PATIENT = 10.0  # seconds per request elsewhere: a fake node in a thread of a process on busy cores
# answered a connect after 0.4 s (the suite under load), and a test of versions failed on it
DOCS = Path(__file__).parent.parent / "docs" / "rqlite-failures.md"

# The class each failure must have: the spec of the table, written down independently of it.
EXPECTED = {
    "connect timeout": _NOT_APPLIED,
    "connect failed": _NOT_APPLIED,
    "pool timeout": _NOT_APPLIED,
    "proxy error": _NOT_APPLIED,
    "unsupported protocol": _REFUSED,
    "local protocol error": _REFUSED,
    "write timeout": _MAY_HAVE_APPLIED,
    "write error": _MAY_HAVE_APPLIED,
    "read timeout": _MAY_HAVE_APPLIED,
    "read error": _MAY_HAVE_APPLIED,
    "remote protocol error": _MAY_HAVE_APPLIED,
    "TLS error": _MAY_HAVE_APPLIED,
    "other httpx error": _MAY_HAVE_APPLIED,
    "statement error": _REFUSED,
    "not leader": _NOT_APPLIED,
    "leader unreachable": _NOT_APPLIED,
    "rqlite error": _MAY_HAVE_APPLIED,
    "unreadable answer": _MAY_HAVE_APPLIED,
    "leader not found": _NOT_APPLIED,
    "leader address unknown": _NOT_APPLIED,
    "SQL rewrite failed": _REFUSED,
    "credentials refused": _REFUSED,
    "client error": _REFUSED,
    "unexpected status": _MAY_HAVE_APPLIED,
}


def _name(row) -> str:
    return row.failure.split(":")[0]


# --- A database that answers like rqlite -----------------------------------------------------


class FakeRqlite:
    """One SQLite database behind rqlite's HTTP API, as rqlite 8.43.4 answers the transport:
    ``GET /readyz``, ``POST /db/execute?transaction``, ``POST /db/query?level=strong``."""

    def __init__(self, version: str | None = "v8.43.4") -> None:
        self.version = version
        self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request."""
        path = target.split("?")[0]
        if method == "GET" and path == "/readyz":
            return 200, "text/plain; charset=utf-8", b"[+]node ok\n[+]leader ok\n[+]store ok"
        if method == "POST" and path in ("/db/execute", "/db/query"):
            return 200, "application/json", json.dumps({"results": self.run(json.loads(body))}).encode()
        return 404, "text/plain; charset=utf-8", b"404 page not found\n"

    def run(self, statements: list[list]) -> list[dict]:
        """Run the statements as one transaction, as ``?transaction`` does: a failing one ends
        the results with its error, and everything is rolled back."""
        results = []
        with self._lock:
            self._db.execute("BEGIN")
            for sql, *params in statements:
                try:
                    cursor = self._db.execute(sql, params)
                    rows = cursor.fetchall()
                except sqlite3.Error as exc:
                    self._db.execute("ROLLBACK")
                    return [*results, {"error": str(exc)}]
                if cursor.description:  # a query, or RETURNING: rqlite leaves out empty values
                    columns = [column[0] for column in cursor.description]
                    result = {"columns": columns, "types": [""] * len(columns)}
                    if rows:
                        result["values"] = [list(row) for row in rows]
                else:
                    result = {"last_insert_id": cursor.lastrowid, "rows_affected": cursor.rowcount}
                results.append(result)
            self._db.execute("COMMIT")
        return results

    def events(self) -> list[str]:
        """Every message's event, in queue order (the tables without prefix)."""
        with self._lock:
            try:
                return [row[0] for row in self._db.execute("SELECT event FROM harel_transport_messages ORDER BY seq")]
            except sqlite3.OperationalError:  # no table yet
                return []


# --- Fake nodes on sockets: an HTTP/1.1 server that can fail at any phase --------------------


@dataclass
class Request:
    method: str
    target: str
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?")[0]


Fault = Callable[["Node", socket.socket, Request], None]
"""What a broken node does with a request instead of answering it (the connection closes after)."""


class Node:
    """A fake rqlite node on 127.0.0.1 in front of ``rqlite``: it answers as rqlite does until
    a fault is armed, or it is stopped, muted, or handed a certificate the client distrusts."""

    def __init__(self, rqlite: FakeRqlite, tls: ssl.SSLContext | None = None) -> None:
        self.rqlite = rqlite
        self.tls = tls
        self.seen: list[str] = []  # "METHOD /path" of every request read
        self.released = threading.Event()  # ends every fault that hangs
        self._fault: tuple[str | None, Fault] | None = None
        self._accepting = True
        self._connections: list[socket.socket] = []
        self._filler: socket.socket | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.02)
        self.port = self._listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def arm(self, fault: Fault, path: str | None = None) -> None:
        """Break the next request (to ``path``, if given) with ``fault``."""
        self._fault = (path, fault)

    def drop_connections(self) -> None:
        """Close every open connection, so that the client's next request needs a new one.

        Returns once the client's end of each has seen the close: a pooled connection whose
        close the client has not seen yet would be reused, and answer with a reset."""
        clients = set()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                clients.add(conn.getpeername()[1])
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # now, whoever else holds the socket
            with contextlib.suppress(OSError):
                conn.close()
        self._connections.clear()
        _wait_until_closes_seen(clients, self.port)

    def stop(self) -> None:
        """Nothing listens any more: a connect is refused."""
        self._stop_accepting()
        self._listener.close()
        self.drop_connections()

    def mute(self) -> None:
        """Still listening, never accepting: a connect completes in the kernel's accept queue
        and the request sent on it is never read."""
        self._stop_accepting()
        self.drop_connections()

    def fill_backlog(self) -> None:
        """Muted, with an accept queue of one, which one connection fills: a connect times out."""
        self.mute()
        self._listener.listen(0)
        self._filler = socket.create_connection(("127.0.0.1", self._listener.getsockname()[1]))

    def distrusted(self, tls: ssl.SSLContext) -> None:
        """From now on, handshake with ``tls`` (a certificate the client does not trust)."""
        self.tls = tls
        self.drop_connections()

    def close(self) -> None:
        self.released.set()
        self._stop_accepting()
        for closable in (self._listener, self._filler):
            with contextlib.suppress(AttributeError, OSError):
                closable.close()
        self.drop_connections()

    def _stop_accepting(self) -> None:
        """Return once the accepting thread has ended. Until then the listener lives on in the
        kernel, even once closed here, while that thread waits in ``accept``: a connect would
        complete, and be reset when that wait ends, instead of being refused."""
        self._accepting = False
        self._acceptor.join()

    def _accept(self) -> None:
        while self._accepting:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._connections.append(conn)
            if self._accepting:  # else: muted while accepting, so leave it unread
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        try:
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
                self._connections.append(conn)
            reader = conn.makefile("rb")
            while (request := _read_request(reader)) is not None:
                self.seen.append(f"{request.method} {request.path}")
                if self._fault and self._fault[0] in (None, request.path):
                    fault, self._fault = self._fault[1], None
                    fault(self, conn, request)
                    break
                status, content_type, body = self.rqlite.answer(request.method, request.target, request.body)
                conn.sendall(_response(status, body, content_type, self.rqlite.version))
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()


_ESTABLISHED = "01"  # a TCP state in /proc/net/tcp


def _wait_until_closes_seen(clients: set[int], port: int) -> None:
    """Wait until no connection from one of the ports ``clients`` to ``port`` is still open at
    the client's end: the close reached it (on loopback, under load, it can take a while)."""
    deadline = time.monotonic() + 30
    while clients & _established_from(port):
        assert time.monotonic() < deadline, f"the client never saw the close of {sorted(clients)}"
        time.sleep(0.002)


def _established_from(port: int) -> set[int]:
    """The local ports of the open TCP connections to 127.0.0.1:``port`` on this machine."""
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == _ESTABLISHED and int(remote.split(":")[1], 16) == port:
            ports.add(int(local.split(":")[1], 16))
    return ports


def _read_request(reader) -> Request | None:
    line = reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    length = 0
    while (header := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return Request(method, target, reader.read(length) if length else b"")


def _response(status: int, body: bytes, content_type: str, version: str | None, last: bool = False) -> bytes:
    """An HTTP/1.1 answer; ``last``: the node closes the connection after it, and says so."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    headers = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}"]
    if last:
        headers.append("Connection: close")
    if version:
        headers.append(f"X-Rqlite-Version: {version}")
    if status in (204, 304):  # no body, by definition
        return ("\r\n".join(headers) + "\r\n\r\n").encode()
    headers.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


# --- Faults: what a broken node does with the request ----------------------------------------


def _applied(node: Node, request: Request, applied: bool) -> None:
    """Run the request against the database first, as a node that applied it, then failed."""
    if applied:
        node.rqlite.run(json.loads(request.body))


def reply(status: int, body: str = "", *, applied: bool = False, content_type: str = "text/plain; charset=utf-8") -> Fault:
    def fault(node, conn, request):
        _applied(node, request, applied)
        conn.sendall(_response(status, body.encode(), content_type, node.rqlite.version, last=True))
    return fault


def rqlite_error(error: str, *, applied: bool = False) -> Fault:
    """HTTP 200 with a top-level ``error``: how rqlite reports that its store failed."""
    return reply(200, json.dumps({"error": error}), applied=applied, content_type="application/json")


def results(body: object, *, applied: bool = False) -> Fault:
    return reply(200, body if isinstance(body, str) else json.dumps(body), applied=applied,
                 content_type="application/json")


def hang(*, applied: bool, first: bytes = b"") -> Fault:
    """Read the request, send ``first`` (nothing, or the start of an answer), never finish."""
    def fault(node, conn, request):
        _applied(node, request, applied)
        conn.sendall(first)
        node.released.wait(10)
    return fault


def close(*, applied: bool) -> Fault:
    """Read the request, close the connection without a word."""
    def fault(node, conn, request):
        _applied(node, request, applied)
        conn.shutdown(socket.SHUT_RDWR)
    return fault


def reset(*, applied: bool, first: bytes = b"") -> Fault:
    """Read the request, send ``first``, then reset the connection (RST)."""
    def fault(node, conn, request):
        _applied(node, request, applied)
        conn.sendall(first)
        time.sleep(0.05)  # the client is waiting in recv() when the RST comes
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return fault


def send(data: bytes, *, applied: bool) -> Fault:
    """Answer ``data``, whatever it is, and close."""
    def fault(node, conn, request):
        _applied(node, request, applied)
        conn.sendall(data)
    return fault


def tls_garbage(*, applied: bool) -> Fault:
    """Past the handshake: bytes that are no TLS record, written under the TLS layer."""
    def fault(node, conn, request):
        _applied(node, request, applied)
        with socket.socket(fileno=os.dup(conn.fileno())) as raw:
            raw.sendall(b"\x17\x03\x03\x00\x20this is not a TLS record at all!")
        time.sleep(0.05)
    return fault


# --- Checking a case -------------------------------------------------------------------------


TESTED: set[str] = set()  # the rows some case provokes; see test_every_row_is_tested


def case(id: str, row: str | tuple[str, str], break_first, applied: bool = False):
    """A case: ``break_first(node)`` breaks the first node so that its failure is ``row`` (or
    (its row in sync mode, in async mode)); ``applied``: the broken node had applied the
    publish before failing."""
    for name in (row,) if isinstance(row, str) else row:
        assert name in EXPECTED, name
        TESTED.add(name)
    return pytest.param(row, break_first, applied, id=id)


def armed(fault: Fault) -> Callable[[Node], None]:
    return lambda node: node.arm(fault, "/db/execute")


@pytest.fixture(params=["sync", "async"])
def mode(request) -> str:
    return request.param


@pytest.fixture
def rqlite() -> FakeRqlite:
    return FakeRqlite()


@pytest.fixture
def nodes(rqlite) -> Iterator[list[Node]]:
    """Two nodes of one database: ``first``, the one a test breaks, and ``second``."""
    made = [Node(rqlite), Node(rqlite)]
    yield made
    for node in made:
        node.close()


@contextlib.contextmanager
def opened(mode: str, urls: list[str], short: set[tuple[int, str]] | None = None,
           **options) -> Iterator[Callable[..., object]]:
    """A transport opened on ``urls`` (sync or async); yields ``call(method, *args)``, which
    calls it and returns its answer (awaited in its own event loop, in async mode).

    ``short``: the (port, path) of the requests a case makes time out.  When given, only those
    get the transport's ``timeout``; every other request, to a healthy node, gets PATIENT (the
    transport sets one timeout for all, and CI's busy cores once stalled a healthy localhost
    connect past 0.4 s).  A case adds its broken node's pair once it has broken it."""
    options = {"timeout": PATIENT, "wait": 0, **options}
    if short is not None:
        options["client"] = _patient_client(mode, short)
    if mode == "sync":
        transport = RqliteTransport.from_url(urls, **options)
        try:
            yield lambda method, *args: getattr(transport, method)(*args)
        finally:
            transport.close()
            if short is not None:
                options["client"].close()
        return
    loop = asyncio.new_event_loop()
    try:
        transport = loop.run_until_complete(AsyncRqliteTransport.from_url(urls, **options))
        try:
            yield lambda method, *args: loop.run_until_complete(getattr(transport, method)(*args))
        finally:
            loop.run_until_complete(transport.close())
            if short is not None:
                loop.run_until_complete(options["client"].aclose())
    finally:
        loop.close()


def _patient(request: httpx.Request, short: set[tuple[int, str]]) -> None:
    if (request.url.port, request.url.path) not in short:
        request.extensions["timeout"] = httpx.Timeout(PATIENT).as_dict()


class _PatientTransport(httpx.HTTPTransport):
    def __init__(self, short: set[tuple[int, str]]) -> None:
        super().__init__()
        self.short = short

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _patient(request, self.short)
        return super().handle_request(request)


class _AsyncPatientTransport(httpx.AsyncHTTPTransport):
    def __init__(self, short: set[tuple[int, str]]) -> None:
        super().__init__()
        self.short = short

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _patient(request, self.short)
        return await super().handle_async_request(request)


def _patient_client(mode: str, short: set[tuple[int, str]]) -> httpx.Client | httpx.AsyncClient:
    """A client whose requests wait PATIENT seconds but for those to ``short``'s pairs."""
    if mode == "sync":
        return httpx.Client(transport=_PatientTransport(short), trust_env=False)
    return httpx.AsyncClient(transport=_AsyncPatientTransport(short), trust_env=False)


def check_failure(row_name: str, applied: bool, publish: Callable[[], object], second, rqlite: FakeRqlite, caplog) -> None:
    """``publish()`` goes through a first node broken so that it fails as the row ``row_name``
    says: check the row's class, what the caller saw, which node was tried, what was written."""
    (row,) = [row for row in _FAILURES if _name(row) == row_name]
    outcome = EXPECTED[row_name]
    assert row.outcome == outcome, f"the table says {row.outcome!r} for {row_name!r}, the spec {outcome!r}"
    caplog.set_level(logging.INFO, logger=rqlite_module.__name__)
    caplog.clear()
    seen, written = len(second.seen), len(rqlite.events())
    if outcome == _NOT_APPLIED:
        assert publish() is None
        assert second.seen[seen:] == ["POST /db/execute"], "not applied: the next node is tried"
        assert len(rqlite.events()) == written + 1
        assert row.failure in caplog.text
        return
    with pytest.raises(OutcomeUnknownError if outcome == _MAY_HAVE_APPLIED else StorageError) as caught:
        publish()
    assert second.seen[seen:] == [], f"{outcome}: no other node is tried"
    assert len(rqlite.events()) == written + applied, "applied once at most, never twice"
    assert row.failure in str(caught.value)


def check_case(mode, row, break_first, applied, first, second, rqlite, caplog, **options) -> None:
    row = row if isinstance(row, str) else row[mode == "async"]
    short = set() if row.endswith("timeout") and "client" not in options else None  # a mock raises at once
    timeout = PATIENT if short is None else TIMEOUT
    with opened(mode, [first.url, second.url], short, timeout=timeout, **options) as call:
        break_first(first)
        if short is not None:
            short.add((first.port, "/db/execute"))  # the publish to the broken node
        check_failure(row, applied, lambda: call("publish", "g", "e"), second, rqlite, caplog)


# --- Failures of the connection, of the request, of the answer: over sockets -----------------


SOCKET_CASES = [
    # the connection
    case("nothing-listening", "connect failed", Node.stop),
    case("accept-queue-full", "connect timeout", Node.fill_backlog),
    case("never-accepted", "read timeout", Node.mute),
    # the request sent, the answer lost
    case("no-answer", "read timeout", armed(hang(applied=True)), True),
    case("headers-then-nothing", "read timeout",
         armed(hang(applied=True, first=b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{")), True),
    case("closed-after-reading", "remote protocol error", armed(close(applied=True)), True),
    case("reset-after-reading", "read error", armed(reset(applied=True)), True),
    case("reset-mid-answer", "read error",
         armed(reset(applied=True, first=b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{")), True),
    case("garbage", "remote protocol error", armed(send(b"\x00\xffnot http\r\n\r\n", applied=True)), True),
    case("body-cut-short", "remote protocol error",
         armed(send(b"HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n{\"results\": [", applied=True)), True),
    # HTTP 200 from rqlite
    case("sql-error", "statement error", armed(results({"results": [{"error": "UNIQUE constraint failed: t.x"}]}))),
    case("not-leader", "not leader", armed(rqlite_error("not leader"))),
    case("leader-changed-while-forwarding", "not leader",
         armed(rqlite_error("node failed to process Execute on remote node at rqlite1:4002: not leader"))),
    case("store-not-ready", "not leader", armed(rqlite_error("store not ready"))),
    case("store-not-open", "not leader", armed(rqlite_error("store not open"))),
    case("leader-unreachable", "leader unreachable", armed(rqlite_error(
        "node failed to process Execute on remote node at rqlite1:4002: pool get: dial tcp "
        "172.18.0.2:4002: connect: connection refused"))),
    case("leadership-lost", "rqlite error", armed(rqlite_error("leadership lost while committing log", applied=True)), True),
    case("forwarded-answer-lost", "rqlite error", armed(rqlite_error(
        "node failed to process Execute on remote node at rqlite1:4002: read protobuf length: EOF", applied=True)), True),
    case("not-leader-inside-a-longer-error", "rqlite error",
         armed(rqlite_error("raft: not leader anymore, entry may be committed", applied=True)), True),
    case("not-json", "unreadable answer", armed(results("<html>502 Bad Gateway</html>", applied=True)), True),
    case("truncated-json", "unreadable answer", armed(results('{"results": [{"last_insert_id": 1, "rows', applied=True)), True),
    case("json-list", "unreadable answer", armed(results([], applied=True)), True),
    case("json-without-results", "unreadable answer", armed(results({}, applied=True)), True),
    case("too-few-results", "unreadable answer",
         armed(results({"results": [{"last_insert_id": 1, "rows_affected": 1}]}, applied=True)), True),
    case("empty-body", "unreadable answer", armed(results("", applied=True)), True),
    # any other status, with a body that means something
    case("503-leader-not-found", "leader not found", armed(reply(503, "leader not found\n"))),
    case("503-from-a-proxy", "unexpected status", armed(reply(503, "<html>Service Unavailable</html>", applied=True)), True),
    case("503-mentioning-not-leader", "unexpected status",
         armed(reply(503, "upstream said: not leader; retrying\n", applied=True)), True),
    case("500-leader-address", "leader address unknown", armed(reply(500, "leader address: no leader address\n"))),
    case("500-sql-rewrite", "SQL rewrite failed", armed(reply(500, "SQL rewrite: bad time function\n"))),
    case("500-answer-not-written", "unexpected status", armed(reply(500, "json: unsupported value: NaN\n", applied=True)), True),
    case("401-unauthorized", "credentials refused", armed(reply(401))),
    case("403-forbidden", "credentials refused", armed(reply(403))),
    case("400-invalid-json", "client error", armed(reply(400, "invalid JSON body\n"))),
]


@pytest.mark.parametrize("row, break_first, applied", SOCKET_CASES)
def test_a_failure_over_sockets(row, break_first, applied, mode, nodes, rqlite, caplog):
    check_case(mode, row, break_first, applied, *nodes, rqlite, caplog)


STATUS_GROUPS = {  # every status from 200 to 599 that means something, and a few that do not
    "other-2xx-and-3xx": ([s for s in http.HTTPStatus if 201 <= s < 400] + [299, 399], "unexpected status", True),
    "4xx": ([s for s in http.HTTPStatus if 400 <= s < 500 and s not in (401, 403)] + [499], "client error", False),
    "5xx": ([s for s in http.HTTPStatus if 500 <= s < 600] + [598, 599], "unexpected status", True),
}
TESTED.update(row for _, row, _ in STATUS_GROUPS.values())


@pytest.mark.parametrize("group", STATUS_GROUPS)
def test_every_status_by_class(group, mode, nodes, rqlite, caplog):
    """Each status in turn, with a body rqlite never sends (so no marker of the table matches),
    after applying the publish where the class is "may have applied"."""
    statuses, row, applied = STATUS_GROUPS[group]
    first, second = nodes
    with opened(mode, [first.url, second.url]) as call:
        for status in statuses:
            first.arm(reply(int(status), "<html><h1>It went wrong</h1></html>\n", applied=applied), "/db/execute")
            try:
                check_failure(row, applied, lambda: call("publish", "g", "e"), second, rqlite, caplog)
            except BaseException as exc:
                raise AssertionError(f"HTTP {int(status)}") from exc


def test_an_unknown_host_is_not_applied(mode, nodes, rqlite, caplog):
    """A name that does not resolve: the connect fails before anything is sent."""
    caplog.set_level(logging.INFO, logger=rqlite_module.__name__)
    with opened(mode, ["http://no-such-node.invalid:4001", nodes[1].url]) as call:
        call("publish", "g", "e")
    assert rqlite.events() == ["e"]
    assert "no-such-node.invalid:4001: connect failed" in caplog.text


# --- TLS: a handshake that fails sent nothing; a TLS error after it may have --------------------


@pytest.fixture(scope="module")
def certificates():
    """Two self-signed certificates for 127.0.0.1: "trusted" (the client's CA) and "other",
    in a directory removed after the module (pytest keeps tmp_path_factory's)."""
    if not shutil.which("openssl"):
        message = "the TLS cases need the openssl command (Debian: apt install openssl)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(message + "; on CI a missing tool is an error", pytrace=False)
        pytest.skip(message)
    with tempfile.TemporaryDirectory(prefix="harel-ref-tls-") as directory:
        folder = Path(directory)
        for name in ("trusted", "other"):
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                 "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.pem")],
                check=True, capture_output=True,
            )
        yield {name: folder / name for name in ("trusted", "other")}


def _server_tls(certificate: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"{certificate}.pem", f"{certificate}.key")
    return context


@pytest.mark.parametrize("row, break_first, applied", [
    case("untrusted-certificate", "connect failed", None),
    # httpx's sync backend wraps the ssl.SSLError in a ReadError; its asyncio backend does not
    case("tls-error-after-the-request", ("read error", "TLS error"), armed(tls_garbage(applied=True)), True),
])
def test_a_tls_failure(row, break_first, applied, mode, certificates, rqlite, caplog):
    first, second = Node(rqlite, tls=_server_tls(certificates["trusted"])), Node(rqlite)
    other = _server_tls(certificates["other"])
    verify = ssl.create_default_context(cafile=f"{certificates['trusted']}.pem")
    client = (httpx.Client if mode == "sync" else httpx.AsyncClient)(verify=verify)
    try:
        check_case(mode, row, break_first or (lambda node: node.distrusted(other)), applied,
                   first, second, rqlite, caplog, client=client)
    finally:
        for node in (first, second):
            node.close()


# --- What httpx raises that a socket cannot easily make: through a MockTransport -------------


class MockNode:
    """A node ``http://<name>.test`` of ``rqlite`` behind an ``httpx.MockTransport``, that can
    be made to raise one exception (after applying the request, or not)."""

    def __init__(self, rqlite: FakeRqlite, name: str) -> None:
        self.rqlite = rqlite
        self.url = f"http://{name}.test:4001"
        self.seen: list[str] = []
        self._raising: tuple[Exception, bool] | None = None

    def arm(self, error: Exception, applied: bool) -> None:
        self._raising = (error, applied)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        if self._raising and request.url.path == "/db/execute":
            (error, applied), self._raising = self._raising, None
            if applied:
                self.rqlite.run(json.loads(request.content))
            raise error
        status, content_type, body = self.rqlite.answer(request.method, request.url.raw_path.decode(), request.content)
        return httpx.Response(status, content=body, headers={"Content-Type": content_type, "X-Rqlite-Version": "v8.43.4"})


def mock_client(mode: str, *nodes: MockNode) -> httpx.Client | httpx.AsyncClient:
    by_host = {httpx.URL(node.url).host: node for node in nodes}
    transport = httpx.MockTransport(lambda request: by_host[request.url.host].handle(request))
    return (httpx.Client if mode == "sync" else httpx.AsyncClient)(transport=transport)


def raised(id: str, row: str, error: type[Exception], applied: bool = False):
    def break_first(node: MockNode) -> None:
        node.arm(error("injected") if error is ssl.SSLError else
                 error("injected", request=httpx.Request("POST", node.url)), applied)
    return case(id, row, break_first, applied)


@pytest.mark.parametrize("row, break_first, applied", [
    raised("ConnectError", "connect failed", httpx.ConnectError),
    raised("ConnectTimeout", "connect timeout", httpx.ConnectTimeout),
    raised("PoolTimeout", "pool timeout", httpx.PoolTimeout),
    raised("ProxyError", "proxy error", httpx.ProxyError),
    raised("UnsupportedProtocol", "unsupported protocol", httpx.UnsupportedProtocol),
    raised("LocalProtocolError", "local protocol error", httpx.LocalProtocolError),
    raised("WriteTimeout", "write timeout", httpx.WriteTimeout, True),
    raised("WriteError", "write error", httpx.WriteError, True),
    raised("ReadTimeout", "read timeout", httpx.ReadTimeout, True),
    raised("ReadError", "read error", httpx.ReadError, True),
    raised("RemoteProtocolError", "remote protocol error", httpx.RemoteProtocolError, True),
    raised("ssl.SSLError", "TLS error", ssl.SSLError, True),
    raised("DecodingError", "other httpx error", httpx.DecodingError, True),
    raised("CloseError", "other httpx error", httpx.CloseError, True),
])
def test_an_httpx_error(row, break_first, applied, mode, rqlite, caplog):
    first, second = MockNode(rqlite, "first"), MockNode(rqlite, "second")
    check_case(mode, row, break_first, applied, first, second, rqlite, caplog, client=mock_client(mode, first, second))


# --- Each operation: what its caller sees, and what is left in the queue ---------------------


def test_a_claim_whose_answer_is_lost_leaves_a_lease_that_lapses(mode, nodes, rqlite):
    """SPEC R17: the claim may have leased the head; nobody holds that lease, and the message
    comes back when it lapses, never lost."""
    first, second = nodes
    clock = FakeClock()
    short = set()
    with opened(mode, [first.url, second.url], short, clock=clock, timeout=TIMEOUT) as call:
        call("publish", "g", "e")
        first.arm(hang(applied=True), "/db/execute")
        short.add((first.port, "/db/execute"))
        with pytest.raises(OutcomeUnknownError, match="read timeout.*lapses unheld"):
            call("claim", "w", 10.0)
        assert second.seen == []
    with opened(mode, [second.url], clock=clock) as call:
        assert call("claim", "w", 10.0) is None  # leased by the lost claim
        clock.now += 10.001
        assert call("claim", "w", 10.0).event == "e"


def test_an_open_that_loses_the_leader_while_it_makes_the_tables_waits_for_one_again(mode, nodes, rqlite):
    """An election between the readiness check and the schema (every node answers "leader not
    found", so nothing was changed) is waited out within ``wait``, as a cluster without a
    leader is before it; with no wait left, the open fails with what the nodes said.  Seen on
    the test cluster under load, where an election came in the middle of an example's open."""
    first, second = nodes
    for node in nodes:
        node.arm(reply(503, "leader not found\n"), "/db/query")
    with opened(mode, [first.url, second.url], wait=10.0) as call:
        call("publish", "g", "e")
        assert call("claim", "w", 10.0).event == "e"
    assert [seen for seen in first.seen if seen.startswith("GET")] == ["GET /readyz"] * 2  # ready, then again
    for node in nodes:
        node.arm(reply(503, "leader not found\n"), "/db/query")
    with pytest.raises(StorageError, match="open failed, nothing was changed: no rqlite node took the request"):
        with opened(mode, [first.url, second.url], wait=0):
            pass


@pytest.mark.parametrize("fault, first_ack", [
    (reply(503, "Service Unavailable", applied=True), OutcomeUnknownError),  # a retry would answer False
    (reply(503, "leader not found\n"), True),  # nothing happened: retried on the second node
])
def test_an_ack_through_a_broken_node(fault, first_ack, mode, nodes, rqlite):
    first, second = nodes
    with opened(mode, [second.url]) as call:
        call("publish", "g", "e")
        lease = call("claim", "w", 10.0)
    with opened(mode, [first.url, second.url]) as call:
        first.arm(fault, "/db/execute")
        try:
            answer = call("ack", lease)
        except OutcomeUnknownError:
            answer = OutcomeUnknownError
        assert (answer, call("ack", lease)) == (first_ack, False)
    assert rqlite.events() == []


def test_a_nack_whose_answer_is_lost_is_unknown(mode, nodes, rqlite):
    first, second = nodes
    with opened(mode, [first.url, second.url]) as call:
        call("publish", "g", "e")
        lease = call("claim", "w", 10.0)
        first.arm(close(applied=True), "/db/execute")
        with pytest.raises(OutcomeUnknownError, match="nack at .*remote protocol error"):
            call("nack", lease, 0)
        assert call("claim", "w", 10.0).event == "e"  # the lost nack had freed it


def test_a_claim_whose_returning_rows_are_missing_is_unknown(mode, nodes, rqlite):
    """rqlite runs a statement its parser cannot read but drops its RETURNING rows: that is
    not "nothing to claim"."""
    first, second = nodes
    no_rows = {"results": [{"last_insert_id": 0, "rows_affected": 1}] * 2}
    with opened(mode, [first.url, second.url]) as call:
        call("publish", "g", "e")
        first.arm(results(no_rows, applied=True), "/db/execute")
        with pytest.raises(OutcomeUnknownError, match="unreadable answer.*no rows for"):
            call("claim", "w", 10.0)


def test_a_claim_refused_by_sqlite_leases_nothing(mode, nodes, rqlite):
    first, second = nodes
    with opened(mode, [first.url, second.url]) as call:
        call("publish", "g", "e")
        first.arm(results({"results": [{"error": "database disk image is malformed"}]}), "/db/execute")
        with pytest.raises(StorageError, match="statement error: .*nothing was changed"):
            call("claim", "w", 10.0)
        assert call("claim", "w", 10.0).event == "e"
    assert second.seen == []


def test_a_read_whose_answer_is_lost_at_open_changed_nothing(mode, nodes):
    """The schema plan reads through /db/query: a lost answer there is a StorageError."""
    first, second = nodes
    first.arm(hang(applied=False), "/db/query")
    with pytest.raises(StorageError, match="read timeout.*a read, so nothing was changed"):
        with opened(mode, [first.url, second.url], {(first.port, "/db/query")}, timeout=TIMEOUT):
            pass
    assert second.seen == []


# --- The rqlite version, checked once at open ------------------------------------------------


@pytest.mark.parametrize("version", ["v8.23.0", "v8.30.1", "v8.43.4"])
def test_a_known_version_opens_quietly(version, mode, nodes, rqlite):
    rqlite.version = version
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opened(mode, [nodes[0].url]) as call:
            call("publish", "g", "e")
    assert rqlite.events() == ["e"]


@pytest.mark.parametrize("version", ["v8.22.2", "v7.21.4", "8.0.0"])
def test_a_version_without_returning_is_refused_before_any_write(version, mode, nodes, rqlite):
    rqlite.version = version
    with pytest.raises(StorageError, match=rf"rqlite {version} at http://127.0.0.1:\d+ is too old.*>= 8.23"):
        with opened(mode, [nodes[0].url]):
            pass
    assert nodes[0].seen == ["GET /readyz"]


@pytest.mark.parametrize("version, shown", [("v9.0.0", "rqlite v9.0.0"), ("unknown", "rqlite unknown"),
                                            (None, "no X-RQLITE-VERSION header")])
def test_an_unknown_version_opens_with_a_warning(version, shown, mode, nodes, rqlite):
    rqlite.version = version
    with pytest.warns(UserWarning, match=rf"{shown}.*known for rqlite 8.23.0 to 8.43.4"):
        with opened(mode, [nodes[0].url]) as call:
            call("publish", "g", "e")
    assert rqlite.events() == ["e"]


# --- The client, the table, the docs ---------------------------------------------------------


def test_a_client_passed_in_is_used_and_left_open(mode, rqlite):
    node = MockNode(rqlite, "only")
    client = mock_client(mode, node)
    with opened(mode, [node.url], client=client) as call:
        call("publish", "g", "e")
    assert node.seen[-1] == "POST /db/execute" and rqlite.events() == ["e"]
    assert not client.is_closed
    if mode == "sync":
        client.close()
    else:
        asyncio.run(client.aclose())


def test_a_client_of_the_wrong_kind_is_refused_before_any_request():
    with pytest.raises(TypeError, match="client must be an httpx.Client"):
        RqliteTransport.from_url("http://127.0.0.1:1", client=httpx.AsyncClient())

    async def open_with_a_sync_client():
        await AsyncRqliteTransport.from_url("http://127.0.0.1:1", client=httpx.Client())

    with pytest.raises(TypeError, match="client must be an httpx.AsyncClient"):
        asyncio.run(open_with_a_sync_client())


def test_every_row_is_tested_and_every_failure_has_one_row():
    names = [_name(row) for row in _FAILURES]
    assert len(names) == len(set(names)), "each row has a name of its own"
    assert set(names) == set(EXPECTED), "the spec above and the table list the same failures"
    assert TESTED == set(EXPECTED), f"no case provokes {sorted(set(EXPECTED) - TESTED)}"


def _docs_line(row) -> str:
    match = f"{row.match.__module__.split('.')[0]}.{row.match.__name__}" if isinstance(row.match, type) else row.match
    return f"| `{match.replace('|', chr(92) + '|')}` | {row.outcome} | {row.failure} |"


def test_the_docs_print_the_table_as_it_is():
    text = DOCS.read_text()
    missing = [_docs_line(row) for row in _FAILURES if _docs_line(row) not in text]
    assert not missing, "docs/rqlite-failures.md lacks these rows:\n" + "\n".join(missing)
