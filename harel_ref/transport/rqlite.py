"""RqliteTransport: the queue in an rqlite cluster (SQLite replicated by Raft), over HTTP.

rqlite applies every write through its Raft leader, one at a time, so a transaction sent in
*one* request is as serialized as SQLite's ``BEGIN IMMEDIATE``: picking a group and leasing its
head cannot race with another claim anywhere in the cluster.  This transport leans on that:
**claim, ack and nack are each exactly one HTTP request**, ``POST /db/execute?transaction``
with ``UPDATE/DELETE ... RETURNING`` (rqlite >= 8.23).  The seeds' claim needed three requests
(an UPDATE, a ``level=strong`` read-back by token, then the group's stamp), each one a Raft
round, and a crash between them left a lease without its group stamp.

The claim is one statement (the SQL transports' claim, :mod:`harel_ref.transport._sql`)::

    UPDATE groups SET locked_by = :token, lock_expiry = :now + :visibility,
                      claimable_at = :now + :visibility, last_claimed_at = :now
     WHERE rowid = (<the next claimable group>)
    RETURNING <its head's seq>, group_id, <its head's event>;

sent in one transaction with the promotion of lapsed groups that a claim finding nothing
needs.  The schema's trigger promotes the groups that lapsed, in the same Raft entry; ``_sql``
explains ``claimable_at``, by which a claim never reads a leased or parked group.  ack is the
fenced ``DELETE ... WHERE seq = ? AND <its group's locked_by = :token> RETURNING seq``, whose
trigger frees or drops the group in the same statement, and nack the fenced ``UPDATE groups
... RETURNING``.  The schema, publish, ack, nack and claim are the SQL of
:mod:`harel_ref.transport._sql`, shared with SQLite and libSQL.

``now`` is read from ``clock`` by the client, once per operation, and sent as a parameter: the
nodes' clocks never enter the queue's logic, so tests can drive time exactly.

**Which node.**  Give one URL or several (a list, or one string with commas)::

    RqliteTransport.from_url("http://alice:secret@10.0.0.1:4001,http://10.0.0.2:4001")

Requests go to the first node that answers; writes sent to a follower are forwarded by rqlite
to the leader.  The credentials (HTTP basic auth) are taken out of the URLs and sent as a
header only; they never appear in ``repr``, error messages or logs.

**When a request fails** (SPEC.md R17), the failure is looked up in a table read top to bottom
(``_FAILURES`` here; docs/rqlite-failures.md prints it) and falls in one of three classes:

- *not applied*: provably nothing happened (the connection or TLS handshake failed, so nothing
  was sent; or rqlite answered that it had no leader and ran nothing).  The same request goes
  to the next URL given, once round the list; when no node takes it: :class:`StorageError`.
- *refused*: a definite answer that nothing was changed (SQLite rejected a statement and the
  transaction rolled back, credentials refused, any HTTP 4xx): :class:`StorageError` at once.
- *may have applied*: anything else (a read timeout, a connection or TLS error after the request
  was sent, HTTP 503 without rqlite's "leader not found", any other 5xx or unexpected status,
  an answer that is not the JSON rqlite sends): :class:`OutcomeUnknownError` at once, never
  retried, because a retried publish could append twice and a retried ack would answer False.
  A claim whose answer was lost leaves a lease nobody holds: the message is claimable again
  when the lease lapses, so it is never lost.  (A read, at open, changed nothing whatever
  happened: there this class is a :class:`StorageError`.)

In normal operation every call is exactly one request.

**rqlite versions.**  The answers the table recognises by their text (``leader not found``,
``not leader``, ``store not ready``, ``pool get:``, ``leader address:``, ``SQL rewrite:``) were
read in rqlite's source for every release from 8.23.0 to 8.43.4 (the last 8.x) and are tested
against 8.43.4, the version of the test cluster.  At open the transport reads the version the
ready node reports (its ``X-RQLITE-VERSION`` header) once: older than 8.23, which has no
``RETURNING``, is refused with a :class:`StorageError` naming the version; a version past
8.43.4, or none, opens with a warning.  A text that changed in such a version cannot make a
failure retried: an answer no row recognises falls to *may have applied*.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import ssl
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

import httpx

from ._base import (
    Clock,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_clock,
    default_clock,
)
from ._shell import AsyncShell, Shell, run_steps, run_steps_async, run_steps_within
from ._sql import (
    Plan,
    Statement,
    Tables,
    ack_statement,
    claim_params,
    lease_head_sql,
    nack_statement,
    open_plan,
    promote_lapsed_sql,
    publish_plan,
)

__all__ = ["AsyncRqliteTransport", "RqliteTransport"]

DEFAULT_TIMEOUT = 10.0
"""Seconds one HTTP request may take (connect, each write, each read) before it fails."""

DEFAULT_WAIT = 30.0
"""Seconds ``from_url`` waits for the cluster to have a leader."""


class _NotTaken(StorageError):
    """No node took a request, each provably before applying it: nothing was changed."""

_EXECUTE = "/db/execute?transaction"
_QUERY = "/db/query?level=strong"  # linearizable: served by the leader
_READY = "/readyz"
_VERSION_HEADER = "X-RQLITE-VERSION"
_RETURNING_SINCE = (8, 23, 0)
_KNOWN_VERSIONS = ((8, 23, 0), (8, 43, 4))  # the reply texts of _FAILURES, as in these releases

_log = logging.getLogger(__name__)


# --- Nodes and credentials --------------------------------------------------------------------


@dataclass(frozen=True)
class _Nodes:
    """The nodes' base URLs, with the credentials taken out (they go in the auth header)."""

    urls: tuple[str, ...]
    auth: tuple[str, str] | None

    def __repr__(self) -> str:  # never show the credentials
        return f"_Nodes({list(self.urls)!r}, auth={'yes' if self.auth else 'no'})"


def _parse_urls(url: str | Sequence[str]) -> _Nodes:
    """Split ``url`` (one URL, a comma-separated string, or a list) into bare URLs and auth."""
    if isinstance(url, str):
        given = [part.strip() for part in url.split(",") if part.strip()]
    elif isinstance(url, Iterable) and not isinstance(url, (bytes, bytearray)):
        given = list(url)
    else:
        raise TypeError(f"url must be a str or a list of str, got {type(url).__name__}")
    if not given:
        raise ValueError("url must name at least one rqlite node, e.g. 'http://127.0.0.1:4001'")
    urls, credentials = [], set()
    for item in given:
        if not isinstance(item, str):
            raise TypeError(f"each url must be a str, got {type(item).__name__}")
        parts = urlsplit(item)
        host = parts.hostname or ""
        shown = f"{parts.scheme}://{host}" + (f":{parts.port}" if _port(parts) else "")
        if parts.scheme not in ("http", "https") or not host:
            raise ValueError(f"an rqlite URL is http(s)://[user:password@]host:port, got {shown!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"an rqlite URL takes no query or fragment ({shown!r})")
        if parts.username is not None or parts.password is not None:
            credentials.add((unquote(parts.username or ""), unquote(parts.password or "")))
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        urls.append(f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}")
    if len(credentials) > 1:
        raise ValueError("the URLs carry different credentials; give the same user:password to every node")
    return _Nodes(tuple(urls), credentials.pop() if credentials else None)


def _port(parts) -> int | None:
    try:
        return parts.port
    except ValueError:
        raise ValueError(f"the port of the rqlite URL for host {parts.hostname!r} is not a number") from None


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}: {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value}")
    return float(value)


# --- What to send, and how to read the answer -------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One HTTP request: its statements, and how to turn rqlite's results into the answer.

    ``writes``: the request can change the queue, so a lost answer means the outcome is
    unknown.  A read that lost its answer changed nothing.
    """

    operation: str
    path: str
    statements: list[list[Any]]
    read: Callable[[list[dict[str, Any]]], Any]
    writes: bool = True


@dataclass(frozen=True)
class _Request:
    """One HTTP request for a driver to send: it sends back the response, or the httpx error."""

    method: str
    url: str
    statements: list[list[Any]] | None = None


@dataclass(frozen=True)
class _Sleep:
    """A pause for a driver to take (while waiting for a leader); it sends back None."""

    seconds: float


_Reply = httpx.Response | httpx.HTTPError | ssl.SSLError
_FAILED = (httpx.HTTPError, ssl.SSLError)  # what a request raises when it fails
_Steps = Generator[_Request | _Sleep, Any, Any]
"""A conversation with the cluster: what to send, what came back, and finally the answer."""


# --- When a request fails: the failure classes, as data ---------------------------------------

_NOT_APPLIED = "not applied"  # provably nothing happened: the next node is tried
_MAY_HAVE_APPLIED = "may have applied"  # OutcomeUnknownError (a read: StorageError)
_REFUSED = "refused"  # a definite "no", nothing changed: StorageError, not retried


class _Failure(NamedTuple):
    """One row of :data:`_FAILURES`: what failed, and what that proves."""

    match: type[Exception] | str
    """An exception class (the request got no answer), or a regular expression that the
    whole answer, spelled ``HTTP <status>: <body>`` or ``HTTP 200, <what>: <text>``, matches."""
    outcome: str
    """``_NOT_APPLIED``, ``_MAY_HAVE_APPLIED`` or ``_REFUSED``."""
    failure: str
    """The failure in words, and why it is in its class; error messages quote it."""


_REMOTE = r"(node failed to process \w+ on remote node at \S+: )?"  # a follower forwarding

_FAILURES: tuple[_Failure, ...] = (
    # --- No answer: what httpx raised (an exception matches the first class it is an instance of)
    _Failure(httpx.ConnectTimeout, _NOT_APPLIED,
             "connect timeout: no TCP connection or TLS handshake within the timeout, so nothing was sent"),
    _Failure(httpx.ConnectError, _NOT_APPLIED,
             "connect failed: refused, unreachable, unknown host, or the TLS handshake failed "
             "(certificate, protocol), so nothing was sent"),
    _Failure(httpx.PoolTimeout, _NOT_APPLIED,
             "pool timeout: no free connection in the client's pool, so nothing was sent"),
    _Failure(httpx.ProxyError, _NOT_APPLIED,
             "proxy error: the proxy would not open a tunnel to the node, so nothing was sent"),
    _Failure(httpx.UnsupportedProtocol, _REFUSED,
             "unsupported protocol: httpx cannot send to this URL, so nothing was sent, to any node"),
    _Failure(httpx.LocalProtocolError, _REFUSED,
             "local protocol error: httpx would not write this request, so it was never sent whole"),
    _Failure(httpx.WriteTimeout, _MAY_HAVE_APPLIED,
             "write timeout: time ran out while the request was being sent; what reached the node "
             "is unknown"),
    _Failure(httpx.WriteError, _MAY_HAVE_APPLIED,
             "write error: the connection broke while the request was being sent"),
    _Failure(httpx.ReadTimeout, _MAY_HAVE_APPLIED,
             "read timeout: the request was sent and no answer came in time; the node may be "
             "applying it"),
    _Failure(httpx.ReadError, _MAY_HAVE_APPLIED,
             "read error: the connection broke after the request was sent (reset, or a TLS error "
             "after the handshake)"),
    _Failure(httpx.RemoteProtocolError, _MAY_HAVE_APPLIED,
             "remote protocol error: after the request was sent, the node closed the connection "
             "or answered something that is not HTTP"),
    _Failure(ssl.SSLError, _MAY_HAVE_APPLIED,
             "TLS error: raised as it is, not as an httpx error, by httpx's asyncio backend when "
             "TLS fails after the handshake (encode/httpx#3350), so after the request was sent"),
    _Failure(httpx.HTTPError, _MAY_HAVE_APPLIED,
             "other httpx error: raised after the request was sent (a body that cannot be "
             "decoded, a failed close...)"),
    # --- An answer: HTTP 200 from rqlite ------------------------------------------------------
    _Failure(r"HTTP 200, statement error: .*", _REFUSED,
             "statement error: SQLite rejected a statement and the whole transaction was rolled back"),
    _Failure(rf"HTTP 200, error: {_REMOTE}(not leader|store not open|store not ready)", _NOT_APPLIED,
             "not leader: the node asked, or the leader it forwarded to, was not the leader (or not "
             "open, or not ready) and refused the write before Raft saw it"),
    _Failure(rf"HTTP 200, error: {_REMOTE}pool get: .*", _NOT_APPLIED,
             "leader unreachable: the node could not open a connection to the leader to forward "
             "the request"),
    _Failure(r"HTTP 200, error: .*", _MAY_HAVE_APPLIED,
             "rqlite error: any other error of the store or of forwarding (leadership lost while "
             "committing, an apply timeout, a leader that stopped answering)"),
    _Failure(r"HTTP 200, unreadable: .*", _MAY_HAVE_APPLIED,
             "unreadable answer: not JSON, truncated, or not the results of the statements sent"),
    # --- An answer: any other status ----------------------------------------------------------
    _Failure(r"HTTP 503: leader not found", _NOT_APPLIED,
             "leader not found: the node knows no leader to forward the request to"),
    _Failure(r"HTTP 500: leader address: .*", _NOT_APPLIED,
             "leader address unknown: the node could not look up the leader's address to forward "
             "the request"),
    _Failure(r"HTTP 500: SQL rewrite: .*", _REFUSED,
             "SQL rewrite failed: rqlite could not prepare the statements, so it ran none"),
    _Failure(r"HTTP (401|403): .*", _REFUSED,
             "credentials refused: check the user and password in the URL, and their permissions"),
    _Failure(r"HTTP 4\d\d: .*", _REFUSED,
             "client error: the request was rejected before it ran (malformed, wrong method, too "
             "large...)"),
    _Failure(r"HTTP \d+: .*", _MAY_HAVE_APPLIED,
             "unexpected status: 5xx (a 503 from a proxy too), a 2xx other than 200, a 3xx: rqlite "
             "does not promise it ran nothing"),
)
"""Every failure of one request, first match wins.  See the module's docstring."""


@dataclass(frozen=True)
class _Failed:
    """A request that failed: its row of :data:`_FAILURES`, and the reply in short."""

    row: _Failure
    detail: str


def _classify(reply: _Reply, call: _Call) -> _Failed | list[dict[str, Any]]:
    """The results of ``call`` in a reply, or the failure it is."""
    if isinstance(reply, Exception):
        row = next(row for row in _FAILURES if isinstance(row.match, type) and isinstance(reply, row.match))
        return _Failed(row, _describe(reply))
    answer = _answer(reply.status_code, reply.text, call)
    if not isinstance(answer, str):
        return answer
    row = next(row for row in _FAILURES if isinstance(row.match, str) and re.fullmatch(row.match, answer, re.DOTALL))
    return _Failed(row, answer[:300])


def _answer(status: int, body: str, call: _Call) -> list[dict[str, Any]] | str:
    """The results of ``call``, or the answer spelled as :data:`_FAILURES` reads it."""
    if status != 200:
        return f"HTTP {status}: {body.strip()}"
    try:
        answer = json.loads(body)
    except ValueError:
        return f"HTTP 200, unreadable: not JSON: {body.strip()!r}"
    if not isinstance(answer, dict):
        return f"HTTP 200, unreadable: not a JSON object: {body.strip()!r}"
    if answer.get("error"):  # the store failed, not a statement: no leader, a Raft timeout...
        return f"HTTP 200, error: {answer['error']}"
    results = answer.get("results")
    if not isinstance(results, list) or not all(isinstance(result, dict) for result in results):
        return f"HTTP 200, unreadable: no list of results: {body.strip()!r}"
    for statement, result in zip(call.statements, results):
        if "error" in result:  # rqlite lists no results after the failing statement
            return f"HTTP 200, statement error: {result['error']} in {statement[0][:80]!r}"
    if len(results) != len(call.statements):
        return f"HTTP 200, unreadable: {len(results)} results for {len(call.statements)} statements"
    for statement, result in zip(call.statements, results):
        if " RETURNING " in statement[0] and "columns" not in result:
            # rqlite ran the statement but did not recognize its RETURNING clause.
            return f"HTTP 200, unreadable: no rows for {statement[0][:80]!r}"
    return results


def _describe(exc: Exception) -> str:
    return f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}: {str(exc)[:200] or 'no detail'}"


def _rows(result: dict[str, Any]) -> list[list[Any]]:
    # rqlite leaves "values" out entirely when a query or RETURNING matched no row.
    return result.get("values") or []


def _statements(plan: Plan[Any]) -> list[Statement]:
    """The statements of a plan along its success path, to send them in one request.

    Each statement is answered with 1 ("one row changed"), which is what the plan would see if
    every step succeeded; the transaction itself decides, server-side, what really happens.
    """
    statements: list[Statement] = []

    def succeeded(statement: Statement) -> int:
        statements.append(statement)
        return 1

    run_steps(plan, succeeded)
    return statements


def _plain(statement: Statement) -> list[Any]:
    return [statement.sql, *statement.params]


def _claim_statements(t: Tables, token: str, now: float, visibility: float, min_priority: int,
                      routing_keys: tuple[str, ...] | None) -> list[list[Any]]:
    """The claim of :func:`~harel_ref.transport._sql.claim_statement`, as one transaction: the
    lease, then the promotion of lapsed groups (a no-op after a lease, whose trigger did it;
    the request is sent before its answer is known).  Text comes back whole over rqlite's
    JSON, so the lease returns plain columns."""
    keys = None if routing_keys is None else len(routing_keys)
    return [
        [lease_head_sql(t, keys, text_as_blob=False),
         *claim_params(token, now, visibility, min_priority, routing_keys)],
        [promote_lapsed_sql(t), now],
    ]


class _Cluster:
    """The rqlite core (:mod:`harel_ref.transport._shell`): the nodes and the tables, and every
    decision as generators of :class:`_Request` and :class:`_Sleep` steps.  The drivers
    (``_drive``) only move bytes."""

    def __init__(self, url: str | Sequence[str], prefix: str | None, timeout: float) -> None:
        self.nodes = _parse_urls(url)
        self.tables = Tables.named(prefix)
        self.timeout = _check_seconds("timeout", timeout)
        if self.timeout == 0:
            raise ValueError("timeout must be > 0 seconds")
        self.preferred = 0  # index of the node that answered last; tried first next time

    def options(self) -> dict[str, Any]:
        """Per request, so that a client passed in keeps its own settings for the rest."""
        return {
            "timeout": self.timeout,
            "auth": self.nodes.auth or httpx.USE_CLIENT_DEFAULT,
            "follow_redirects": False,  # a 3xx is a failure to classify, not a place to go
        }

    # --- the operations: each one request -----------------------------------------------------

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> _Steps:
        plan = publish_plan(self.tables, group_id, event, priority, routing_key)
        return self._exchange(_Call("publish", _EXECUTE, [_plain(s) for s in _statements(plan)], lambda results: None))

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> _Steps:
        statements = _claim_statements(self.tables, token, now, visibility, min_priority, routing_keys)

        def read(results):
            rows = _rows(results[0])
            if not rows:
                return None
            seq, group_id, event = rows[0]
            return Lease(group_id, event, seq, token)

        return self._exchange(_Call("claim", _EXECUTE, statements, read))

    def ack(self, lease: Lease, now: float) -> _Steps:
        delete = ack_statement(self.tables, lease)
        return self._exchange(_Call("ack", _EXECUTE, [_plain(delete)], lambda results: bool(_rows(results[0]))))

    def nack(self, lease: Lease, now: float, delay: float) -> _Steps:
        update = nack_statement(self.tables, lease, now, delay)
        return self._exchange(_Call("nack", _EXECUTE, [_plain(update)], lambda results: bool(_rows(results[0]))))

    def _read_call(self, statement: Statement) -> _Call:
        """A read of the schema plan, through the leader."""
        return _Call("open", _QUERY, [_plain(statement)], lambda results: _rows(results[0]), writes=False)

    def _write_call(self, statements: list[Statement]) -> _Call:
        """Writes of the schema plan, in one request (one transaction)."""
        return _Call("open", _EXECUTE, [_plain(s) for s in statements], lambda results: None)

    # --- one request, with failover when it provably did nothing ----------------------------

    def _order(self) -> list[int]:
        n = len(self.nodes.urls)
        return [(self.preferred + i) % n for i in range(n)]

    def _exchange(self, call: _Call) -> _Steps:
        """Send ``call`` to the nodes in turn while it is provably not applied; return its
        answer, or raise what the failure table says."""
        not_applied = []
        for index in self._order():
            node = self.nodes.urls[index]
            reply: _Reply = yield _Request("POST", node + call.path, call.statements)
            outcome = _classify(reply, call)
            if not isinstance(outcome, _Failed):
                self.preferred = index
                return call.read(outcome)
            if outcome.row.outcome != _NOT_APPLIED:
                raise _error(call, node, outcome)
            _log.info("%s at %s: %s (%s); trying the next node", call.operation, node,
                      outcome.row.failure, outcome.detail)
            not_applied.append(f"{node}: {outcome.row.failure} ({outcome.detail})")
        raise _NotTaken(
            f"{call.operation} failed, nothing was changed: no rqlite node took the request "
            f"({'; '.join(not_applied)})"
        )

    # --- opening: a leader, the version, the tables --------------------------------------------

    def opening(self, wait: float) -> _Steps:
        """Wait until a node is ready with a leader, check its version, create the tables.  A
        leader lost while the tables are made (an election: no node took a request, so nothing
        was changed) is waited for again, within the same ``wait``."""
        deadline = time.monotonic() + wait
        while True:
            seen = []
            for node in self.nodes.urls:
                reply = yield _Request("GET", node + _READY)
                if isinstance(reply, Exception):
                    seen.append(f"{node}: {_describe(reply)}")
                elif reply.status_code in (401, 403):
                    raise StorageError(
                        f"rqlite at {node} refused the credentials (HTTP {reply.status_code}); "
                        f"check the user and password in the URL"
                    )
                elif reply.status_code == 200:
                    _check_version(node, reply.headers.get(_VERSION_HEADER))
                    try:
                        yield from self._create_tables()
                        return
                    except _NotTaken as exc:
                        if time.monotonic() >= deadline:
                            raise
                        seen.append(str(exc))
                        break
                else:
                    seen.append(f"{node}: HTTP {reply.status_code} {' '.join(reply.text.split())[:120]!r}")
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"no rqlite node of {list(self.nodes.urls)} was ready with a leader within "
                    f"{wait:g}s ({'; '.join(seen)}); is the cluster running? (`bash .ci/cluster up` "
                    f"starts the test cluster)"
                )
            yield _Sleep(0.2)

    def _create_tables(self) -> _Steps:
        """The schema plan.  Its writes wait, answered None (the plan reads no write's answer),
        and go out together in one request before its next read and at its end: new tables
        cost two requests, not sixteen.  An ``ALTER TABLE`` goes out alone, so that a race to
        add a column is told apart (:func:`_raced_upgrade`)."""
        writes: list[Statement] = []

        def perform(statement: Statement) -> _Steps:
            if statement.fetch:
                yield from self._write_all(writes)
                return (yield from self._exchange(self._read_call(statement)))
            if statement.sql.startswith("ALTER TABLE"):
                yield from self._write_all(writes)
                try:
                    yield from self._exchange(self._write_call([statement]))
                except StorageError as exc:
                    _raced_upgrade(exc)
            else:
                writes.append(statement)
            return None

        yield from run_steps_within(open_plan(self.tables), perform)
        yield from self._write_all(writes)

    def _write_all(self, writes: list[Statement]) -> _Steps:
        """Send the writes waiting, if any, and forget them."""
        if writes:
            yield from self._exchange(self._write_call(writes))
            writes.clear()


def _open(transport: Any, url: str | Sequence[str], clock: Clock, prefix: str | None, timeout: float,
          wait: float, client: Any, client_type: type) -> float:
    """Set up ``transport`` (either twin): its clock, its :class:`_Cluster` core and its client;
    the ``wait`` checked."""
    transport._clock = check_clock(clock)
    transport._core = _Cluster(url, prefix, timeout)
    wait = _check_seconds("wait", wait)
    if client is None:  # no proxies or .netrc credentials picked up behind our back
        transport.client, transport._owns_client = client_type(trust_env=False, verify=_default_tls()), True
    elif isinstance(client, client_type):
        transport.client, transport._owns_client = client, False
    else:
        raise TypeError(
            f"client must be an httpx.{client_type.__name__} (or None for a new one), got "
            f"{type(client).__name__}"
        )
    return wait


def _repr(transport: Any) -> str:
    core = transport._core
    auth = ", with credentials" if core.nodes.auth else ""
    state = ", closed" if transport._closed else ""
    return f"<{type(transport).__name__} [{', '.join(core.nodes.urls)}] tables {core.tables.messages!r}{auth}{state}>"


def _error(call: _Call, node: str, failed: _Failed) -> Exception:
    """What the caller sees for a failure that is not retried (see the module's docstring)."""
    where = f"{call.operation} at {node}: {failed.row.failure} ({failed.detail})"
    if failed.row.outcome == _REFUSED:
        return StorageError(f"{where}; nothing was changed")
    if not call.writes:
        return StorageError(f"{where}; a read, so nothing was changed")
    return OutcomeUnknownError(
        f"{where}; the request may or may not have been applied"
        + (" (a lease taken by it lapses unheld, so the message comes back)" if call.operation == "claim" else "")
    )


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """The TLS settings of the transports' own clients (certifi's CAs, as httpx's default), made
    once: loading the CAs takes a tenth of a second, and transports are opened by the dozen."""
    return httpx.create_ssl_context(trust_env=False)


def _check_version(node: str, reported: str | None) -> None:
    """Refuse an rqlite without RETURNING; warn about one whose answers were not checked."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)\S*", (reported or "").strip())
    version = tuple(int(part) for part in found.groups()) if found else None
    if version is not None and version < _RETURNING_SINCE:
        raise StorageError(
            f"rqlite {reported} at {node} is too old: this transport needs rqlite >= 8.23, whose "
            f"UPDATE ... RETURNING makes a claim one request; upgrade the cluster"
        )
    low, high = _KNOWN_VERSIONS
    if version is None or version > high:
        shown = f"rqlite {reported}" if reported else f"rqlite (no {_VERSION_HEADER} header)"
        warnings.warn(
            f"{shown} at {node}: the failure classes of the rqlite transport are known for rqlite "
            f"{'.'.join(map(str, low))} to {'.'.join(map(str, high))} (docs/rqlite-failures.md); "
            f"an answer it does not recognise is reported as OutcomeUnknownError, never retried",
            stacklevel=4,
        )


def _raced_upgrade(error: StorageError) -> None:
    """The schema plan's reads and writes are separate requests, so two clients opening a table
    of the seeds' schema at once may both send its ``ALTER TABLE ... ADD COLUMN``: the second
    finds the column there.  That is the state it wanted; any other error is raised."""
    if "duplicate column name" not in str(error):
        raise error


# --- The synchronous transport ----------------------------------------------------------------


class RqliteTransport(Shell):
    """The queue in an rqlite cluster, over an ``httpx.Client``.

    - ``url``: ``http(s)://[user:password@]host:port``, or several (list or comma-separated).
    - ``clock``: the time source, read once per claim, ack and nack and sent to rqlite as a parameter.
    - ``prefix``: tables are named ``<prefix>_harel_transport_...``, so several queues (tests,
      tenants) can share one cluster.
    - ``timeout``: seconds per HTTP request (connect, each write, each read, a pooled
      connection); ``wait``: seconds to wait for a leader at open.
    - ``client``: an ``httpx.Client`` to send through, for what the URL cannot say (a private
      CA with ``verify=``, a proxy, event hooks, a ``MockTransport`` in tests).  The transport
      still sets the timeout, the URL's credentials and ``follow_redirects=False`` on each
      request, and does not close a client it was given.  Default: a client of its own, which
      ignores the environment (no proxies or ``.netrc`` credentials behind your back).

    Opening waits until the cluster has a leader, checks the rqlite version (see the module's
    docstring), then creates the tables if they are missing.  ``with`` closes the transport at
    the end of the block.  Use one transport per thread.
    ``client`` is the ``httpx.Client`` in use, for instrumentation (``event_hooks``); it
    replaces the ``requests.Session`` that earlier versions exposed as ``session``.
    """

    client: httpx.Client

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float = DEFAULT_WAIT,
        client: httpx.Client | None = None,
    ) -> None:
        wait = _open(self, url, clock, prefix, timeout, wait, client, httpx.Client)
        try:
            self._drive("open", self._core.opening(wait))
        except BaseException:
            self._close_client()
            raise

    @classmethod
    def from_url(
        cls,
        url: str | Sequence[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float = DEFAULT_WAIT,
        client: httpx.Client | None = None,
    ) -> RqliteTransport:
        """Open the queue at ``url`` once the cluster has a leader (see the class)."""
        return cls(url, clock=clock, prefix=prefix, timeout=timeout, wait=wait, client=client)

    def __repr__(self) -> str:
        return _repr(self)

    def _release(self) -> None:
        self._close_client()

    def _close_client(self) -> None:
        if self._owns_client:
            self.client.close()

    def _drive(self, operation: str, steps: _Steps) -> Any:
        """Carry out the steps: send each request, sleep each pause; return the answer (the
        steps classify every failure themselves)."""
        def perform(step: _Request | _Sleep) -> _Reply | None:
            if isinstance(step, _Sleep):
                return time.sleep(step.seconds)
            try:
                return self.client.request(step.method, step.url, json=step.statements, **self._core.options())
            except _FAILED as exc:
                return exc

        return run_steps(steps, perform)


# --- The asyncio transport --------------------------------------------------------------------


class AsyncRqliteTransport(AsyncShell):
    """The asyncio twin of :class:`RqliteTransport`, over an ``httpx.AsyncClient``.

    Open it with ``await AsyncRqliteTransport.from_url(url, ...)``: the same arguments, with
    ``client`` an ``httpx.AsyncClient``; ``async with`` closes it at the end of the block.
    Each call is one request and holds no state between requests, so tasks may share one
    transport.  ``client`` is the ``httpx.AsyncClient`` in use, for instrumentation
    (``event_hooks``).
    """

    client: httpx.AsyncClient

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("open an AsyncRqliteTransport with `await AsyncRqliteTransport.from_url(url, ...)`")

    @classmethod
    async def from_url(
        cls,
        url: str | Sequence[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float = DEFAULT_WAIT,
        client: httpx.AsyncClient | None = None,
    ) -> AsyncRqliteTransport:
        """Open the queue at ``url`` once the cluster has a leader (see RqliteTransport)."""
        self = cls.__new__(cls)
        wait = _open(self, url, clock, prefix, timeout, wait, client, httpx.AsyncClient)
        try:
            await self._drive("open", self._core.opening(wait))
        except BaseException:
            await self._close_client()
            raise
        return self

    def __repr__(self) -> str:
        return _repr(self)

    async def _release(self) -> None:
        await self._close_client()

    async def _close_client(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def _drive(self, operation: str, steps: _Steps) -> Any:
        """Carry out the steps: send each request, sleep each pause; return the answer."""
        async def perform(step: _Request | _Sleep) -> _Reply | None:
            if isinstance(step, _Sleep):
                return await asyncio.sleep(step.seconds)
            try:
                return await self.client.request(step.method, step.url, json=step.statements, **self._core.options())
            except _FAILED as exc:
                return exc

        return await run_steps_async(steps, perform)
