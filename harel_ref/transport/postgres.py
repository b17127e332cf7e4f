"""PostgresTransport: the queue in PostgreSQL tables, claimed with ``FOR UPDATE SKIP LOCKED``,
and its asyncio twin (psycopg 3; the twin draws connections from a psycopg_pool pool).

**Design** (the seeds' ``transport-postgres.md``, fenced like the other references):

- ``<p>harel_transport_messages(seq BIGSERIAL, group_id, event)`` is the FIFO;
  ``<p>harel_transport_groups`` holds one row per group with messages, carrying its lease:
  ``locked_by`` (the claim's token, ``'__parked__'``, or NULL when free), ``lock_expiry`` (the end
  of the lease or park), ``leased_seq`` (the message leased), ``priority``, ``routing_key``,
  ``last_claimed_at`` (the fairness stamp) and ``arrival`` (a sequence: the arrival order).
- Every operation is **one round trip**: a server-side PL/pgSQL function (publish, claim, ack)
  or one ``UPDATE`` (nack), run in autocommit, so each is its own transaction.  ``now`` comes
  from the injected clock as a parameter: the server's clock is never read.
- **Fairness is stamped on ack** (SPEC R5 ``"ack"``, as upstream): a successful ack that leaves
  messages in the group sets ``last_claimed_at = now``; claims and nacks do not stamp.
- **Claim** locks its group row with ``FOR UPDATE SKIP LOCKED``, so concurrent claimers take
  different groups and never wait on one another.  It reads two candidates on partial indexes:
  the first *free* group in claim order (``(last_claimed_at, arrival) WHERE locked_by IS
  NULL``), and the first group whose lease or park *lapsed* (``lock_expiry WHERE locked_by IS NOT
  NULL``, the range ``< now``, usually empty).  Leased and parked groups are never walked, so a
  claim costs the same behind any number of them.
- **SKIP LOCKED can skip a claimable group** that another transaction has locked for a moment
  (a publish into it, an ack of its lapsed lease, a claimer that looked at it).  Answering None
  then would be a lie (R19).  So when it finds nothing unlocked, the claim looks once more
  without locking (one snapshot, one moment) and answers None only if that shows nothing
  claimable; otherwise it waits for a claimable group's lock, lets go of it at once (a
  rolled-back block, so a waiting claimer holds no lock another waits on) and looks again.
  Claimers wait on one another only when nothing else is claimable.
- **Publish** locks its group row (creating it if needed) *before* it takes its seq, so the
  messages of a group get their seqs in the order they commit (R1), and an ack that finds the
  group drained and deletes it never races a publish into it.
- Text (group ids, events, routing keys, tokens) is stored as ``bytea`` (UTF-8): Postgres
  ``text`` cannot hold a NUL character, which R1 allows in events.
- **Fencing** (R10): ack and nack act only when ``locked_by`` is the lease's token and
  ``leased_seq`` its seq.

**Names.**  ``prefix`` works as for SQLite (``<prefix>_harel_transport_...``); Postgres folds
names to lower case, so the prefix is lower-cased, and it may have at most 29 characters (the
longest name built from it must fit Postgres's 63).  The functions are
``<p>harel_transport_publish``, ``_claim`` and ``_ack``.

**Upgrade from harel's layout** (``harel_transport_messages``/``_groups`` of the ``harel``
package, with ``text`` columns and the stamp kept in ``lock_expiry``): opening such tables
converts them in place, in one transaction: text becomes ``bytea``; a free group's
``lock_expiry`` becomes its ``last_claimed_at``; a held group keeps its token and expiry, its head
becomes ``leased_seq`` (harel parks keep the token too, so a harel park becomes a lease of that
token); groups without messages are dropped; harel's claim-order index is replaced.  harel's
own functions (``harel_claim``, ``harel_ack``) are left in place but no longer work on the
converted tables (they compare ``text`` with ``bytea`` and fail): stop harel's workers first.

**Errors** (R17): a server that cannot be reached, or that refuses a statement, raises
:class:`StorageError` (nothing happened).  A connection lost while a call was under way raises
:class:`OutcomeUnknownError` (it may or may not have committed); the next call connects again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._base import (
    PARKED,
    ClockError,
    Clock,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_clock,
    default_clock,
    without_password,
)
from ._shell import AsyncShell, Shell, Steps, T, run_steps, run_steps_async
from ._sql import Plan, Statement, Tables

__all__ = ["AsyncPostgresTransport", "PostgresTransport", "PgNames", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
"""Version 1: the layout above.  harel's layout (no meta table) is upgraded to it in place."""

_MAX_NAME = 63  # Postgres cuts longer identifiers silently, and cut names could collide


@dataclass(frozen=True)
class PgNames:
    """The names of one queue's tables, indexes and functions (validated, lower case)."""

    messages: str
    groups: str
    meta: str

    @classmethod
    def named(cls, prefix: str | None = None) -> PgNames:
        tables = Tables.named(prefix.lower() if isinstance(prefix, str) else prefix)
        names = cls(tables.messages, tables.groups, tables.meta)
        longest = max(names.all(), key=len)
        if len(longest) > _MAX_NAME:
            raise ValueError(
                f"prefix {prefix!r} is too long for Postgres: {longest!r} would have "
                f"{len(longest)} characters, more than {_MAX_NAME} (use at most 29)"
            )
        return names

    def all(self) -> list[str]:
        return [self.messages, self.groups, self.meta, self.messages_by_group, self.free, self.free_by_key,
                self.held, self.publish, self.claim, self.ack]

    @property
    def messages_by_group(self) -> str:
        return f"{self.messages}_by_group"

    @property
    def free(self) -> str:
        return f"{self.groups}_free"

    @property
    def free_by_key(self) -> str:
        return f"{self.groups}_free_by_key"

    @property
    def held(self) -> str:
        return f"{self.groups}_held"

    @property
    def publish(self) -> str:
        return f"{self.groups.removesuffix('_groups')}_publish"

    @property
    def claim(self) -> str:
        return f"{self.groups.removesuffix('_groups')}_claim"

    @property
    def ack(self) -> str:
        return f"{self.groups.removesuffix('_groups')}_ack"


# --- Schema ---------------------------------------------------------------------------------


def open_plan(n: PgNames) -> Plan[None]:
    """Create the tables and functions, or upgrade harel's tables.  Run in one transaction;
    the advisory lock keeps two processes opening at once from both creating."""
    yield Statement("SELECT pg_advisory_xact_lock(hashtext(%s))", (n.groups,))
    rows = yield Statement("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                           (n.meta, n.groups), fetch=True)
    has_meta, has_groups = rows[0]
    version = None
    if has_meta:
        rows = yield Statement(f"SELECT value FROM {n.meta} WHERE key = 'schema_version'", fetch=True)
        version = rows[0][0] if rows else None
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(
            f"the tables {n.messages}/{n.groups} are at schema version {version}, newer than this "
            f"harel-ref knows ({SCHEMA_VERSION}); upgrade harel-ref"
        )
    if has_groups:
        yield from _upgrade_harel_layout(n)
    else:
        yield Statement(f"CREATE TABLE {n.messages} (seq BIGSERIAL PRIMARY KEY,"
                        f" group_id BYTEA NOT NULL, event BYTEA NOT NULL)")
        yield Statement(
            f"CREATE TABLE {n.groups} ("
            " group_id BYTEA PRIMARY KEY,"
            " locked_by BYTEA,"  # the lease's token, '__parked__', or NULL when free
            " lock_expiry DOUBLE PRECISION,"  # the end of the lease or park
            " leased_seq BIGINT,"  # the message the lease holds
            " priority INT NOT NULL DEFAULT 0,"
            " routing_key BYTEA,"
            " last_claimed_at DOUBLE PRECISION NOT NULL DEFAULT 0,"  # stamped on ack (R5)
            " arrival BIGSERIAL)"  # the arrival order (R4, R11)
        )
    yield Statement(f"CREATE TABLE IF NOT EXISTS {n.meta} (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
    yield Statement(f"CREATE INDEX IF NOT EXISTS {n.messages_by_group} ON {n.messages} (group_id, seq)")
    yield Statement(f"CREATE INDEX IF NOT EXISTS {n.free} ON {n.groups} (last_claimed_at, arrival)"
                    f" WHERE locked_by IS NULL")
    yield Statement(f"CREATE INDEX IF NOT EXISTS {n.free_by_key} ON {n.groups} (routing_key, last_claimed_at, arrival)"
                    f" WHERE locked_by IS NULL AND routing_key IS NOT NULL")
    yield Statement(f"CREATE INDEX IF NOT EXISTS {n.held} ON {n.groups} (lock_expiry) WHERE locked_by IS NOT NULL")
    for function in _functions(n):
        yield Statement(function)
    yield Statement(f"INSERT INTO {n.meta} (key, value) VALUES ('schema_version', %s)"
                    f" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (SCHEMA_VERSION,))


def _upgrade_harel_layout(n: PgNames) -> Plan[None]:
    """harel's tables (text columns, the fairness stamp in a free group's lock_expiry) to ours."""
    utf8 = "convert_to({0}, 'UTF8')"
    yield Statement(f"ALTER TABLE {n.messages} ALTER COLUMN group_id TYPE BYTEA USING {utf8.format('group_id')},"
                    f" ALTER COLUMN event TYPE BYTEA USING {utf8.format('event')}")
    yield Statement(
        f"ALTER TABLE {n.groups} ALTER COLUMN group_id TYPE BYTEA USING {utf8.format('group_id')},"
        f" ALTER COLUMN locked_by TYPE BYTEA USING {utf8.format('locked_by')},"
        " ADD COLUMN leased_seq BIGINT, ADD COLUMN routing_key BYTEA,"
        " ADD COLUMN last_claimed_at DOUBLE PRECISION NOT NULL DEFAULT 0, ADD COLUMN arrival BIGSERIAL"
    )
    yield Statement(f"DELETE FROM {n.groups} g WHERE NOT EXISTS"
                    f" (SELECT 1 FROM {n.messages} m WHERE m.group_id = g.group_id)")
    yield Statement(f"UPDATE {n.groups} SET last_claimed_at = COALESCE(lock_expiry, 0), lock_expiry = NULL"
                    f" WHERE locked_by IS NULL")
    yield Statement(f"UPDATE {n.groups} g SET leased_seq = (SELECT min(m.seq) FROM {n.messages} m"
                    f" WHERE m.group_id = g.group_id) WHERE locked_by IS NOT NULL")
    yield Statement(f"DROP INDEX IF EXISTS {n.groups}_claim_order")
    yield Statement(f"DROP INDEX IF EXISTS {n.groups}_claimable")


def _fits(alias: str) -> str:
    """The claim's filter on a group row ``alias``: its priority and routing key (R4)."""
    return f"{alias}.priority >= p_min_priority AND (p_keys IS NULL OR {alias}.routing_key = ANY (p_keys))"


def _functions(n: PgNames) -> list[str]:
    # Columns are qualified everywhere: a RETURNS TABLE function's output names are variables.
    return [
        f"""CREATE OR REPLACE FUNCTION {n.publish}(p_group BYTEA, p_event BYTEA, p_priority INT, p_key BYTEA)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  -- Lock the group row first (creating it, or a no-op update that locks it), then take the
  -- seq: a group's seqs then follow the order its publishes commit in, and an ack that finds
  -- the group drained waits for this publish (or this publish recreates the group).
  INSERT INTO {n.groups} AS g (group_id, priority, routing_key) VALUES (p_group, p_priority, p_key)
    ON CONFLICT (group_id) DO UPDATE SET priority = g.priority;
  INSERT INTO {n.messages} (group_id, event) VALUES (p_group, p_event);
END $fn$""",
        f"""CREATE OR REPLACE FUNCTION {n.claim}(p_now DOUBLE PRECISION, p_until DOUBLE PRECISION, p_token BYTEA,
                                     p_min_priority INT, p_keys BYTEA[])
RETURNS TABLE (seq BIGINT, group_id BYTEA, event BYTEA) LANGUAGE plpgsql AS $fn$
DECLARE
  lapsed BYTEA; lapsed_stamp DOUBLE PRECISION; lapsed_arrival BIGINT;
  chosen BYTEA; head BIGINT;
BEGIN
  LOOP
    -- The first group whose lease or park lapsed (on the held index, a range usually empty).
    SELECT l.group_id, l.last_claimed_at, l.arrival INTO lapsed, lapsed_stamp, lapsed_arrival
      FROM {n.groups} l
      WHERE l.locked_by IS NOT NULL AND l.lock_expiry < p_now AND {_fits('l')}
      ORDER BY l.last_claimed_at, l.arrival LIMIT 1 FOR UPDATE SKIP LOCKED;
    -- The first free group in claim order, if it comes before that one.
    IF p_keys IS NULL THEN
      SELECT f.group_id INTO chosen FROM {n.groups} f
        WHERE f.locked_by IS NULL AND f.priority >= p_min_priority
          AND (f.last_claimed_at, f.arrival) < (COALESCE(lapsed_stamp, 'Infinity'), COALESCE(lapsed_arrival, 0))
        ORDER BY f.last_claimed_at, f.arrival LIMIT 1 FOR UPDATE SKIP LOCKED;
    ELSE
      SELECT f.group_id INTO chosen FROM {n.groups} f
        WHERE f.locked_by IS NULL AND f.routing_key = ANY (p_keys) AND f.priority >= p_min_priority
          AND (f.last_claimed_at, f.arrival) < (COALESCE(lapsed_stamp, 'Infinity'), COALESCE(lapsed_arrival, 0))
        ORDER BY f.last_claimed_at, f.arrival LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    chosen := COALESCE(chosen, lapsed);
    IF chosen IS NULL THEN
      -- Nothing claimable that no one has locked.  None is the answer only if nothing is
      -- claimable at all, as seen at one moment: one snapshot, no lock (R19).
      PERFORM 1 FROM {n.groups} w WHERE w.locked_by IS NULL AND {_fits('w')} LIMIT 1;
      IF NOT FOUND THEN
        PERFORM 1 FROM {n.groups} w
          WHERE w.locked_by IS NOT NULL AND w.lock_expiry < p_now AND {_fits('w')} LIMIT 1;
        IF NOT FOUND THEN RETURN; END IF;
      END IF;
      -- A claimable group is locked by someone (a publish, an ack of a lapsed lease, another
      -- claimer): wait for that lock, then look again.  The block is rolled back on purpose,
      -- so the lock it got goes at once: a claimer that waits holds no lock another waits on.
      BEGIN
        PERFORM 1 FROM {n.groups} w WHERE w.locked_by IS NULL AND {_fits('w')} LIMIT 1 FOR UPDATE;
        IF NOT FOUND THEN
          PERFORM 1 FROM {n.groups} w
            WHERE w.locked_by IS NOT NULL AND w.lock_expiry < p_now AND {_fits('w')} LIMIT 1 FOR UPDATE;
        END IF;
        RAISE SQLSTATE 'HR000';
      EXCEPTION WHEN SQLSTATE 'HR000' THEN NULL;
      END;
      CONTINUE;
    END IF;
    SELECT min(m.seq) INTO head FROM {n.messages} m WHERE m.group_id = chosen;
    IF head IS NULL THEN  -- a group without messages (left by harel's layout): drop it
      DELETE FROM {n.groups} d WHERE d.group_id = chosen;
      CONTINUE;
    END IF;
    UPDATE {n.groups} u SET locked_by = p_token, lock_expiry = p_until, leased_seq = head
      WHERE u.group_id = chosen;
    RETURN QUERY SELECT m.seq, m.group_id, m.event FROM {n.messages} m WHERE m.seq = head;
    RETURN;
  END LOOP;
END $fn$""",
        f"""CREATE OR REPLACE FUNCTION {n.ack}(p_group BYTEA, p_seq BIGINT, p_token BYTEA, p_now DOUBLE PRECISION)
RETURNS BOOLEAN LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM 1 FROM {n.groups} g
    WHERE g.group_id = p_group AND g.locked_by = p_token AND g.leased_seq = p_seq FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;  -- not held under this lease (R10)
  DELETE FROM {n.messages} m WHERE m.seq = p_seq;
  IF EXISTS (SELECT 1 FROM {n.messages} m WHERE m.group_id = p_group) THEN
    UPDATE {n.groups} g SET locked_by = NULL, lock_expiry = NULL, leased_seq = NULL, last_claimed_at = p_now
      WHERE g.group_id = p_group;  -- free, and stamped: fairness on ack (R5)
  ELSE
    DELETE FROM {n.groups} g WHERE g.group_id = p_group;  -- its last message (R11)
  END IF;
  RETURN true;
END $fn$""",
    ]


# --- Operations: one statement each, shared by the sync and async transports -----------------


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")


def publish_statement(n: PgNames, group_id: str, event: str, priority: int, routing_key: str | None) -> Statement:
    key = None if routing_key is None else _utf8(routing_key)
    return Statement(f"SELECT {n.publish}(%s, %s, %s, %s)", (_utf8(group_id), _utf8(event), priority, key))


def claim_statement(n: PgNames, token: str, now: float, visibility: float, min_priority: int,
                    routing_keys: tuple[str, ...] | None) -> Statement:
    keys = None if routing_keys is None else [_utf8(key) for key in routing_keys]
    return Statement(f"SELECT seq, group_id, event FROM {n.claim}(%s, %s, %s, %s, %s)",
                     (now, now + visibility, _utf8(token), min_priority, keys), True)


def claimed(rows: list[Any], token: str) -> Lease | None:
    if not rows:
        return None
    seq, group_id, event = rows[0]
    return Lease(bytes(group_id).decode("utf-8"), bytes(event).decode("utf-8"), seq, token)


def ack_statement(n: PgNames, lease: Lease, now: float) -> Statement:
    return Statement(f"SELECT {n.ack}(%s, %s, %s, %s)",
                     (_utf8(lease.group_id), lease.seq, _utf8(lease.token), now), True)


def nack_statement(n: PgNames, lease: Lease, now: float, delay: float) -> Statement:
    holder, until = (None, None) if delay == 0 else (_utf8(PARKED), now + delay)
    return Statement(
        f"UPDATE {n.groups} SET locked_by = %s, lock_expiry = %s, leased_seq = NULL"
        f" WHERE group_id = %s AND locked_by = %s AND leased_seq = %s RETURNING true",
        (holder, until, _utf8(lease.group_id), _utf8(lease.token), lease.seq), True,
    )


def answered_true(rows: list[Any]) -> bool:
    """An ack's or nack's rows: True when it acted."""
    return bool(rows) and bool(rows[0][0])


class PgCore:
    """The four operations as steps (:mod:`harel_ref.transport._shell`): one statement each, a
    call of the queue's functions or an UPDATE, which Postgres makes atomic on its own."""

    def __init__(self, names: PgNames) -> None:
        self.names = names

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Plan[None]:
        yield publish_statement(self.names, group_id, event, priority, routing_key)

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Plan[Lease | None]:
        return claimed((yield claim_statement(self.names, token, now, visibility, min_priority, routing_keys)), token)

    def ack(self, lease: Lease, now: float) -> Plan[bool]:
        return answered_true((yield ack_statement(self.names, lease, now)))

    def nack(self, lease: Lease, now: float, delay: float) -> Plan[bool]:
        return answered_true((yield nack_statement(self.names, lease, now, delay)))


# --- Errors ---------------------------------------------------------------------------------




@contextmanager
def _errors(url: str, operation: str, connection_lost) -> Iterator[None]:
    """psycopg's errors as R17 says: StorageError when the server refused or could not be
    reached (nothing happened), OutcomeUnknownError when the connection was lost mid-call."""
    import psycopg
    import psycopg_pool

    try:
        yield
    except (StorageError, ClockError, OutcomeUnknownError):
        raise
    except psycopg_pool.PoolTimeout as exc:
        raise StorageError(f"{operation} on {without_password(url)} failed: no connection to the server ({exc})") from exc
    except psycopg.Error as exc:
        if connection_lost():
            raise OutcomeUnknownError(
                f"{operation} on {without_password(url)}: the connection was lost during the call ({exc}); "
                "it may or may not have taken effect (SPEC R17)"
            ) from exc
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc


def _connect_error(url: str, exc: BaseException) -> StorageError:
    return StorageError(f"cannot connect to Postgres at {without_password(url)}: {exc} (is the server up?)")


# --- The transports -------------------------------------------------------------------------


class PostgresTransport(Shell):
    """The queue in Postgres at ``url`` (a libpq URL or conninfo string).  Thread-safe: one
    connection, in autocommit, behind one lock.  A lost connection is opened again by the next
    call.

    - ``clock``: the time source, read once per claim, ack and nack (tests pass a fake one).
    - ``prefix``: tables are named ``<prefix>_harel_transport_...``.
    - ``connect_timeout``: seconds to wait for the server when connecting.
    """

    def __init__(self, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                 connect_timeout: float = 10.0) -> None:
        import psycopg

        self._names = PgNames.named(prefix)
        self._core = PgCore(self._names)
        self._clock = check_clock(clock)
        self.url = url
        self._connect_timeout = connect_timeout
        self._lock = self._serial = threading.Lock()
        self._conn: psycopg.Connection | None = None
        with self._lock:
            conn = self._connection()
            try:
                with _errors(url, "open", lambda: conn.broken):
                    with conn.transaction():
                        _run_plan(conn, open_plan(self._names))
            except BaseException:
                conn.close()
                raise

    def _connection(self):
        import psycopg

        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)))
            except psycopg.Error as exc:
                raise _connect_error(self.url, exc) from exc
        return self._conn

    def _drive(self, operation: str, steps: Steps[T]) -> T:
        conn = self._connection()
        with _errors(self.url, operation, lambda: conn.broken or conn.closed):
            return _run_plan(conn, steps)

    def _release(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<PostgresTransport {without_password(self.url)} tables {self._names.messages!r}{state}>"


def _run_plan(conn: Any, plan: Plan[T]) -> T:
    """Run ``plan`` on a psycopg connection, statement by statement; its result."""
    def perform(statement: Statement) -> Any:
        cursor = conn.execute(statement.sql, statement.params)
        return cursor.fetchall() if statement.fetch else None

    return run_steps(plan, perform)


async def _run_plan_async(conn: Any, plan: Plan[T]) -> T:
    """:func:`_run_plan` on a psycopg ``AsyncConnection``."""
    async def perform(statement: Statement) -> Any:
        cursor = await conn.execute(statement.sql, statement.params)
        return await cursor.fetchall() if statement.fetch else None

    return await run_steps_async(plan, perform)


class AsyncPostgresTransport(AsyncShell):
    """The asyncio twin of :class:`PostgresTransport`, over a psycopg_pool
    ``AsyncConnectionPool``: concurrent calls run on their own connections, so concurrent
    claims of one transport run in parallel on the server.

    Build it with ``await AsyncPostgresTransport.create(url, ...)``; ``max_connections`` bounds
    the pool.  A connection lost mid-call is dropped from the pool (the pool opens another).
    """

    def __init__(self, pool: Any, url: str, names: PgNames, clock: Clock) -> None:
        # Use create(); __init__ only stores what create() prepared.
        self._pool = pool
        self.url = url
        self._names = names
        self._core = PgCore(names)
        self._clock = clock

    @classmethod
    async def create(cls, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                     connect_timeout: float = 10.0, max_connections: int = 10) -> AsyncPostgresTransport:
        import psycopg
        import psycopg_pool

        names = PgNames.named(prefix)
        clock = check_clock(clock)
        pool = psycopg_pool.AsyncConnectionPool(
            url, min_size=1, max_size=max_connections, kwargs={"autocommit": True}, open=False,
            timeout=connect_timeout, reconnect_timeout=connect_timeout,
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout)
        except (psycopg_pool.PoolTimeout, psycopg.Error) as exc:
            await pool.close()
            raise _connect_error(url, exc) from exc
        transport = cls(pool, url, names, clock)
        try:
            async with pool.connection() as conn:
                with _errors(url, "open", lambda: conn.broken):
                    async with conn.transaction():
                        await _run_plan_async(conn, open_plan(names))
        except BaseException:
            await pool.close()
            raise
        return transport

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        conn = None
        with _errors(self.url, operation, lambda: conn is not None and (conn.broken or conn.closed)):
            async with self._pool.connection() as conn:
                return await _run_plan_async(conn, steps)

    async def _release(self) -> None:
        await self._pool.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<AsyncPostgresTransport {without_password(self.url)} tables {self._names.messages!r}{state}>"
