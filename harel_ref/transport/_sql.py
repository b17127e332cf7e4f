"""The SQL shared by the SQLite and libSQL transports: schema, upgrade, and the four operations.

Both backends speak SQLite's dialect and differ only in their driver, so every statement lives
here, once.  An operation is written as a *plan*: a generator that yields :class:`Statement`
objects and is sent back each statement's answer (the rows of a ``fetch`` statement, else
None), then returns the operation's result.  :func:`run` executes a plan on a DB-API connection
(``sqlite3``, ``libsql``); :func:`run_on_loop` does the same on the event loop's thread.  The
plans hold the logic; the runners hold the transaction and nothing else.

Schema (the seeds' tables, plus ``routing_key``, ``claimable_at`` and the lease on the group)::

    <p>harel_transport_messages(seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id, event)
    <p>harel_transport_groups(group_id PRIMARY KEY, last_claimed_at, priority, routing_key,
                              claimable_at, locked_by, lock_expiry)
    <p>harel_transport_meta(key PRIMARY KEY, value)     -- 'schema_version' -> 6, and
                                                        -- 'wal_restarts' -> n (the SQLite twin's checkpoints)

``<p>`` is empty, or ``prefix + "_"`` when a ``prefix`` is given (``^[A-Za-z_][A-Za-z0-9_]{0,40}$``)
so that several queues (tests, tenants) can share one database file.

**Where the schema version lives.**  ``SCHEMA_VERSION`` is kept in the small meta table, not in
``PRAGMA user_version``: user_version is one number per database file, while each prefix has its
own tables and may be at its own version.  Older tables (the seeds', with no meta table, or
versions 4 and 5) are upgraded in place when a transport opens them: ``PRAGMA table_info`` tells
which columns are missing, ``ALTER TABLE ... ADD COLUMN`` adds them, each group's lease and
``claimable_at`` are filled in from its head, and the indexes and triggers are replaced, all
inside ``BEGIN IMMEDIATE`` so that two processes opening at once do not both alter (rqlite
sends the reads and writes apart, so there each step may run twice, and is written so that a
second run changes nothing).  The messages' old lease columns are then cleared, and a trigger
refuses writes to them: an older harel-ref still running on the tables fails its claims instead
of breaking R2.  A database recording a *newer* version than this code knows is refused with
:class:`StorageError`.

**The lease** is the pair ``(locked_by, lock_expiry)`` of a *group*, and holds its head (the
message of smallest ``seq``): ``locked_by`` is the claim's token (``new_token(worker_id)``), or
``'__parked__'`` when the head is parked, or NULL when it is free.  Only a group's head is ever
leased, and the head cannot change while it is (only its ack deletes it), so "the group has
something in flight" is "``locked_by`` is set and ``lock_expiry >= now``" (live while
``now <= t + v``).  A message's row is written once, by its publish, and deleted by its ack.
(Versions up to 5 kept the lease on the message's row.  A claim then grew the row by about 54
bytes, and rows of about 1 KB, two to a page, no longer fitted: every claim split a page and
every ack freed one, at 0.78 of harel 0.9.0's speed.  Upgraded tables keep those columns,
cleared, and refuse writes to them.)

**Fencing** (departs from the seeds, whose ``DELETE ... WHERE seq = ?`` lets a stale worker delete
a message someone else holds): ack and nack match the group's ``locked_by = token``, and the
lease's seq must be the group's head.  A lapsed
lease that nobody re-claimed still acks (the work was done); a superseded or consumed lease
matches no row, returns False and changes nothing.

**Claim order, at a cost independent of blocked groups.**  A claim takes the claimable group
with the smallest ``last_claimed_at``, then ``rowid`` (arrival order; a group re-created after
its last ack gets a new, larger rowid).  Walking the groups in that order and skipping the
blocked ones would cost as many reads as there are leased or parked groups ahead (the seeds'
claim, and version 4).  So each group carries ``claimable_at``, the time its head can next be
claimed: ``FREE`` (-1) when the head is free, else the end of its lease or park.  A claim and a
nack write it with the lease; two triggers keep the rest, in the same statement as the write:

- ``<p>harel_transport_groups_claim_promotes_lapsed``: a claim (which stamps
  ``last_claimed_at``) promotes the groups that lapsed (below);
- ``<p>harel_transport_messages_ack_frees_group``: deleting a message frees its group, or
  drops it when that was its last message.

The index ``(claimable_at, last_claimed_at)`` then lists the FREE groups in claim order and
never touches a blocked one.  So a claim is one statement, ``UPDATE groups ... WHERE rowid =
(the next group) RETURNING (its head)``, which SQLite makes atomic without a transaction, and so
are ack and nack.

A lease or park that *lapses* is the subtle part: nothing is written at that moment, yet its
group must be claimable one tick later (R3).  The claim's head query therefore has two
candidates: the first FREE group in claim order, and the first group whose ``claimable_at`` has
passed (an index range holding only the groups that lapsed since the last *promotion*).  A
promotion moves those to FREE: the claim's trigger does it after each lease, and a claim that
finds nothing runs it as a statement of its own, so the range stays small and each lapse is
moved once.  The group's lease is still checked, free or lapsed, so a group moved to FREE whose
lease is live again after the clock stepped back (R3) is passed over, as it must be.  The clock is
read before the statement, outside the write lock: two claims may commit in the opposite
order of their readings, which R3 allows (fairness stamps are taken as read).
``tests/test_sqlite.py`` checks the query plans of every statement and trigger.

**Text is read back as BLOB** (``CAST(... AS BLOB)``, decoded as UTF-8): libsql 0.1.11 cuts a TEXT
value at its first NUL character when reading it (it writes it whole), while a BLOB comes back
intact.  Doing the same for stdlib sqlite3 keeps one SQL text for both drivers.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from ._base import (
    PARKED,
    ClockError,
    Clock,
    Lease,
    StorageError,
    check_clock,
)
from ._shell import AsyncShell, Shell, run_steps, run_steps_async, run_steps_within
from ._thread import ConnectionThread

__all__ = [
    "FREE",
    "OPERATIONS",
    "PAGE_SIZE",
    "PARKED",
    "SCHEMA_VERSION",
    "Plan",
    "QuickSyncs",
    "AsyncSqlTransport",
    "SqlCore",
    "Statement",
    "SyncSqlTransport",
    "Tables",
    "TEMP_IN_MEMORY",
    "Turns",
    "WAL_BYTES",
    "ack_statement",
    "check_busy_timeout",
    "check_loop_budget",
    "check_synchronous",
    "claim_statement",
    "claimed",
    "commit_levels",
    "claim_params",
    "claim_sql",
    "connection_pragmas",
    "head_params",
    "head_query",
    "head_query_when_lapsed",
    "lease_head_sql",
    "nack_statement",
    "one_statement",
    "open_plan",
    "promote_lapsed_sql",
    "promote_statement",
    "publish_plan",
    "run",
    "run_on_loop",
    "storage_errors",
]

SCHEMA_VERSION = 6
"""Version 6: the lease on the group's row (it was on the message's).  Version 5:
``groups.claimable_at``, its claim-order indexes and the triggers that keep it.  Version 4: the
seeds' two tables plus ``groups.routing_key`` and its index."""

FREE = -1.0
"""``claimable_at`` of a group whose head is free: earlier than any time a clock may show
(``now >= 0``, R13), so such a group is claimable at any ``now``."""


_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")

T = TypeVar("T")


class Statement(NamedTuple):
    """One SQL statement of a plan.  ``fetch``: the plan is sent the rows, else None."""

    sql: str
    params: tuple[Any, ...] = ()
    fetch: bool = False


Plan = Generator[Statement, Any, T]
"""A plan yields statements, receives each one's answer, and returns the operation's result."""


@dataclass(frozen=True)
class Tables:
    """The names of one queue's tables and indexes (validated, so safe to put in SQL), and the
    SQL of its claim, ack and nack, built on first use (a cache lookup per call, keyed by the
    names, cost a claim+ack about 4 µs, more than half a percent on a fast disk)."""

    messages: str
    groups: str
    meta: str

    @functools.cached_property
    def claim_sql(self) -> str:
        """:func:`lease_head_sql` without routing keys, returning the lease."""
        return lease_head_sql(self, None, guarded=True)

    @functools.cached_property
    def ack_sql(self) -> str:
        """Parameters: seq, group_id, token.  The message must be its group's head (a lease's
        seq is its head's, R16): a lease with the right token and another seq matches nothing."""
        return (
            f"DELETE FROM {self.messages} WHERE seq = ? AND group_id = ? AND EXISTS (SELECT 1"
            f" FROM {self.groups} AS g WHERE g.group_id = {self.messages}.group_id AND g.locked_by = ?)"
            f" AND seq = (SELECT MIN(h.seq) FROM {self.messages} AS h WHERE h.group_id = {self.messages}.group_id)"
            f" RETURNING seq"
        )

    @functools.cached_property
    def nack_sql(self) -> str:
        """Parameters: locked_by, lock_expiry, claimable_at, group_id, token, seq (the head's,
        as for :attr:`ack_sql`)."""
        return (
            f"UPDATE {self.groups} SET locked_by = ?, lock_expiry = ?, claimable_at = ?"
            f" WHERE group_id = ? AND locked_by = ?"
            f" AND (SELECT MIN(h.seq) FROM {self.messages} AS h WHERE h.group_id = {self.groups}.group_id) = ?"
            f" RETURNING 1"
        )

    @classmethod
    def named(cls, prefix: str | None = None) -> Tables:
        """The default names, or ``<prefix>_harel_transport_...`` for a valid prefix."""
        if prefix is None:
            head = ""
        elif not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}: {prefix!r:.80}")
        elif not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"prefix must be a letter or '_' followed by at most 40 letters, digits or '_' "
                f"(it becomes part of table names), got {prefix!r:.80}"
            )
        elif (prefix + "_").lower().startswith("sqlite_"):
            raise ValueError(
                f"prefix must not be {prefix!r}: SQLite reserves the table names that begin "
                "with 'sqlite_'"
            )
        else:
            head = prefix + "_"
        return cls(
            f"{head}harel_transport_messages",
            f"{head}harel_transport_groups",
            f"{head}harel_transport_meta",
        )


def check_busy_timeout(busy_timeout: object) -> float:
    """How long (seconds) a writer waits for SQLite's write lock before giving up."""
    if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
        raise TypeError(f"busy_timeout must be a number of seconds, got {busy_timeout!r}")
    if not 0 <= busy_timeout < 86400:
        raise ValueError(f"busy_timeout must be from 0 to 86400 seconds, got {busy_timeout}")
    return float(busy_timeout)


SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")
"""The values of ``PRAGMA synchronous`` a transport takes; ``FULL`` (SQLite's default) is its own.

In WAL mode:

- ``FULL`` syncs the WAL when a publish, an ack or a nack commits: once it returned, it
  survives a power cut.  A claim commits at ``NORMAL``, unsynced, and is synced with the next
  commit that is (the WAL is one file, synced whole, so a power cut keeps a prefix of the
  commits, never a later one without an earlier).  A power cut may thus undo the last claims:
  their messages are claimable again at once, as if their leases had lapsed.  Nothing is lost
  by it, because nobody holds those leases any more: a WAL database is shared through memory
  (its ``-shm`` file), so every process that can claim from it runs on its machine, and died
  with it.  (A service that hands leases on to workers on other machines breaks that premise,
  and should use EXTRA.)  What it saves is one sync per message: half of a claim+ack's time on
  a disk whose sync is slow (docs/performance.md).
- ``EXTRA`` syncs every commit, claims too.
- ``NORMAL`` syncs only at checkpoints: a commit still survives a crash of the process, and
  the file is never corrupted, but the last commits before a power cut or an OS crash may be
  rolled back (a message acked may come back; one claimed may be claimed again, which the
  lease already allows).

``OFF`` is refused: without syncs an OS crash can corrupt the file, and a queue is the wrong
place for that trade.  In a rollback journal (libSQL's embedded replica) a claim keeps the
level given, since NORMAL there may corrupt the file on a power cut."""


def check_synchronous(synchronous: object) -> str:
    """``synchronous`` as SQLite spells it (upper case), or an error naming the choices."""
    if not isinstance(synchronous, str):
        raise TypeError(f"synchronous must be a str, one of {', '.join(SYNCHRONOUS)}; got {synchronous!r:.80}")
    if synchronous.upper() not in SYNCHRONOUS:
        refused = " (OFF is refused: an OS crash could corrupt the file)" if synchronous.upper() == "OFF" else ""
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}{refused}; got {synchronous!r:.80}")
    return synchronous.upper()


# --- Schema ---------------------------------------------------------------------------------


PAGE_SIZE = 2048
"""The page size of a database file that a transport creates (SQLite's default is 4096).

Every commit appends each page it changed to the WAL, whole, and fsyncs it: a claim+ack
changes about 8 pages, each holding a few of the queue's small rows, so smaller pages mean
fewer bytes to sync (measured in ``benchmarks/peers.py``: about 10% more claim+ack per second
than with 4096).  An existing file keeps its page size: SQLite changes it only in an empty file.
"""


WAL_BYTES = 1000 * 4096
"""How much WAL a connection writes before it checkpoints: SQLite's default interval (1,000
pages) at its default page size.  In pages of :data:`PAGE_SIZE` that is 2,000; at SQLite's
1,000, the checkpoints of a claim+ack workload at ``synchronous=NORMAL`` cost 5% more
(docs/performance.md), since a page changed many times between two checkpoints is copied once."""


TEMP_IN_MEMORY = Statement("PRAGMA temp_store = MEMORY")
"""Run once the tables are open (an upgrade's index builds before it may still spill to disk).

Every claim and ack opens temporary b-trees: one for the rows of ``RETURNING`` and, in a claim,
two for the ``ORDER BY ... LIMIT 1`` of the head query; each holds a row or two.  With
SQLite's default ``temp_store`` each one's page cache starts with one allocation of 20 pages
(87,208 bytes), five per claim+ack, freed at the statement's end: where they land at the top of
the heap, glibc gives the memory back to the kernel on the free (its trim threshold is 128
KiB) and the next call faults it in again, about 55 page faults and 3 ``brk`` a claim+ack, and
half the speed (docs/performance.md, issue 43).  In memory, such a b-tree takes its pages one
at a time (4,368 bytes each, one or two per b-tree)."""


def connection_pragmas(busy_timeout: float, *, wal: bool = True, synchronous: str = "FULL") -> list[Statement]:
    """Per-connection settings, run outside any transaction (journal_mode cannot change inside).

    ``page_size`` comes before ``journal_mode``: switching a new file to WAL writes its header,
    after which its page size is fixed.  ``synchronous`` was checked by :func:`check_synchronous`.
    """
    pragmas = [
        Statement(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}", fetch=True),
        Statement(f"PRAGMA synchronous = {synchronous}"),
    ]
    if wal:
        pragmas.append(Statement(f"PRAGMA page_size = {PAGE_SIZE}"))
        pragmas.append(Statement("PRAGMA journal_mode = WAL", fetch=True))
    return pragmas


def open_plan(t: Tables) -> Plan[None]:
    """Create the tables, or bring older ones up to ``SCHEMA_VERSION``.  Run in a transaction.

    Tables already at ``SCHEMA_VERSION``, with this release's triggers, cost two reads and no
    write; new ones one read, then writes only (rqlite sends them in one request).
    """
    existing = yield from _existing_tables(t)
    version = (yield from _stored_version(t)) if t.meta in existing else None
    if version == SCHEMA_VERSION and _CURRENT_TRIGGERS in existing and _OLD_TRIGGERS not in existing:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(
            f"the tables {t.messages}/{t.groups} are at schema version {version}, newer than "
            f"this harel-ref knows ({SCHEMA_VERSION}); upgrade harel-ref"
        )
    yield Statement(
        f"CREATE TABLE IF NOT EXISTS {t.messages} ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"  # FIFO order and the lease's handle
        " group_id TEXT NOT NULL,"
        " event TEXT NOT NULL)"
    )
    yield Statement(
        f"CREATE TABLE IF NOT EXISTS {t.groups} ("
        " group_id TEXT PRIMARY KEY,"  # a rowid table: rowid is the arrival order
        " last_claimed_at REAL NOT NULL DEFAULT 0.0,"
        " priority INT NOT NULL DEFAULT 0,"
        " routing_key TEXT,"
        f" claimable_at REAL NOT NULL DEFAULT {FREE},"
        " locked_by TEXT,"  # the head's lease token, '__parked__', or NULL when it is free
        " lock_expiry REAL)"  # end of the lease or park
    )
    yield Statement(f"CREATE TABLE IF NOT EXISTS {t.meta} (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    messages_hold_leases = False
    if existing:
        messages_hold_leases = yield from _upgrade_columns(t)
    # Version 4's claim-order indexes walked blocked groups too; version 5's skip them.  (And
    # version 4's rqlite claim found its group by token; version 5's claim is one statement.)
    yield Statement(f"DROP INDEX IF EXISTS {t.groups}_by_last_claimed")
    yield Statement(f"DROP INDEX IF EXISTS {t.groups}_by_routing_key")
    yield Statement(f"DROP INDEX IF EXISTS {t.messages}_by_locked_by")
    yield Statement(
        f"CREATE INDEX IF NOT EXISTS {t.groups}_claim_order"
        f" ON {t.groups} (claimable_at, last_claimed_at)"
    )
    yield Statement(  # partial: a group without a routing key costs this index nothing
        f"CREATE INDEX IF NOT EXISTS {t.groups}_claim_order_by_routing_key"
        f" ON {t.groups} (routing_key, claimable_at, last_claimed_at) WHERE routing_key IS NOT NULL"
    )
    yield Statement(f"CREATE INDEX IF NOT EXISTS {t.messages}_by_group ON {t.messages} (group_id, seq)")
    # Version 5 kept the group from triggers on the messages' lease; version 6 keeps the lease
    # on the group.  (The first release of version 5 had two claim triggers.)
    for name in _old_triggers(t):
        yield Statement(f"DROP TRIGGER IF EXISTS {name}")
    if messages_hold_leases:  # only once the old triggers are gone: they would free the groups
        yield from _retire_message_leases(t)
    yield from _triggers(t)
    yield Statement(
        f"INSERT OR REPLACE INTO {t.meta} (key, value) VALUES ('schema_version', ?)",
        (SCHEMA_VERSION,),
    )


_CLAIM_TRIGGER = "_claim_promotes_lapsed"
"""The suffix of the groups' trigger that promotes the lapsed groups at each claim."""

_ACK_TRIGGER = "_ack_frees_group"
"""The suffix of the messages' trigger that frees or drops a group at each ack."""

_OLD_MESSAGE_TRIGGERS = ("_claim_blocks_group", "_nack_sets_group", "_delete_frees_group",
                         "_lease_blocks_group", "_claim_stamps_group")
"""The suffixes of the messages' triggers of version 5 (the last two: its first release)."""

_CURRENT_TRIGGERS = "current triggers"
"""In :func:`_existing_tables`' answer: both of this version's triggers are there."""

_OLD_TRIGGERS = "old triggers"
"""In :func:`_existing_tables`' answer: a trigger of version 5 is there (also beside the new
ones, when an older release upgraded the same tables at the same time on rqlite)."""


def _old_triggers(t: Tables) -> list[str]:
    return [f"{t.messages}{suffix}" for suffix in _OLD_MESSAGE_TRIGGERS]


def _triggers(t: Tables) -> Plan[None]:
    """This version's two triggers (see the top)."""
    yield Statement(
        f"CREATE TRIGGER IF NOT EXISTS {t.groups}{_CLAIM_TRIGGER}"
        f" AFTER UPDATE OF last_claimed_at ON {t.groups} BEGIN"
        f" UPDATE {t.groups} SET claimable_at = {FREE}"
        f" WHERE claimable_at >= 0 AND claimable_at < NEW.last_claimed_at;"
        f" END"
    )
    yield Statement(
        f"CREATE TRIGGER IF NOT EXISTS {t.messages}{_ACK_TRIGGER}"
        f" AFTER DELETE ON {t.messages} BEGIN"
        f" DELETE FROM {t.groups} WHERE group_id = OLD.group_id"
        f" AND NOT EXISTS (SELECT 1 FROM {t.messages} WHERE group_id = OLD.group_id);"
        f" UPDATE {t.groups} SET claimable_at = {FREE}, locked_by = NULL, lock_expiry = NULL"
        f" WHERE group_id = OLD.group_id;"
        f" END"
    )


def _retire_message_leases(t: Tables) -> Plan[None]:
    """Once every group holds its head's lease: clear the messages' lease columns, and refuse
    any later write to them.

    A process of an older harel-ref that opened before the upgrade (it checks the version only
    when it opens) would go on leasing messages without blocking their groups (R2), and its
    acks would match the tokens left in the messages' rows (R10).  So its claims and nacks now
    fail with the trigger's message, and its acks match nothing; its publishes still work.
    Both statements can run twice (a second upgrade racing on rqlite): the clear then changes
    no row, so the trigger does not fire."""
    yield Statement(
        f"UPDATE {t.messages} SET locked_by = NULL, lock_expiry = NULL"
        f" WHERE locked_by IS NOT NULL OR lock_expiry IS NOT NULL"
    )
    yield Statement(
        f"CREATE TRIGGER IF NOT EXISTS {t.messages}_lease_is_on_the_group"
        f" BEFORE UPDATE OF locked_by, lock_expiry ON {t.messages} BEGIN"
        f" SELECT RAISE(ABORT, 'harel-ref: these tables are at schema version {SCHEMA_VERSION}, where the lease"
        f" is kept on the group: upgrade harel-ref in this process');"
        f" END"
    )


def _existing_tables(t: Tables) -> Plan[set[str]]:
    """Which of the three tables exist already, with ``_CURRENT_TRIGGERS`` if this version's
    triggers do and ``_OLD_TRIGGERS`` if an older one does.  SQLite's names ignore case, so
    tables made under ``Foo`` are this prefix's under ``foo`` too."""
    names = (t.messages, t.groups, t.meta)
    current = (f"{t.groups}{_CLAIM_TRIGGER}".lower(), f"{t.messages}{_ACK_TRIGGER}".lower())
    old = tuple(name.lower() for name in _old_triggers(t))
    triggers = ", ".join("?" * (len(current) + len(old)))
    rows = yield Statement(
        "SELECT lower(name) FROM sqlite_master WHERE (type = 'table' AND lower(name) IN (?, ?, ?))"
        f" OR (type = 'trigger' AND lower(name) IN ({triggers}))",
        (*(name.lower() for name in names), *current, *old), fetch=True,
    )
    found = {row[0] for row in rows}
    existing = {name for name in names if name.lower() in found}
    if found.issuperset(current):
        existing.add(_CURRENT_TRIGGERS)
    if found.intersection(old):
        existing.add(_OLD_TRIGGERS)
    return existing


def _stored_version(t: Tables) -> Plan[int | None]:
    """The schema version recorded in the meta table, or None."""
    rows = yield Statement(f"SELECT value FROM {t.meta} WHERE key = 'schema_version'", fetch=True)
    return rows[0][0] if rows else None


def _upgrade_columns(t: Tables) -> Plan[bool]:
    """Older tables (the seeds', or versions 4 and 5) gain the columns they lack (SQLite has no
    ADD COLUMN IF NOT EXISTS): each group takes its head's lease, then the ``claimable_at``
    that lease gives.  Whether the messages have lease columns (to retire, by
    :func:`_retire_message_leases`).

    On rqlite the plan's reads and writes are separate requests, so two processes may both
    upgrade: each copy and fill acts only while no process has recorded version 6 yet, else a
    late one would put a lease from before the upgrade back over one taken since."""
    messages = {row[1] for row in (yield Statement(f"PRAGMA table_info({t.messages})", fetch=True))}
    groups = {row[1] for row in (yield Statement(f"PRAGMA table_info({t.groups})", fetch=True))}
    if "routing_key" not in groups:  # version 4
        yield Statement(f"ALTER TABLE {t.groups} ADD COLUMN routing_key TEXT")
    if "locked_by" not in groups:  # version 6
        yield Statement(f"ALTER TABLE {t.groups} ADD COLUMN locked_by TEXT")
        yield Statement(f"ALTER TABLE {t.groups} ADD COLUMN lock_expiry REAL")
        if {"locked_by", "lock_expiry"} <= messages:
            yield Statement(
                f"UPDATE {t.groups} SET (locked_by, lock_expiry) = (SELECT m.locked_by, m.lock_expiry"
                f" FROM {t.messages} AS m WHERE m.seq = (SELECT MIN(h.seq) FROM {t.messages} AS h"
                f" WHERE h.group_id = {t.groups}.group_id)) WHERE {_before_version_6(t)}"
            )
    if "claimable_at" not in groups:  # version 5
        yield Statement(f"ALTER TABLE {t.groups} ADD COLUMN claimable_at REAL NOT NULL DEFAULT {FREE}")
        yield Statement(
            f"UPDATE {t.groups} SET claimable_at = COALESCE(lock_expiry, {FREE})"
            f" WHERE locked_by IS NOT NULL AND {_before_version_6(t)}"
        )
    return {"locked_by", "lock_expiry"} <= messages


def _before_version_6(t: Tables) -> str:
    """SQL: no process has recorded schema version 6 (or later) in the meta table yet."""
    return f"NOT EXISTS (SELECT 1 FROM {t.meta} WHERE key = 'schema_version' AND value >= 6)"


# --- Operations -----------------------------------------------------------------------------
# Each SQL text is built once per table names (and number of routing keys), then reused.


def publish_plan(t: Tables, group_id: str, event: str, priority: int, routing_key: str | None) -> Plan[None]:
    """Append the message; the publish that creates the group fixes its priority and routing key."""
    insert_message, insert_group = _publish_sql(t)
    yield Statement(insert_message, (group_id, event))
    yield Statement(insert_group, (group_id, priority, routing_key))


@functools.lru_cache(maxsize=64)
def _publish_sql(t: Tables) -> tuple[str, str]:
    return (
        f"INSERT INTO {t.messages} (group_id, event) VALUES (?, ?)",
        f"INSERT OR IGNORE INTO {t.groups} (group_id, priority, routing_key) VALUES (?, ?, ?)",
    )


@functools.lru_cache(maxsize=64)
def promote_lapsed_sql(t: Tables) -> str:
    """Parameter: now.  Every group whose lease or park has ended by ``now`` becomes FREE.

    A lapse writes nothing at the moment it happens; the claim moves the groups that lapsed
    since into the FREE range of the index.  A claim that leases does it in its trigger
    (``<p>..._claim_promotes_lapsed``); a claim that finds nothing runs this statement.
    """
    return f"UPDATE {t.groups} SET claimable_at = {FREE} WHERE claimable_at >= 0 AND claimable_at < ?"


@functools.lru_cache(maxsize=256)
def head_query(t: Tables, routing_keys: int | None) -> str:
    """The rowid of the next claimable group.  Parameters: :func:`head_params`.

    Two candidates, each found on the claim-order index, the earlier in claim order wins:

    - the first FREE group in claim order (``last_claimed_at``, then arrival), read straight
      off the index;
    - the first group whose lease or park lapsed since the last promotion (an index range
      that holds only those, usually none, sorted).

    Leased and parked groups are never read, and of the messages only the ``(group_id, seq)``
    index, to see that a candidate holds one.  Each candidate's priority,
    routing key and lease must fit.  The lease check (none, or lapsed) fails only for a group
    promoted before the clock stepped back (R3): its lease is live again.  A group with a NULL
    routing key never matches ``IN (...)``, so it is only reachable by an unfiltered claim.  The
    arrival order is spelled ``_rowid_``, a name rqlite's parser reads.
    """
    free = _first_candidate(t, routing_keys, f"g.claimable_at = {FREE}")
    lapsed = _first_candidate(t, routing_keys, "g.claimable_at >= 0 AND g.claimable_at < ?")
    return f"SELECT arrival FROM ({free} UNION ALL {lapsed}) ORDER BY stamp, arrival LIMIT 1"


def _first_candidate(t: Tables, routing_keys: int | None, groups: str) -> str:
    """The first group in claim order among ``groups`` whose priority, routing key and lease
    fit, and that holds a message: its ``arrival`` (rowid) and ``stamp``.  Parameters:
    min_priority, the keys, now.

    harel-ref never leaves a group without messages (the last ack drops it in the same
    statement), but the seeds' ack drops it in a second statement, so a crash between the two
    leaves one behind, and an upgrade keeps what it finds."""
    routing = ""
    if routing_keys is not None:
        routing = f" AND g.routing_key IN ({', '.join('?' * routing_keys)})"
    return (
        f"SELECT * FROM (SELECT g._rowid_ AS arrival, g.last_claimed_at AS stamp"
        f" FROM {t.groups} AS g"
        f" WHERE {groups} AND g.priority >= ?{routing}"
        f" AND (g.locked_by IS NULL OR g.lock_expiry < ?)"
        f" AND EXISTS (SELECT 1 FROM {t.messages} AS h WHERE h.group_id = g.group_id)"
        f" ORDER BY g.last_claimed_at, g._rowid_ LIMIT 1)"
    )


def head_params(now: float, min_priority: int, routing_keys: tuple[str, ...] | None) -> tuple[Any, ...]:
    """The parameters of :func:`head_query`."""
    keys = routing_keys or ()
    return (min_priority, *keys, now, now, min_priority, *keys, now)


@functools.lru_cache(maxsize=256)
def head_query_when_lapsed(t: Tables, routing_keys: int | None) -> str:
    """:func:`head_query`, run only when some group's lease or park has lapsed since the last
    promotion, else its FREE candidate alone.  Parameters: now, :func:`head_params`, then
    min_priority, the keys and now again.

    The lapsed candidate's ``ORDER BY`` and the choice between the two candidates each sort in
    a temporary b-tree, which SQLite opens on every run even when the lapsed range is empty, as
    it nearly always is: 1.9 µs of CPU a claim (6.4 µs for the head query, 4.4 guarded, on the
    2-core VM of docs/performance.md, measured at version 5).  One seek on the claim-order index
    tells whether that range holds any group; with none, the answer is the FREE candidate's, as
    it would be anyway.  (SQLite and libSQL only: rqlite's claim keeps :func:`head_query`,
    whose SQL its parser is known to read.)
    """
    free = _first_candidate(t, routing_keys, f"g.claimable_at = {FREE}")
    return (
        f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {t.groups} WHERE claimable_at >= 0 AND claimable_at < ?)"
        f" THEN ({head_query(t, routing_keys)}) ELSE (SELECT arrival FROM ({free})) END"
    )


@functools.lru_cache(maxsize=256)
def lease_head_sql(t: Tables, routing_keys: int | None, *, text_as_blob: bool = True, guarded: bool = False) -> str:
    """Parameters: :func:`claim_params` (with the same ``guarded``).  Leases the head of the
    next claimable group, blocks the group until the lease ends and stamps its
    ``last_claimed_at``, and returns the head's seq, group_id and event (no row: nothing is
    claimable).  One statement, so SQLite runs it atomically on its own; its trigger promotes
    the groups that lapsed.  ``text_as_blob``: group_id and event come back as BLOB (see the
    top; rqlite's JSON brings text back whole).  ``guarded``: the group is found by
    :func:`head_query_when_lapsed`, else by :func:`head_query`."""
    head = head_query_when_lapsed(t, routing_keys) if guarded else head_query(t, routing_keys)
    group_id, event = ("CAST(group_id AS BLOB)", "CAST(h.event AS BLOB)") if text_as_blob else ("group_id", "h.event")
    of_the_head = f"FROM {t.messages} AS h WHERE h.group_id = {t.groups}.group_id ORDER BY h.seq LIMIT 1"
    return (
        f"UPDATE {t.groups} SET locked_by = ?, lock_expiry = ?, claimable_at = ?, last_claimed_at = ?"
        f" WHERE _rowid_ = ({head})"
        f" RETURNING (SELECT h.seq {of_the_head}), {group_id}, (SELECT {event} {of_the_head})"
    )


def claim_params(token: str, now: float, visibility: float, min_priority: int,
                 routing_keys: tuple[str, ...] | None, guarded: bool = False) -> tuple[Any, ...]:
    """The parameters of :func:`lease_head_sql`: the lease's, then those of its head query,
    spelled out here because this runs on every claim."""
    until = now + visibility
    if routing_keys is None:
        if guarded:
            return (token, until, until, now, now, min_priority, now, now, min_priority, now, min_priority, now)
        return (token, until, until, now, min_priority, now, now, min_priority, now)
    keys = routing_keys
    if guarded:
        return (token, until, until, now, now, min_priority, *keys, now, now, min_priority, *keys, now,
                min_priority, *keys, now)
    return (token, until, until, now, min_priority, *keys, now, now, min_priority, *keys, now)


def claim_statement(t: Tables, token: str, now: float, visibility: float, min_priority: int,
                    routing_keys: tuple[str, ...] | None) -> Statement:
    """The claim: lease the head of the next claimable group (its group stamped ``now``).  One
    statement, atomic without a transaction; read its rows with :func:`claimed`.  When it finds
    nothing, :func:`promote_statement` should follow (it need not be atomic with it)."""
    sql = t.claim_sql if routing_keys is None else claim_sql(t, len(routing_keys))
    return Statement(sql, claim_params(token, now, visibility, min_priority, routing_keys, guarded=True), True)


def claim_sql(t: Tables, routing_keys: int) -> str:
    """The claim's SQL with ``routing_keys`` keys (without: ``t.claim_sql``), returning the lease."""
    return lease_head_sql(t, routing_keys, guarded=True)


def claimed(rows: list[Any], token: str) -> Lease | None:
    """The lease a claim's rows stand for, or None."""
    if not rows:
        return None
    seq, group_id, event = rows[0]
    return Lease(group_id.decode(), event.decode(), seq, token)  # read as BLOB: see the top


def promote_statement(t: Tables, now: float) -> Statement:
    return Statement(promote_lapsed_sql(t), (now,))


def ack_statement(t: Tables, lease: Lease) -> Statement:
    """Delete the message if its group is still held under the lease's token (a row back: it
    was).  Its trigger frees the group (its next message is free), or drops it after its last
    message."""
    return Statement(t.ack_sql, (lease.seq, lease.group_id, lease.token), True)


def nack_statement(t: Tables, lease: Lease, now: float, delay: float) -> Statement:
    """Free the group's head (delay 0) or park it until now + delay, if the group is still held
    under the lease's token (a row back: it was); ``claimable_at`` follows in the same write."""
    if delay == 0:
        return Statement(t.nack_sql, (None, None, FREE, lease.group_id, lease.token, lease.seq), True)
    until = now + delay
    return Statement(t.nack_sql, (PARKED, until, until, lease.group_id, lease.token, lease.seq), True)


# --- Runners --------------------------------------------------------------------------------


_BEGIN = Statement("BEGIN IMMEDIATE")
_COMMIT = Statement("COMMIT")
_ROLLBACK = Statement("ROLLBACK")


def run(conn: Any, plan: Plan[T], *, transaction: bool, lock_wait: float = 0.0) -> T:
    """Execute ``plan`` on a DB-API connection opened with ``isolation_level=None``.

    With ``transaction``, inside ``BEGIN IMMEDIATE ... COMMIT``, rolled back on any error.
    Without, each statement commits on its own (SQLite makes one statement atomic).

    ``lock_wait``: for a connection whose driver does not wait for the write lock itself
    (libsql, see there, and an asyncio twin running on the loop), how many seconds to keep
    retrying a statement that starts a transaction (``BEGIN IMMEDIATE``, or each statement of a
    plan run without one) while the database is locked, sleeping between tries.  Such a
    statement did nothing when it failed, so a retry cannot act twice.
    """
    return run_steps(_carried_out(conn, plan, transaction, lock_wait), time.sleep)


async def run_on_loop(conn: Any, plan: Plan[T], *, transaction: bool, lock_wait: float) -> T:
    """:func:`run` on the event loop's own thread: the statements run there, and only the
    pauses while the database is locked are awaited (``asyncio.sleep``).  A caller cancelled
    during a pause leaves nothing done by the statement it was retrying, and never a
    transaction open: a pause comes only before ``BEGIN IMMEDIATE`` succeeds, or between two
    statements that each committed on their own."""
    return await run_steps_async(_carried_out(conn, plan, transaction, lock_wait), asyncio.sleep)


def _carried_out(conn: Any, plan: Plan[T], transaction: bool, lock_wait: float) -> Generator[float, None, T]:
    """The work of :func:`run` as steps: each step yielded is a pause (seconds) to sleep before
    retrying a statement that found the database locked; the driver sleeps it its own way."""
    try:
        if not transaction:
            return (yield from run_steps_within(plan, lambda statement: _alone(conn, statement, lock_wait)))
        yield from _alone(conn, _BEGIN, lock_wait)
        result = run_steps(plan, lambda statement: _execute(conn, statement))
        _execute(conn, _COMMIT)
        return result
    except GeneratorExit:
        # Closed at a pause, by a caller that stopped waiting: a pause comes only before BEGIN
        # succeeds or between statements that each committed, so nothing is open (and the
        # connection may be closed by now: a libsql one must not be touched then).
        raise
    except BaseException:
        if transaction and conn.in_transaction:
            try:
                _execute(conn, _ROLLBACK)
            except Exception:  # the first error is the one to report
                pass
        raise


def _execute(conn: Any, statement: Statement) -> Any:
    """Run one statement; its rows if ``fetch``, else None.  The cursor is emptied and closed
    at once: libsql refuses to COMMIT while a statement is still open ("SQL statements in
    progress")."""
    cursor = conn.execute(statement.sql, statement.params)
    try:
        return _answer(cursor, statement)
    finally:
        cursor.close()


def _answer(cursor: Any, statement: Statement) -> Any:
    """What a statement answers its plan: its rows if ``fetch``, else None."""
    return cursor.fetchall() if statement.fetch else None


def _alone(conn: Any, statement: Statement, lock_wait: float) -> Generator[float, None, Any]:
    """One statement in its own transaction (autocommit), retried while the database is locked
    for up to ``lock_wait`` seconds, yielding each pause; its rows if ``fetch``, else None."""
    if not lock_wait:
        return _execute(conn, statement)
    deadline, pause = time.monotonic() + lock_wait, 0.001
    while True:
        try:
            return _execute(conn, statement)
        except Exception as exc:
            if not _says_locked(exc) or time.monotonic() + pause > deadline:
                raise
        yield pause  # the driver sleeps, letting the holder of the lock finish
        pause = min(pause * 2, 0.05)


def _says_locked(error: BaseException) -> bool:
    """SQLite's "database is locked" (SQLITE_BUSY), as any driver words it."""
    text = str(error).lower()
    return "database is locked" in text or "database is busy" in text


# --- Errors ---------------------------------------------------------------------------------


def _hint(detail: str, busy_timeout: float) -> str:
    text = detail.lower()
    if "not a database" in text:
        return "the file exists but is not an SQLite database (wrong path, or a damaged file?)"
    if "readonly" in text or "read-only" in text:
        return "the database is read-only: check the permissions of the file and its directory"
    if "locked" in text or "busy" in text:
        return (
            f"another connection held the write lock for longer than busy_timeout="
            f"{busy_timeout:g}s; raise busy_timeout or find the long transaction"
        )
    if "unable to open" in text:
        return (
            "the file cannot be opened: check that its directory exists and is writable "
            "(WAL keeps -wal and -shm files beside the database)"
        )
    return "the storage refused the operation"


@contextmanager
def storage_errors(path: str, operation: str, driver_errors: tuple[type[BaseException], ...], busy_timeout: float) -> Iterator[None]:
    """Turn the driver's errors into :class:`StorageError` naming the path and the cause."""
    try:
        yield
    except (StorageError, ClockError):  # ClockError: libsql's driver errors include ValueError
        raise
    except driver_errors as exc:
        raise storage_error(path, operation, exc, busy_timeout) from exc


def storage_error(path: str, operation: str, exc: BaseException, busy_timeout: float) -> StorageError:
    """The :class:`StorageError` for the driver's error ``exc``, naming the path and the cause."""
    return StorageError(f"{operation} on {path!r} failed: {exc} ({_hint(str(exc), busy_timeout)})")


# --- The core and the synchronous transport, for any sqlite3-like driver ---------------------


OPERATIONS = frozenset({"publish", "claim", "ack", "nack"})


class SqlCore:
    """The four operations as statements in SQLite's dialect (:mod:`harel_ref.transport._shell`):
    every SQLite-speaking driver runs these, sync or async.

    A claim, an ack and a nack are each one statement that SQLite makes atomic on its own (see
    the top); a publish is a few, run inside ``BEGIN IMMEDIATE`` (:data:`TRANSACTIONS`)."""

    TRANSACTIONS = frozenset({"publish"})
    """The operations whose statements run in one transaction; the others' run alone."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Plan[None]:
        return publish_plan(self.tables, group_id, event, priority, routing_key)

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Plan[Lease | None]:
        rows = yield claim_statement(self.tables, token, now, visibility, min_priority, routing_keys)
        if not rows:  # nothing to claim: move the groups that lapsed to FREE now (see the top)
            yield promote_statement(self.tables, now)
        return claimed(rows, token)

    def ack(self, lease: Lease, now: float) -> Plan[bool]:
        return bool((yield ack_statement(self.tables, lease)))

    def nack(self, lease: Lease, now: float, delay: float) -> Plan[bool]:
        return bool((yield nack_statement(self.tables, lease, now, delay)))


class SyncSqlTransport(Shell):
    """The synchronous transport over one DB-API connection; subclasses pick the driver.

    A subclass sets ``_driver_errors`` and implements ``_connect()``.  One connection is shared
    by every thread of the process, behind one lock held for each whole call, so a publish's
    ``BEGIN IMMEDIATE ... COMMIT`` is never interleaved with another call.
    """

    _driver_errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    _wal = True
    _lock_wait_in_python = False  # the driver's busy handler off; run() waits instead

    def __init__(self, path: str, *, clock: Clock, prefix: str | None, busy_timeout: float,
                 synchronous: str) -> None:
        self._tables = Tables.named(prefix)
        self._core = SqlCore(self._tables)
        self._busy_timeout = check_busy_timeout(busy_timeout)
        synchronous = check_synchronous(synchronous)
        self._clock = check_clock(clock)
        self.path = path
        self._lock = self._serial = threading.Lock()
        self._lock_wait = self._busy_timeout if self._lock_wait_in_python else 0.0
        with self._errors("open"):
            self._conn = self._connect()
            try:
                driver_wait = 0.0 if self._lock_wait_in_python else self._busy_timeout
                journal = None
                for pragma in connection_pragmas(driver_wait, wal=self._wal, synchronous=synchronous):
                    answer = run(self._conn, one_statement(pragma), transaction=False, lock_wait=self._lock_wait)
                    if pragma.sql.startswith("PRAGMA journal_mode"):
                        journal = str(answer[0][0]).lower()
                if journal == "wal":  # a file keeps the page size it was made with
                    page_size = run(self._conn, one_statement(Statement("PRAGMA page_size", fetch=True)),
                                    transaction=False, lock_wait=self._lock_wait)
                    interval = Statement(f"PRAGMA wal_autocheckpoint = {WAL_BYTES // page_size[0][0]}")
                    run(self._conn, one_statement(interval), transaction=False, lock_wait=self._lock_wait)
                run(self._conn, open_plan(self._tables), transaction=True, lock_wait=self._lock_wait)
                run(self._conn, one_statement(TEMP_IN_MEMORY), transaction=False, lock_wait=self._lock_wait)
            except BaseException:
                self._conn.close()
                raise
        # The level each operation commits at (SYNCHRONOUS): at FULL, in WAL mode, a claim is
        # written at NORMAL and synced by the next synced commit.  The connection's level is
        # switched only when the operation differs from the last one's.
        self._levels = commit_levels(synchronous, wal=journal == "wal")
        self._level = self._levels[None]

    def _connect(self) -> Any:
        raise NotImplementedError

    def _errors(self, operation: str):
        return storage_errors(self.path, operation, self._driver_errors, self._busy_timeout)

    def _drive(self, operation: str, steps: Plan[T]) -> T:
        if operation in SqlCore.TRANSACTIONS or self._lock_wait:
            return self._run(operation, steps, transaction=operation in SqlCore.TRANSACTIONS)
        # A claim, an ack or a nack: each statement alone, straight to the driver.  This is every
        # call's path, where run() and its helpers would add a few microseconds to each.
        execute = self._conn.execute
        try:
            self._set_level(operation)
            return run_steps(steps, lambda statement: _answer(execute(statement.sql, statement.params), statement))
        except StorageError:
            raise
        except self._driver_errors as exc:
            raise storage_error(self.path, operation, exc, self._busy_timeout) from exc

    def _run(self, operation: str, plan: Plan[T], *, transaction: bool) -> T:
        # The caller holds self._lock and has checked that the transport is open.  No context
        # manager here: this is every call's path, and storage_errors() would cost a microsecond.
        try:
            self._set_level(operation)
            return run(self._conn, plan, transaction=transaction, lock_wait=self._lock_wait)
        except StorageError:
            raise
        except self._driver_errors as exc:
            raise storage_error(self.path, operation, exc, self._busy_timeout) from exc

    async def _drive_on_loop(self, operation: str, steps: Plan[T]) -> T:
        """:meth:`_drive` on the event loop's thread, awaiting the pauses of a lock wait (for
        :class:`AsyncSqlTransport`; the driver's own busy handler must be off)."""
        try:
            self._set_level(operation)
            return await run_on_loop(self._conn, steps, transaction=operation in SqlCore.TRANSACTIONS,
                                     lock_wait=self._lock_wait)
        except StorageError:
            raise
        except self._driver_errors as exc:
            raise storage_error(self.path, operation, exc, self._busy_timeout) from exc

    def _set_level(self, operation: str) -> None:
        """Switch the connection to the level ``operation`` commits at, if it is not there."""
        level = self._levels.get(operation, self._levels[None])
        if level != self._level:
            self._level = None  # unknown until the switch is done: an interrupt may come between
            _execute(self._conn, _SET_LEVEL[level])
            self._level = level

    @property
    def unsynced(self) -> frozenset[str]:
        """The operations whose commit does not wait for the disk (:data:`SYNCHRONOUS`)."""
        return frozenset(op for op in OPERATIONS if self._levels.get(op, self._levels[None]) == "NORMAL")

    def _release(self) -> None:
        self._conn.close()


def commit_levels(synchronous: str, *, wal: bool) -> dict[str | None, str]:
    """The ``synchronous`` level each operation commits at: ``None`` is every operation's but
    those named.  At FULL, in WAL mode, a claim commits at NORMAL (SYNCHRONOUS says why); a
    rollback journal at NORMAL may corrupt the file on a power cut, so it keeps FULL there."""
    if synchronous == "FULL" and wal:
        return {None: synchronous, "claim": "NORMAL"}
    return {None: synchronous}


_SET_LEVEL = {level: Statement(f"PRAGMA synchronous = {level}") for level in SYNCHRONOUS}


class Turns:
    """One call at a time, for ``async with``: an asyncio.Lock per event loop.

    A transport may serve one loop after another (``asyncio.run`` for each batch of work), and
    an asyncio.Lock belongs to the first loop on which a call waited for it.  ``before``, if
    given, is awaited once the turn is taken and before the call goes on (to read the clock):
    something the call must wait for without holding the loop."""

    def __init__(self, before: Callable[[], Awaitable[None]] | None = None) -> None:
        self._before = before
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a call left inside its turn on an ended loop never ends it
            self._loop, self._lock = loop, asyncio.Lock()
        await self._lock.acquire()
        if self._before is not None:
            try:
                await self._before()
            except BaseException:
                self._lock.release()
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()


class QuickSyncs:
    """Where an asyncio twin runs a call whose commit is synced: on the loop while syncs are
    quick, in the connection's thread once one was not.

    A call on the loop holds it for its sync: no other task runs meanwhile.  A call in the
    thread frees the loop, but the trip there and back costs two wake-ups of an idle thread,
    tens of microseconds each (about 0.1 ms a trip on the 2-core VM of docs/performance.md),
    so a sync that takes less than ``budget`` seconds costs the loop less held than sent away.
    A call that takes as long or longer (a slow disk, a burst of writes, a wait for another
    connection's lock) sends the synced calls to the thread, and they stay there until
    ``AGAIN_AFTER`` of them in a row took less: a disk that turns slow holds the loop once,
    then not again while it stays slow.  Only calls that wrote something are counted (the
    twin's ``_timed``): one that changed nothing synced nothing.  ``budget=0`` keeps every
    synced call in the thread.
    """

    AGAIN_AFTER = 100
    """Quick synced calls in a row, in the thread, before they run on the loop again."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.on_loop = budget > 0
        self._quick_in_a_row = 0

    def took(self, seconds: float) -> None:
        """A synced call took ``seconds`` (in the thread or on the loop): where the next one runs."""
        if not seconds < self.budget:  # a budget of 0: no call is quick
            self.on_loop, self._quick_in_a_row = False, 0
        elif not self.on_loop:
            self._quick_in_a_row += 1
            self.on_loop = self._quick_in_a_row >= self.AGAIN_AFTER


def check_loop_budget(loop_budget: object) -> float:
    """``loop_budget`` in seconds (0 or more, infinity allowed), or an error that says so."""
    if isinstance(loop_budget, bool) or not isinstance(loop_budget, (int, float)):
        raise TypeError(f"loop_budget must be a number of seconds, got {type(loop_budget).__name__}: {loop_budget!r:.80}")
    if not loop_budget >= 0:  # also refuses NaN
        raise ValueError(f"loop_budget must be >= 0 seconds, got {loop_budget}")
    try:
        return float(loop_budget)
    except OverflowError:
        raise ValueError("loop_budget is an int too large to be a number of seconds"
                         " (math.inf never sends a synced call to the thread)") from None


class AsyncSqlTransport(AsyncShell):
    """The asyncio twin of a :class:`SyncSqlTransport`: the same connection, core and SQL, with
    each operation carried out in one of two places.

    - **On the loop**: the operations named in ``on_loop``, whose commit does not wait for the
      disk (a statement costs tens of microseconds of CPU there, less than the trip to a
      thread would: docs/performance.md); and the others while their syncs are quick
      (:class:`QuickSyncs`, within ``loop_budget`` seconds).  A lock held by another
      connection is waited for by awaiting (the driver's busy handler is off), so the loop
      never blocks on it.
    - **In the connection's own thread** (:class:`~harel_ref.transport._thread.ConnectionThread`),
      the synced operations once a sync was slow, and always with ``loop_budget=0`` (the
      default here; a subclass's ``create()`` gives its own): the whole operation, every
      statement of it, is one trip there and back.  A subclass may give the thread work of
      its own (checkpoints), and ``close()`` closes the connection there.

    A job in the thread goes on after its caller is cancelled.  So a call's turn begins only
    once the thread is idle: the connection never serves the loop and the thread at once.
    libsql holds the GIL through every call, so a thread would not free the loop for it: its
    twin runs every operation on the loop, its syncs included, and has no thread.  A
    subclass's ``create()`` opens the synchronous transport in a thread and picks the places.
    """

    def __init__(self, sync: SyncSqlTransport, *, on_loop: frozenset[str], thread: bool = True,
                 loop_budget: float = 0.0) -> None:
        # Use create(); __init__ only wraps an open synchronous transport, whose driver must not
        # wait for locks itself if anything is to run on the loop (``_lock_wait_in_python``).
        self._sync = sync
        self.path = sync.path
        self._core = sync._core
        self._clock = sync._clock
        self._on_loop = on_loop
        self._thread = ConnectionThread(f"harel-ref {type(self).__name__} {sync.path}") if thread else None
        self._syncs = QuickSyncs(check_loop_budget(loop_budget) if thread else math.inf)
        self._timer = time.perf_counter  # how long a synced call took (tests give a fake one)
        # One call at a time, from the clock's reading to its answer: a call's time is read
        # when its turn comes, not while it queues, and close() waits for the call before it.
        self._serial = Turns(before=self._idle if thread else None)

    async def _idle(self) -> None:
        """Return once nothing runs in the connection's thread (a cancelled call's job, a
        checkpoint): the turn that begins then has the connection to itself."""
        if self._thread is not None and not self._closed:  # once closed, no call uses it
            await self._thread.idle()

    async def _drive(self, operation: str, steps: Plan[T]) -> T:
        if operation in self._on_loop:
            return await self._sync._drive_on_loop(operation, steps)
        if not self._syncs.on_loop:
            return await self._thread.run(self._timed_drive, operation, steps)
        started, changes = self._timer(), self._sync._conn.total_changes
        try:
            return await self._sync._drive_on_loop(operation, steps)
        finally:
            self._timed(started, changes)

    def _timed_drive(self, operation: str, steps: Plan[T]) -> T:
        """In the thread: a synced call, timed (the next call's turn begins after this)."""
        started, changes = self._timer(), self._sync._conn.total_changes
        try:
            return self._sync._drive(operation, steps)
        finally:
            self._timed(started, changes)

    def _timed(self, started: float, changes: int) -> None:
        """Tell QuickSyncs how long a synced call took, if it wrote anything: a call that
        changed no row (a claim that found nothing, the ack of a lapsed lease) committed no
        page and synced nothing, so it says nothing of the disk."""
        if self._sync._conn.total_changes != changes:
            self._syncs.took(self._timer() - started)

    async def _release(self) -> None:
        if self._thread is None:
            self._sync.close()
            return
        try:
            await self._thread.run(self._sync.close)  # closing checkpoints and syncs: not on the loop
        finally:
            await self._thread.stop()


def one_statement(statement: Statement) -> Plan[Any]:
    """A plan of one statement (for settings such as PRAGMAs)."""
    return (yield statement)
