"""Shared by the rqlite test modules: is the cluster there, and who may break it.

The rqlite tests share one live cluster with every xdist worker.  Fault tests (which kill or
cut off nodes) must not run while other rqlite tests are talking to the cluster, or those would
fail for reasons of no concern to them.  A file lock in /tmp orders them: ordinary rqlite tests
hold it *shared* for their whole duration, a fault test holds it *exclusive*, so a fault test
waits for the running rqlite tests to finish and blocks new ones until the cluster is healed.
Tests that do not touch rqlite take no lock and run alongside.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import warnings
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from harel_ref.stateful.backends.rqlite import cluster_urls, drop_opened_tables

__all__ = ["LOCK_PATH", "cluster_lock", "rerun_after_an_election", "require_cluster", "shared_cluster"]

LOCK_PATH = os.path.join(tempfile.gettempdir(), "harel-ref-rqlite-cluster.lock")


def _ready(url: str) -> str | None:
    """None if the node answers /readyz with a leader, else what went wrong."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/readyz", timeout=3) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError as exc:
        return str(getattr(exc, "reason", exc))


def require_cluster() -> list[str]:
    """The cluster's node URLs; skip the test if no node is ready (fail it on CI)."""
    urls = cluster_urls()
    problems = [problem for problem in map(_ready, urls) if problem is not None]
    if len(problems) < len(urls):
        return urls
    message = f"no rqlite cluster at {', '.join(urls)} ({problems[0]}): start it with `bash .ci/cluster up`"
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(message + " (on CI a missing cluster is an error)", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def cluster_lock(exclusive: bool) -> Iterator[None]:
    """Hold the cluster lock: shared for ordinary tests, exclusive for fault tests."""
    with open(LOCK_PATH, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def shared_cluster() -> Iterator[list[str]]:
    """For every test of a module that imports it: the cluster is there, no fault test runs
    meanwhile, and the tables the test opened through the backends are dropped after it."""
    with cluster_lock(exclusive=False):
        urls = require_cluster()
        try:
            yield urls
        finally:
            drop_opened_tables()


ELECTION = ("leadership lost while committing", "leader not found", "not leader")
"""What rqlite says when a Raft election cut a request off (harel_ref/transport/rqlite.py's
table of failures): the outcome of a write it was part of is unknown."""


def _cut_off_by_an_election(error: BaseException) -> bool:
    """Whether ``error``, or one it wraps (Hypothesis's FlakyFailure is an exception group), is
    a call of unknown outcome or refused because the cluster was electing a leader."""
    from harel_ref.transport import OutcomeUnknownError, StorageError

    seen, pending = set(), [error]
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, (OutcomeUnknownError, StorageError)) and any(text in str(error) for text in ELECTION):
            return True
        pending += [*getattr(error, "exceptions", ()), *filter(None, (error.__cause__, error.__context__))]
    return False


def rerun_after_an_election(case: type) -> type:
    """``case``, a lockstep machine's TestCase, run once more from its start when an election of
    the cluster cut a call off (its outcome unknown, so the model cannot follow it).  With the
    suite on both cores a leader starved of CPU for three seconds loses its followers, and one
    fault test's healed node may call an election a while after the cluster settled (docs/
    cluster.md); neither is what the machine tests.  A second election fails the test."""
    run = case.runTest

    def runTest(self) -> None:  # noqa: N802 (unittest's name)
        try:
            run(self)
        except Exception as error:
            if not _cut_off_by_an_election(error):
                raise
            warnings.warn(f"{case.__name__}: run again from its start after an election cut a call off: "
                          f"{str(error).splitlines()[0][:300]}", stacklevel=1)
            run(self)

    case.runTest = runTest
    return case
