"""Tables of older harel-ref versions, holding data, to test the in-place upgrade on every SQL
backend (SQLite, libSQL, rqlite): the same statements build them everywhere.

``V4_WITH_DATA`` is schema version 4 as harel-ref wrote it, with four groups whose heads are in
every state a lease can be in at ``NOW``: live, parked, lapsed and free.
:func:`check_upgraded_v4` then drives the upgraded queue and checks that every message comes out
once, in claim order, with the blocked groups still blocked and the old live lease still acking.
"""

from __future__ import annotations

from harel_ref.transport import Lease
from harel_ref.transport._sql import FREE, SCHEMA_VERSION

NOW = 1000.0
"""The fake clock's time when the upgraded queue is opened."""


def names(prefix: str = "") -> tuple[str, str, str]:
    head = f"{prefix}_" if prefix else ""
    return tuple(f"{head}harel_transport_{name}" for name in ("messages", "groups", "meta"))


def seeds_schema(prefix: str = "") -> list[str]:
    """The seeds' tables: no routing_key, no claimable_at, no meta table."""
    messages, groups, _ = names(prefix)
    return [
        f"CREATE TABLE {messages} (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " group_id TEXT NOT NULL, event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)",
        f"CREATE TABLE {groups} (group_id TEXT PRIMARY KEY,"
        " last_claimed_at REAL NOT NULL DEFAULT 0.0, priority INT NOT NULL DEFAULT 0)",
        f"CREATE INDEX {groups}_by_last_claimed ON {groups} (last_claimed_at)",
        f"CREATE INDEX {messages}_by_group ON {messages} (group_id, seq)",
    ]


def first_v5_triggers(prefix: str = "") -> list[str]:
    """The claim's two triggers of the first release of schema version 5 (each updated the
    group's row: one set ``claimable_at``, the other ``last_claimed_at``), in place of the
    current ones.  The same meaning, so the version number stayed 5."""
    messages, groups, _ = names(prefix)
    return [
        f"DROP TRIGGER {messages}_claim_blocks_group",
        f"DROP TRIGGER {messages}_nack_sets_group",
        f"CREATE TRIGGER {messages}_lease_blocks_group AFTER UPDATE OF locked_by, lock_expiry ON {messages} BEGIN"
        f" UPDATE {groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN {FREE} ELSE NEW.lock_expiry END"
        f" WHERE group_id = NEW.group_id; END",
        f"CREATE TRIGGER {messages}_claim_stamps_group AFTER UPDATE OF leased_at ON {messages} BEGIN"
        f" UPDATE {groups} SET last_claimed_at = NEW.leased_at WHERE group_id = NEW.group_id;"
        f" UPDATE {groups} SET claimable_at = {FREE} WHERE claimable_at >= 0 AND claimable_at < NEW.leased_at; END",
    ]


def v4_schema(prefix: str = "") -> list[str]:
    """Schema version 4: the seeds' tables plus routing_key, its index and the meta table."""
    messages, groups, meta = names(prefix)
    return [
        *seeds_schema(prefix),
        f"ALTER TABLE {groups} ADD COLUMN routing_key TEXT",
        f"CREATE INDEX {groups}_by_routing_key ON {groups} (routing_key, last_claimed_at)",
        f"CREATE TABLE {meta} (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        f"INSERT INTO {meta} (key, value) VALUES ('schema_version', 4)",
    ]


LIVE = Lease("leased", "leased-1", 1, "w1:live")
"""The lease a worker held when the queue was upgraded (live until 1010)."""


def v4_with_data(prefix: str = "") -> list[str]:
    """Version 4 holding seven messages in four groups, at ``NOW``:

    - ``leased``: head leased to ``LIVE`` until 1010 (live), then one more message;
    - ``parked``: head parked until 1020;
    - ``lapsed``: head leased until 990 (lapsed), then one more message;
    - ``free``: routing key ``blue``, never claimed, head free, then one more message.
    """
    messages, groups, _ = names(prefix)
    rows = [
        # seq, group, event, locked_by, lock_expiry
        (1, "leased", "leased-1", "'w1:live'", 1010.0),
        (2, "parked", "parked-1", "'__parked__'", 1020.0),
        (3, "lapsed", "lapsed-1", "'w0:old'", 990.0),
        (4, "free", "free-1", "NULL", "NULL"),
        (5, "leased", "leased-2", "NULL", "NULL"),
        (6, "lapsed", "lapsed-2", "NULL", "NULL"),
        (7, "free", "free-2", "NULL", "NULL"),
    ]
    statements = v4_schema(prefix)
    statements += [
        f"INSERT INTO {messages} (seq, group_id, event, locked_by, lock_expiry)"
        f" VALUES ({seq}, '{group}', '{event}', {holder}, {until})"
        for seq, group, event, holder, until in rows
    ]
    statements += [
        f"INSERT INTO {groups} (group_id, last_claimed_at, priority, routing_key)"
        f" VALUES ('{group}', {stamp}, 0, {key})"
        for group, stamp, key in [
            ("leased", 990.0, "NULL"),
            ("parked", 980.0, "NULL"),
            ("lapsed", 995.0, "NULL"),
            ("free", 0.0, "'blue'"),
        ]
    ]
    return statements


EXPECTED_CLAIMABLE_AT = {"leased": 1010.0, "parked": 1020.0, "lapsed": 990.0, "free": FREE}
"""What the upgrade fills in: each head's lease or park end, FREE for a free head."""


def check_upgraded_v4(queue, clock) -> None:
    """Drive the queue opened on :func:`v4_with_data` (clock at ``NOW``) until it is empty."""
    assert clock() == NOW
    first = queue.claim("w", 100.0)  # the never-claimed group goes first
    assert (first.group_id, first.event, first.seq) == ("free", "free-1", 4)
    second = queue.claim("w", 100.0)  # the lapsed lease made its group claimable
    assert (second.group_id, second.event, second.seq) == ("lapsed", "lapsed-1", 3)
    assert queue.claim("w", 100.0) is None  # leased and parked stay blocked
    assert not queue.ack(Lease("lapsed", "lapsed-1", 3, "w0:old"))  # superseded just now
    assert queue.ack(LIVE)  # the lease held across the upgrade still acks
    third = queue.claim("w", 100.0)
    assert (third.group_id, third.event) == ("leased", "leased-2")
    for lease in (first, second, third):
        assert queue.ack(lease)
    clock.now = 1020.5  # the park has lapsed
    delivered = []
    while (lease := queue.claim("w", 100.0)) is not None:
        delivered.append(lease.event)
        assert queue.ack(lease)
    # by last_claimed_at (980, 1000, 1000), the tie by arrival (lapsed before free)
    assert delivered == ["parked-1", "lapsed-2", "free-2"]
    assert queue.claim("w", 100.0) is None


__all__ = ["EXPECTED_CLAIMABLE_AT", "LIVE", "NOW", "SCHEMA_VERSION", "check_upgraded_v4",
           "names", "seeds_schema", "v4_schema", "v4_with_data"]
