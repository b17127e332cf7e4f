"""Tables of older harel-ref versions, holding data, to test the in-place upgrade on every SQL
backend (SQLite, libSQL, rqlite): the same statements build them everywhere.

:func:`v4_with_data` and :func:`v5_with_data` are schema versions 4 and 5 as harel-ref wrote
them, with four groups whose heads are in every state a lease can be in at ``NOW``: live,
parked, lapsed and free.  :func:`check_upgraded` then drives the upgraded queue and checks that
every message comes out once, in claim order, with the blocked groups still blocked and the old
live lease still acking.
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


def v5_schema(prefix: str = "", first_release: bool = False) -> list[str]:
    """Schema version 5, the lease on the message's row: ``groups.claimable_at``, its
    claim-order indexes and the three triggers on the messages that kept it.  The first release
    of version 5 had two claim triggers, each updating the group's row, in place of one."""
    messages, groups, meta = names(prefix)
    claim = (
        f"CREATE TRIGGER {messages}_claim_blocks_group AFTER UPDATE OF leased_at ON {messages} BEGIN"
        f" UPDATE {groups} SET last_claimed_at = NEW.leased_at, claimable_at = NEW.lock_expiry"
        f" WHERE group_id = NEW.group_id;"
        f" UPDATE {groups} SET claimable_at = {FREE} WHERE claimable_at >= 0 AND claimable_at < NEW.leased_at; END",
        f"CREATE TRIGGER {messages}_nack_sets_group AFTER UPDATE OF locked_by, lock_expiry ON {messages}"
        f" WHEN NEW.leased_at IS OLD.leased_at BEGIN UPDATE {groups}"
        f" SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN {FREE} ELSE NEW.lock_expiry END"
        f" WHERE group_id = NEW.group_id; END",
    )
    if first_release:
        claim = (
            f"CREATE TRIGGER {messages}_lease_blocks_group AFTER UPDATE OF locked_by, lock_expiry ON {messages} BEGIN"
            f" UPDATE {groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN {FREE} ELSE NEW.lock_expiry END"
            f" WHERE group_id = NEW.group_id; END",
            f"CREATE TRIGGER {messages}_claim_stamps_group AFTER UPDATE OF leased_at ON {messages} BEGIN"
            f" UPDATE {groups} SET last_claimed_at = NEW.leased_at WHERE group_id = NEW.group_id;"
            f" UPDATE {groups} SET claimable_at = {FREE} WHERE claimable_at >= 0 AND claimable_at < NEW.leased_at; END",
        )
    return [
        f"CREATE TABLE {messages} (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,"
        " event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL, leased_at REAL)",
        f"CREATE TABLE {groups} (group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0.0,"
        f" priority INT NOT NULL DEFAULT 0, routing_key TEXT, claimable_at REAL NOT NULL DEFAULT {FREE})",
        f"CREATE TABLE {meta} (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        f"CREATE INDEX {groups}_claim_order ON {groups} (claimable_at, last_claimed_at)",
        f"CREATE INDEX {groups}_claim_order_by_routing_key ON {groups}"
        " (routing_key, claimable_at, last_claimed_at) WHERE routing_key IS NOT NULL",
        f"CREATE INDEX {messages}_by_group ON {messages} (group_id, seq)",
        *claim,
        f"CREATE TRIGGER {messages}_delete_frees_group AFTER DELETE ON {messages} BEGIN"
        f" DELETE FROM {groups} WHERE group_id = OLD.group_id"
        f" AND NOT EXISTS (SELECT 1 FROM {messages} WHERE group_id = OLD.group_id);"
        f" UPDATE {groups} SET claimable_at = {FREE} WHERE group_id = OLD.group_id; END",
        f"INSERT INTO {meta} (key, value) VALUES ('schema_version', 5)",
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
    return v4_schema(prefix) + _data(prefix)


def v5_with_data(prefix: str = "", first_release: bool = False) -> list[str]:
    """Version 5 (of its first release, or of the later one) holding the data of
    :func:`v4_with_data`, each group's ``claimable_at`` as version 5 kept it."""
    _, groups, _ = names(prefix)
    return v5_schema(prefix, first_release) + _data(prefix) + [
        f"UPDATE {groups} SET claimable_at = {until} WHERE group_id = '{group}'"
        for group, until in EXPECTED_CLAIMABLE_AT.items()
    ]


def _data(prefix: str) -> list[str]:
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
    statements = [
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

EXPECTED_LEASES = {"leased": ("w1:live", 1010.0), "parked": ("__parked__", 1020.0), "lapsed": ("w0:old", 990.0),
                   "free": (None, None)}
"""What the upgrade to version 6 moves onto each group's row: its head's lease."""


def check_upgraded(queue, clock) -> None:
    """Drive the queue opened on :func:`v4_with_data` or :func:`v5_with_data` (clock at ``NOW``)
    until it is empty."""
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


__all__ = ["EXPECTED_CLAIMABLE_AT", "EXPECTED_LEASES", "LIVE", "NOW", "SCHEMA_VERSION", "check_upgraded",
           "names", "seeds_schema", "v4_schema", "v4_with_data", "v5_schema", "v5_with_data"]
