"""The lockstep machine against the SQLite and libSQL transports, sync and async.

Each Hypothesis example gets a fresh namespace, hence a fresh database file in the test's
temporary directory.  A broken SqliteTransport with the seeds' unfenced ack shows that the
machine catches what fencing prevents.
"""

import atexit
import math
import shutil
import tempfile

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from facts_support import property_of
from twin_support import twin_settings
from harel_ref.transport import SqliteTransport
from harel_ref.transport._sql import SqlCore, Statement
from harel_ref.stateful import Backend, Capabilities, Divergence, make_machine
from harel_ref.stateful.backends.sql import database_path, libsql, libsql_async, sqlite, sqlite_async

# The machine classes are built at import, before any fixture exists: one directory per run.
_DIR = tempfile.mkdtemp(prefix="harel-ref-sql-machine-")
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)

TestSqliteMachine = make_machine(sqlite(_DIR)).TestCase
TestAsyncSqliteMachine = make_machine(sqlite_async(_DIR)).TestCase
TestAsyncSqliteOnTheLoopMachine = make_machine(sqlite_async(_DIR, synchronous="NORMAL")).TestCase
# The twin's synced calls run on the loop while syncs are quick, else in its thread: each place
# alone, at FULL (unsynced claims on the loop beside them) and at EXTRA (every call synced).
TestAsyncSqliteSyncsInItsThreadMachine = make_machine(sqlite_async(_DIR, loop_budget=0)).TestCase
TestAsyncSqliteSyncsOnTheLoopMachine = make_machine(sqlite_async(_DIR, loop_budget=math.inf)).TestCase
TestAsyncSqliteInItsThreadMachine = make_machine(sqlite_async(_DIR, synchronous="EXTRA", loop_budget=0)).TestCase
TestAsyncSqliteExtraOnTheLoopMachine = make_machine(sqlite_async(_DIR, synchronous="EXTRA", loop_budget=math.inf)).TestCase
TestLibsqlMachine = make_machine(libsql(_DIR)).TestCase
TestAsyncLibsqlMachine = make_machine(libsql_async(_DIR)).TestCase
for _twin in (TestAsyncSqliteMachine, TestAsyncSqliteOnTheLoopMachine, TestAsyncSqliteSyncsInItsThreadMachine,
              TestAsyncSqliteSyncsOnTheLoopMachine, TestAsyncSqliteInItsThreadMachine,
              TestAsyncSqliteExtraOnTheLoopMachine, TestAsyncLibsqlMachine):
    _twin.settings = twin_settings(_twin.settings)
del _twin  # pytest would collect the last twin again under this name


def _unfenced_ack(t, lease):
    """The seeds' ack: deletes the message whoever holds it now (the trigger frees the group)."""
    return Statement(f"DELETE FROM {t.messages} WHERE seq = ? RETURNING seq", (lease.seq,), fetch=True)


class UnfencedAckCore(SqlCore):
    def ack(self, lease, now):
        return bool((yield _unfenced_ack(self.tables, lease)))


class UnfencedAckSqlite(SqliteTransport):
    """SqliteTransport with the seeds' ``DELETE ... WHERE seq = ?`` ack (no token check)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._core = UnfencedAckCore(self._tables)


def test_machine_catches_the_seeds_unfenced_ack(tmp_path):
    def factory(clock, namespace):
        return UnfencedAckSqlite(database_path(tmp_path, namespace, "unfenced"), clock=clock)

    machine = make_machine(Backend("unfenced-sqlite", factory, Capabilities(durable=True, shared=True)))
    with pytest.raises(Divergence) as caught:
        run_state_machine_as_test(
            machine,
            # No shrinking: each example opens database files, and the first failure is enough.
            settings=settings(max_examples=500, derandomize=True, database=None, deadline=None,
                              report_multiple_bugs=False, phases=[Phase.generate]),
        )
    assert property_of(caught.value) == "fencing", str(caught.value)
