"""The seeds' SqliteTransport, taken literally, as a third party would write it.

This follows ``seeds/001_*.txt`` (the upstream SqliteTransport page) statement by statement,
over the standard library's ``sqlite3``, and adds only what the harel-ref Protocol needs to
run at all: a ``clock`` argument, ``routing_key``, and a ``token`` field in the Lease.  It
keeps the seeds' choices that harel-ref's SPEC.md departs from:

- ``ack`` is ``DELETE ... WHERE seq = ?``: unfenced.  A worker whose lease lapsed and was
  taken over can still delete the message another worker is processing (SPEC.md R10).
- ``nack`` is ``UPDATE ... WHERE seq = ?``, with no check of who holds the message.
- ``locked_by`` holds the worker id, not a per-claim token; the Lease's ``token`` is made up
  for the Protocol and never checked.
- Arguments are not validated (SPEC.md R13): whatever sqlite3 accepts is written.

Certify it from the repository root::

    harel-ref certify examples.seeds_sqlite:factory

``REPORT.md`` beside this file is what the certifier says (regenerate it with
``harel-ref certify examples.seeds_sqlite:factory --report-dir examples/seeds_sqlite``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import shutil
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

from harel_ref.transport import Lease
from harel_ref.stateful import Capabilities

__all__ = ["HAREL_CAPABILITIES", "SeedsSqliteTransport", "factory"]

PARKED = "__parked__"

SCHEMA = """
CREATE TABLE IF NOT EXISTS harel_transport_messages (
  seq          INTEGER PRIMARY KEY AUTOINCREMENT,
  group_id     TEXT NOT NULL,
  event        TEXT NOT NULL,
  locked_by    TEXT,
  lock_expiry  REAL
);
CREATE TABLE IF NOT EXISTS harel_transport_groups (
  group_id        TEXT PRIMARY KEY,
  last_claimed_at REAL NOT NULL DEFAULT 0.0,
  priority        INT  NOT NULL DEFAULT 0,
  routing_key     TEXT
);
CREATE INDEX IF NOT EXISTS harel_transport_groups_by_last_claimed
  ON harel_transport_groups (last_claimed_at);
CREATE INDEX IF NOT EXISTS harel_transport_groups_by_routing_key
  ON harel_transport_groups (routing_key, last_claimed_at);
CREATE INDEX IF NOT EXISTS harel_transport_messages_by_group
  ON harel_transport_messages (group_id, seq);
"""

CLAIM = """
SELECT m.seq, m.group_id, m.event
  FROM harel_transport_groups g
  JOIN harel_transport_messages m
    ON m.seq = (SELECT MIN(seq) FROM harel_transport_messages WHERE group_id = g.group_id)
 WHERE g.priority >= ?
   {routing}
   AND NOT EXISTS (
     SELECT 1 FROM harel_transport_messages x WHERE x.group_id = g.group_id
        AND x.locked_by IS NOT NULL AND x.lock_expiry >= ?)
 ORDER BY g.last_claimed_at, g.rowid
 LIMIT 1
"""


class SeedsSqliteTransport:
    """The seeds' durable queue over stdlib sqlite3 (WAL, ``BEGIN IMMEDIATE`` claims)."""

    def __init__(self, path: str | Path, clock=time.time) -> None:
        self._clock = clock
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.executescript(SCHEMA)

    def publish(self, group_id, event, priority=0, routing_key=None):
        self._conn.execute(
            "INSERT INTO harel_transport_messages (group_id, event) VALUES (?, ?)", (group_id, event)
        )
        self._conn.execute(
            "INSERT OR IGNORE INTO harel_transport_groups (group_id, priority, routing_key)"
            " VALUES (?, ?, ?)",
            (group_id, priority, routing_key),
        )

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        now = self._clock()
        routing, params = "", [min_priority]
        if routing_keys is not None:
            keys = list(routing_keys)
            routing = f"AND g.routing_key IN ({', '.join('?' for _ in keys)})"
            params += keys
        params.append(now)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            row = self._conn.execute(CLAIM.format(routing=routing), params).fetchone()
            if row is None:
                self._conn.execute("COMMIT")
                return None
            seq, group_id, event = row
            self._conn.execute(
                "UPDATE harel_transport_groups SET last_claimed_at = ? WHERE group_id = ?",
                (now, group_id),
            )
            self._conn.execute(
                "UPDATE harel_transport_messages SET locked_by = ?, lock_expiry = ? WHERE seq = ?",
                (worker_id, now + visibility, seq),
            )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return Lease(group_id, event, seq, f"{worker_id}:{uuid.uuid4().hex}")

    def ack(self, lease):
        deleted = self._conn.execute(
            "DELETE FROM harel_transport_messages WHERE seq = ?", (lease.seq,)
        ).rowcount
        self._conn.execute(
            "DELETE FROM harel_transport_groups WHERE group_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM harel_transport_messages WHERE group_id = ?)",
            (lease.group_id, lease.group_id),
        )
        return deleted > 0

    def nack(self, lease, delay=0):
        if delay > 0:
            holder, expiry = PARKED, self._clock() + delay
        else:
            holder, expiry = None, None
        updated = self._conn.execute(
            "UPDATE harel_transport_messages SET locked_by = ?, lock_expiry = ? WHERE seq = ?",
            (holder, expiry, lease.seq),
        ).rowcount
        return updated > 0

    def close(self):
        self._conn.close()


@functools.cache
def _directory() -> Path:
    """Where the factory keeps its files: made on first use, removed when the process exits."""
    directory = tempfile.mkdtemp(prefix="seeds-sqlite-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return Path(directory)


def factory(clock, namespace):
    """One database file per namespace: the same namespace reopens the same file."""
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return SeedsSqliteTransport(_directory() / f"{digest}.db", clock=clock)


HAREL_CAPABILITIES = Capabilities(durable=True, shared=True)
"""What the design supports: priority, routing keys, parking, claim-stamped fairness, an
injectable clock; a file survives close and reopen, and two connections share it."""
