"""RqliteTransport: the queue in an rqlite cluster (SQLite replicated by Raft), over HTTP.

rqlite applies every write through its Raft leader, one at a time, so a transaction sent in
*one* request is as serialized as SQLite's ``BEGIN IMMEDIATE``: picking a group and leasing its
head cannot race with another claim anywhere in the cluster.  This transport leans on that:
**claim, ack and nack are each exactly one HTTP request**, ``POST /db/execute?transaction``
with ``UPDATE/DELETE ... RETURNING`` (rqlite >= 8.23).  The seeds' claim needed three requests
(an UPDATE, a ``level=strong`` read-back by token, then the group's stamp), each one a Raft
round, and a crash between them left a lease without its group stamp.

The claim, one transaction of two statements::

    UPDATE messages SET locked_by = :token, lock_expiry = :now + :visibility
     WHERE seq = (<the seq of the head of the next claimable group>)
    RETURNING seq, group_id, event;
    UPDATE groups SET last_claimed_at = :now
     WHERE group_id = (SELECT group_id FROM messages WHERE locked_by = :token);

The second statement finds the group *by the token the first one just wrote*: tokens are unique
per claim, so it stamps exactly the group whose head was leased, or nothing when nothing was
claimable.  (Picking the group again by ``last_claimed_at`` would not do: another group stamped
at the same ``now`` may be claimable again and come first.)  A partial index on ``locked_by``
keeps that lookup independent of the backlog.  ack is the fenced ``DELETE ... WHERE seq = ?
AND locked_by = :token RETURNING seq`` plus the group's ``DELETE ... WHERE NOT EXISTS``
(messages); nack is the fenced ``UPDATE ... RETURNING seq``.  The schema, publish, ack and nack
are the SQL of :mod:`harel_ref.transport._sql`, shared with SQLite and libSQL; only the claim's
head query is rqlite's own (see ``_head_query``: rqlite's SQL parser cannot read ``g.rowid``).

``now`` is read from ``clock`` by the client, once per operation, and sent as a parameter: the
nodes' clocks never enter the queue's logic, so tests can drive time exactly.

**Which node.**  Give one URL or several (a list, or one string with commas)::

    RqliteTransport.from_url("http://alice:secret@10.0.0.1:4001,http://10.0.0.2:4001")

Requests go to the first node that answers; writes sent to a follower are forwarded by rqlite
to the leader.  The credentials (HTTP basic auth) are taken out of the URLs and sent as a
header only; they never appear in ``repr``, error messages or logs.

**When a request fails** (SPEC.md, "what a caller can rely on"):

- :class:`StorageError`: nothing happened.  The request never reached a node (connection
  refused, connect timeout), or rqlite refused it before applying it ("leader not found", "not
  leader", a follower that could not connect to the leader to forward it, HTTP 4xx such as
  bad credentials), or SQLite rejected a statement and
  the whole transaction was rolled back (HTTP 200 with ``{"error": ...}`` in a result).
- :class:`OutcomeUnknownError`: the request may have been applied (read timeout, connection
  dropped after sending, a forwarded write whose leader did not answer, Raft leadership lost
  while committing).  A claim whose answer was lost leaves a lease nobody holds: the message is
  claimable again when the lease lapses, so it is never lost.  An ack whose answer was lost
  either removed the message or leaves it to be redelivered (at-least-once).

**Failover** is only for requests that provably did nothing: when a node refuses the
connection, or answers that it has no leader, the same request goes to the next URL given, once
round the list.  Every other failure is raised at once, without retrying, because a retried
claim or ack could act twice.  In normal operation every call is exactly one request.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ._base import (
    ClosedGuard,
    Clock,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_claim_args,
    check_delay,
    check_lease,
    check_publish_args,
    default_clock,
    new_token,
)
from ._sql import Plan, Statement, Tables, ack_plan, nack_plan, open_plan, publish_plan

__all__ = ["AsyncRqliteTransport", "RqliteTransport"]

DEFAULT_TIMEOUT = 10.0
"""Seconds one HTTP request may take (connect, then each read) before it fails."""

DEFAULT_WAIT = 30.0
"""Seconds ``from_url`` waits for the cluster to have a leader."""

_EXECUTE = "/db/execute?transaction"
_QUERY = "/db/query?level=strong"  # linearizable: served by the leader
_READY = "/readyz"

# Answers meaning rqlite refused the write before applying it (service.go, store.go of 8.43):
# no leader known, the node asked is not the leader, or a follower could not even get a
# connection to the leader to forward the request ("pool get: dial tcp: ...").
_NOT_APPLIED = ("leader not found", "not leader", "pool get:")


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
class _Unsent:
    """The request did not reach the node (refused, connect timeout): nothing happened."""

    reason: str


@dataclass(frozen=True)
class _Lost:
    """The request may have reached the node, but its answer did not come back."""

    reason: str


_Reply = tuple[int, str] | _Unsent | _Lost
"""What a driver reports back for one attempt: (HTTP status, body), or how it failed."""


class _NotApplied(Exception):
    """rqlite answered that it refused the request before applying it (no leader)."""


def _rows(result: dict[str, Any]) -> list[list[Any]]:
    # rqlite leaves "values" out entirely when a query or RETURNING matched no row.
    return result.get("values") or []


def _statements(plan: Plan[Any]) -> list[Statement]:
    """The statements of a plan along its success path, to send them in one request.

    Each statement is answered with 1 ("one row changed"), which is what the plan would see if
    every step succeeded; the transaction itself decides, server-side, what really happens.
    """
    statements = []
    try:
        statement = next(plan)
        while True:
            statements.append(statement)
            statement = plan.send(1)
    except StopIteration:
        return statements


def _returning(statement: Statement, columns: str) -> list[Any]:
    return [f"{statement.sql} RETURNING {columns}", *statement.params]


def _plain(statement: Statement) -> list[Any]:
    return [statement.sql, *statement.params]


def _locked_by_index(t: Tables) -> Statement:
    """The claim finds its group by token; this keeps that lookup off a full table scan."""
    return Statement(
        f"CREATE INDEX IF NOT EXISTS {t.messages}_by_locked_by"
        f" ON {t.messages} (locked_by) WHERE locked_by IS NOT NULL"
    )


def _head_query(t: Tables, routing_keys: tuple[str, ...] | None) -> str:
    """The seq of the head of the next claimable group.  Parameters: min_priority, the routing
    keys if any, now.

    The same choice as the SQL transports' ``claim_query`` (claim order: ``last_claimed_at``,
    then arrival), written for rqlite's SQL parser: it does not parse ``g.rowid``, and a
    statement it cannot parse still runs but *without* returning its RETURNING rows.  So the
    arrival order is spelled ``_rowid_`` (SQLite's other name for the rowid).  Text comes back
    whole over rqlite's JSON, so there is no ``CAST(... AS BLOB)`` here.
    """
    routing = ""
    if routing_keys is not None:
        routing = f" AND g.routing_key IN ({', '.join('?' * len(routing_keys))})"
    return (
        f"SELECT m.seq FROM {t.groups} AS g"
        f" JOIN {t.messages} AS m"
        f" ON m.seq = (SELECT MIN(h.seq) FROM {t.messages} AS h WHERE h.group_id = g.group_id)"
        f" WHERE g.priority >= ?{routing}"
        f" AND (m.locked_by IS NULL OR m.lock_expiry < ?)"
        f" ORDER BY g.last_claimed_at, g._rowid_"
        f" LIMIT 1"
    )


def _claim_statements(t: Tables, token: str, now: float, visibility: float, min_priority: int,
                      routing_keys: tuple[str, ...] | None) -> list[list[Any]]:
    return [
        [
            f"UPDATE {t.messages} SET locked_by = ?, lock_expiry = ?"
            f" WHERE seq = ({_head_query(t, routing_keys)})"
            f" RETURNING seq, group_id, event",
            token, now + visibility, min_priority, *(routing_keys or ()), now,
        ],
        [
            f"UPDATE {t.groups} SET last_claimed_at = ?"
            f" WHERE group_id = (SELECT group_id FROM {t.messages} WHERE locked_by = ?)",
            now, token,
        ],
    ]


class _Core(ClosedGuard):
    """What the sync and async transports share: the requests to send and their reading."""

    _nodes: _Nodes
    _tables: Tables
    _clock: Clock
    _timeout: float
    _preferred: int = 0  # index of the node that answered last; tried first next time

    def _setup(self, url: str | Sequence[str], clock: Clock, prefix: str | None, timeout: float,
               wait: float) -> float:
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {clock!r:.80}")
        self._nodes = _parse_urls(url)
        self._tables = Tables.named(prefix)
        self._clock = clock
        self._timeout = _check_seconds("timeout", timeout)
        if self._timeout == 0:
            raise ValueError("timeout must be > 0 seconds")
        return _check_seconds("wait", wait)

    def __repr__(self) -> str:
        nodes = ", ".join(self._nodes.urls)
        auth = ", with credentials" if self._nodes.auth else ""
        state = ", closed" if self._closed else ""
        return f"<{type(self).__name__} [{nodes}] tables {self._tables.messages!r}{auth}{state}>"

    # --- the operations as requests: arguments checked, then the one request built -----------

    def _publish_call(self, group_id: str, event: str, priority: int, routing_key: str | None) -> _Call:
        group_id, event, priority, routing_key = check_publish_args(group_id, event, priority, routing_key)
        self._check_open()
        plan = publish_plan(self._tables, group_id, event, priority, routing_key)
        return _Call("publish", _EXECUTE, [_plain(s) for s in _statements(plan)], lambda results: None)

    def _claim_call(self, worker_id: str, visibility: float, min_priority: int,
                    routing_keys: Iterable[str] | None) -> _Call:
        worker_id, visibility, min_priority, routing_keys = check_claim_args(
            worker_id, visibility, min_priority, routing_keys
        )
        self._check_open()
        token, now = new_token(worker_id), self._clock()
        statements = _claim_statements(self._tables, token, now, visibility, min_priority, routing_keys)

        def read(results):
            rows = _rows(results[0])
            if not rows:
                return None
            seq, group_id, event = rows[0]
            return Lease(group_id, event, seq, token)

        return _Call("claim", _EXECUTE, statements, read)

    def _ack_call(self, lease: Lease) -> _Call:
        lease = check_lease(lease)
        self._check_open()
        delete_message, delete_group = _statements(ack_plan(self._tables, lease))
        # The group DELETE runs whether or not the message was ours: it only removes a group
        # left without messages, and no committed state has such a group.
        statements = [_returning(delete_message, "seq"), _plain(delete_group)]
        return _Call("ack", _EXECUTE, statements, lambda results: bool(_rows(results[0])))

    def _nack_call(self, lease: Lease, delay: float) -> _Call:
        lease = check_lease(lease)
        delay = check_delay(delay)
        self._check_open()
        (update,) = _statements(nack_plan(self._tables, lease, self._clock(), delay))
        return _Call("nack", _EXECUTE, [_returning(update, "seq")], lambda results: bool(_rows(results[0])))

    def _statement_call(self, statement: Statement) -> _Call:
        """One statement of the schema plan: reads through the leader, writes as a write."""
        if statement.fetch:
            return _Call("open", _QUERY, [_plain(statement)], lambda results: _rows(results[0]), writes=False)
        return _Call("open", _EXECUTE, [_plain(statement)], lambda results: results[0].get("rows_affected", 0))

    def _schema_plan(self) -> Plan[None]:
        yield from open_plan(self._tables)
        yield _locked_by_index(self._tables)

    # --- one request, with failover when it provably did nothing ----------------------------

    def _order(self) -> list[int]:
        n = len(self._nodes.urls)
        return [(self._preferred + i) % n for i in range(n)]

    def _exchange(self, call: _Call) -> Generator[str, _Reply, Any]:
        """Yield the URL to POST ``call`` to; be sent the reply; return the answer or raise.

        The drivers (sync, async) only move bytes; every decision is made here.
        """
        refused = []
        for index in self._order():
            node = self._nodes.urls[index]
            reply = yield node + call.path
            if isinstance(reply, _Unsent):
                refused.append(f"{node}: {reply.reason}")
                continue
            if isinstance(reply, _Lost):
                raise self._lost(call, node, reply.reason)
            try:
                answer = self._read(call, node, *reply)
            except _NotApplied as exc:
                refused.append(f"{node}: {exc}")
                continue
            self._preferred = index
            return answer
        raise StorageError(
            f"{call.operation} failed, nothing was changed: no rqlite node took the request "
            f"({'; '.join(refused)})"
        )

    def _lost(self, call: _Call, node: str, reason: str) -> Exception:
        if not call.writes:
            return StorageError(f"{call.operation} failed at {node}: {reason} (a read; nothing was changed)")
        return OutcomeUnknownError(
            f"{call.operation} at {node}: {reason}; the request may or may not have been applied"
            + (" (a lease taken by it lapses unheld, so the message comes back)" if call.operation == "claim" else "")
        )

    def _read(self, call: _Call, node: str, status: int, body: str) -> Any:
        """Map rqlite's HTTP answer to the operation's answer or to an error."""
        text = body.strip()[:300]
        if status in (401, 403):
            raise StorageError(
                f"{call.operation}: rqlite at {node} refused the credentials (HTTP {status}); "
                f"check the user and password in the URL and their permissions"
            )
        if status == 503 or (status != 200 and any(marker in text.lower() for marker in _NOT_APPLIED)):
            raise _NotApplied(f"HTTP {status} {text!r}")
        if status in (502, 504):  # a proxy gave up waiting: the node may have applied it
            raise self._lost(call, node, f"HTTP {status} {text!r}")
        if status != 200:  # rqlite answers other errors before it applies anything
            raise StorageError(f"{call.operation}: rqlite at {node} answered HTTP {status} {text!r}; nothing was changed")
        try:
            answer = json.loads(body)
        except ValueError:
            raise self._lost(call, node, f"an answer that is not JSON: {text!r}") from None
        error = answer.get("error")
        if error:  # the store failed, not a statement: a Raft timeout, a lost leadership...
            if any(marker in error.lower() for marker in _NOT_APPLIED):
                raise _NotApplied(error)
            raise self._lost(call, node, f"rqlite error {error!r}")
        results = answer.get("results") or []
        for statement, result in zip(call.statements, results):
            if "error" in result:
                raise StorageError(
                    f"{call.operation}: rqlite rejected {statement[0][:80]!r}: {result['error']} "
                    f"(the transaction was rolled back; nothing was changed)"
                )
        if len(results) != len(call.statements):
            raise self._lost(call, node, f"{len(results)} results for {len(call.statements)} statements")
        for statement, result in zip(call.statements, results):
            if " RETURNING " in statement[0] and "columns" not in result:
                # rqlite ran the statement but did not recognize its RETURNING clause.
                raise self._lost(call, node, f"rqlite returned no rows for {statement[0][:80]!r}")
        return call.read(results)


# --- The synchronous transport ----------------------------------------------------------------


def _raced_upgrade(statement: Statement, error: StorageError) -> int:
    """The schema plan's statements go out one request each, so two clients opening a table of
    the seeds' schema at once may both send its ``ALTER TABLE ... ADD COLUMN``: the second finds
    the column there.  That is the state it wanted; any other error is raised."""
    if statement.sql.startswith("ALTER TABLE") and "duplicate column name" in str(error):
        return 0
    raise error


class RqliteTransport(_Core):
    """The queue in an rqlite cluster, over a pooled ``requests.Session``.

    - ``url``: ``http(s)://[user:password@]host:port``, or several (list or comma-separated).
    - ``clock``: the time source, read once per operation and sent to rqlite as a parameter.
    - ``prefix``: tables are named ``<prefix>_harel_transport_...``, so several queues (tests,
      tenants) can share one cluster.
    - ``timeout``: seconds per HTTP request; ``wait``: seconds to wait for a leader at open.

    Opening waits until the cluster has a leader, then creates the tables if they are missing.
    Use one transport per thread (``requests.Session`` is not documented as thread-safe).
    ``session`` is the underlying ``requests.Session``, for instrumentation (hooks, adapters).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        clock: Clock = default_clock,
        prefix: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float = DEFAULT_WAIT,
    ) -> None:
        import requests

        wait = self._setup(url, clock, prefix, timeout, wait)
        self._requests = requests
        self.session = requests.Session()
        self.session.auth = self._nodes.auth
        self.session.trust_env = False  # no proxies or .netrc credentials picked up behind our back
        try:
            self._wait_for_leader(wait)
            self._run_plan(self._schema_plan())
        except BaseException:
            self.session.close()
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
    ) -> RqliteTransport:
        """Open the queue at ``url`` once the cluster has a leader (see the class)."""
        return cls(url, clock=clock, prefix=prefix, timeout=timeout, wait=wait)

    def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        self._send(self._publish_call(group_id, event, priority, routing_key))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0,
              routing_keys: Iterable[str] | None = None) -> Lease | None:
        return self._send(self._claim_call(worker_id, visibility, min_priority, routing_keys))

    def ack(self, lease: Lease) -> bool:
        return self._send(self._ack_call(lease))

    def nack(self, lease: Lease, delay: float = 0) -> bool:
        return self._send(self._nack_call(lease, delay))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.session.close()

    # --- HTTP -------------------------------------------------------------------------------

    def _send(self, call: _Call) -> Any:
        exchange = self._exchange(call)
        url = next(exchange)
        while True:
            try:
                response = self.session.post(url, json=call.statements, timeout=self._timeout)
                reply: _Reply = (response.status_code, response.text)
            except self._requests.RequestException as exc:
                reply = _requests_failure(self._requests, exc)
            try:
                url = exchange.send(reply)
            except StopIteration as done:
                return done.value

    def _run_plan(self, plan: Plan[Any]) -> None:
        answer = None
        try:
            while True:
                statement = plan.send(answer)
                try:
                    answer = self._send(self._statement_call(statement))
                except StorageError as exc:
                    answer = _raced_upgrade(statement, exc)
        except StopIteration:
            return

    def _wait_for_leader(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        while True:
            seen = []
            for node in self._nodes.urls:
                try:
                    response = self.session.get(node + _READY, timeout=self._timeout)
                except self._requests.RequestException as exc:
                    seen.append(f"{node}: {_requests_failure(self._requests, exc).reason}")
                    continue
                if _ready(node, response.status_code, response.text, seen):
                    return
            if time.monotonic() >= deadline:
                raise _no_leader(self._nodes, wait, seen)
            time.sleep(0.2)


def _requests_failure(requests: Any, exc: Exception) -> _Unsent | _Lost:
    """Did a failed ``requests`` call reach the node?  Only a failed connect surely did not."""
    import urllib3.exceptions

    reason = _describe(exc)
    if isinstance(exc, (requests.ConnectTimeout, requests.exceptions.SSLError)):
        return _Unsent(reason)
    if isinstance(exc, requests.ConnectionError):
        cause = exc.args[0] if exc.args else None
        # NewConnectionError (refused, unreachable) is a ConnectTimeoutError in urllib3 2.
        if isinstance(getattr(cause, "reason", None), urllib3.exceptions.ConnectTimeoutError):
            return _Unsent(reason)
    return _Lost(reason)


def _describe(exc: Exception) -> str:
    """A short reason for a failed ``requests`` call: urllib3's own reason when there is one."""
    cause = getattr(exc.args[0], "reason", None) if exc.args else None
    return f"{type(exc).__name__}: {str(cause or exc)[:200]}"


def _ready(node: str, status: int, body: str, seen: list[str]) -> bool:
    if status in (401, 403):
        raise StorageError(
            f"rqlite at {node} refused the credentials (HTTP {status}); check the user and "
            f"password in the URL"
        )
    if status == 200:
        return True
    seen.append(f"{node}: HTTP {status} {' '.join(body.split())[:120]!r}")
    return False


def _no_leader(nodes: _Nodes, wait: float, seen: list[str]) -> StorageError:
    return StorageError(
        f"no rqlite node of {list(nodes.urls)} was ready with a leader within {wait:g}s "
        f"({'; '.join(seen)}); is the cluster running? (`bash .ci/cluster up` starts the "
        f"test cluster)"
    )


# --- The asyncio transport --------------------------------------------------------------------


class AsyncRqliteTransport(_Core):
    """The asyncio twin of :class:`RqliteTransport`, over one ``httpx.AsyncClient``.

    Open it with ``await AsyncRqliteTransport.from_url(url, ...)`` (same arguments).  Each call
    is one request and holds no state between requests, so tasks may share one transport.
    ``client`` is the underlying ``httpx.AsyncClient``, for instrumentation (event hooks).
    """

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
    ) -> AsyncRqliteTransport:
        """Open the queue at ``url`` once the cluster has a leader (see RqliteTransport)."""
        import httpx

        self = cls.__new__(cls)
        wait = self._setup(url, clock, prefix, timeout, wait)
        self._httpx = httpx
        self.client = httpx.AsyncClient(auth=self._nodes.auth, timeout=self._timeout, trust_env=False)
        try:
            await self._wait_for_leader(wait)
            await self._run_plan(self._schema_plan())
        except BaseException:
            await self.client.aclose()
            raise
        return self

    async def publish(self, group_id: str, event: str, priority: int = 0, routing_key: str | None = None) -> None:
        await self._send(self._publish_call(group_id, event, priority, routing_key))

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0,
                    routing_keys: Iterable[str] | None = None) -> Lease | None:
        return await self._send(self._claim_call(worker_id, visibility, min_priority, routing_keys))

    async def ack(self, lease: Lease) -> bool:
        return await self._send(self._ack_call(lease))

    async def nack(self, lease: Lease, delay: float = 0) -> bool:
        return await self._send(self._nack_call(lease, delay))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.client.aclose()

    # --- HTTP -------------------------------------------------------------------------------

    async def _send(self, call: _Call) -> Any:
        exchange = self._exchange(call)
        url = next(exchange)
        while True:
            try:
                response = await self.client.post(url, json=call.statements)
                reply: _Reply = (response.status_code, response.text)
            except self._httpx.HTTPError as exc:
                reply = _httpx_failure(self._httpx, exc)
            try:
                url = exchange.send(reply)
            except StopIteration as done:
                return done.value

    async def _run_plan(self, plan: Plan[Any]) -> None:
        answer = None
        try:
            while True:
                statement = plan.send(answer)
                try:
                    answer = await self._send(self._statement_call(statement))
                except StorageError as exc:
                    answer = _raced_upgrade(statement, exc)
        except StopIteration:
            return

    async def _wait_for_leader(self, wait: float) -> None:
        import asyncio

        deadline = time.monotonic() + wait
        while True:
            seen = []
            for node in self._nodes.urls:
                try:
                    response = await self.client.get(node + _READY)
                except self._httpx.HTTPError as exc:
                    seen.append(f"{node}: {_httpx_failure(self._httpx, exc).reason}")
                    continue
                if _ready(node, response.status_code, response.text, seen):
                    return
            if time.monotonic() >= deadline:
                raise _no_leader(self._nodes, wait, seen)
            await asyncio.sleep(0.2)


def _httpx_failure(httpx: Any, exc: Exception) -> _Unsent | _Lost:
    """Did a failed httpx call reach the node?  Only a failed connect (or no free connection
    in the pool) surely did not."""
    reason = f"{type(exc).__name__}: {str(exc)[:200] or 'no detail'}"
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return _Unsent(reason)
    return _Lost(reason)

