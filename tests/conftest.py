"""Test-suite set-up.

- The Hypothesis profile comes from $HYPOTHESIS_PROFILE (dev by default).
- Tests import their helpers (broken.py, rqlite_support.py) from this folder.
- Certifications run their searches one at a time (HAREL_REF_JOBS=1) unless a test asks.
- In CI (``CI`` set) nothing may be skipped: a skipped test or module (a missing extra, server
  or binary) is reported as a failure, with the skip's reason.
- SIGINT is Python's default, even in a suite started as a background job (which ignores it).
- Every module of the project is imported here, up front.  Hypothesis draws some values from
  the literals of the local modules loaded so far, so without this a derandomized search could
  find a different example depending on which tests ran earlier in the same xdist worker.
"""

import importlib
import os

import pytest
import pkgutil
import sys
import tempfile
from pathlib import Path

from harel_ref.stateful import load_from_env

load_from_env()

# Temporary files in RAM: tmp_path, the bundled transports' files and the example's, here and in
# every command a test starts.  The suite judges answers, not disks: on a disk, waiting for the
# fsync of every commit was about a third of a certification (docs/certify-speed.md).  What a
# killed process leaves is the same on tmpfs (the page cache outlives the process), so the
# SIGKILL tests keep their meaning.  A TMPDIR the caller set is kept.
if not os.environ.get("TMPDIR") and os.access("/dev/shm", os.W_OK):
    os.environ["TMPDIR"] = "/dev/shm"
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again

# Bytecode is cached, whatever the environment says: with PYTHONDONTWRITEBYTECODE set (as on
# the CI machines) every process the suite starts (its workers, the branch processes, the
# commands and pytest runs tests start: hundreds) compiled harel_ref again, and pytest rewrote
# the asserts of every module of the plugin's package again: 2.4 s of CPU for each pytest
# started, against 1.0 s with the caches.  Set before xdist starts its workers, so they inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# pytest -n auto already keeps every core busy: a certification a test makes runs its searches
# one at a time (and so do the commands tests start), unless the test asks for jobs itself.
os.environ.setdefault("HAREL_REF_JOBS", "1")

# A suite started in the background by a non-interactive shell (``pytest ... &`` in a script)
# inherits SIGINT ignored, and so does every command it starts: the certifier leaves an
# inherited SIG_IGN alone (SPEC.md C8), so the tests that send SIGINT, as a terminal's Ctrl-C
# does, would see it lost.  Here SIGINT is Python's default whatever started the suite, and
# the commands tests start inherit the default.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(Path(__file__).parent))


def _import_every_project_module() -> None:
    # harel_ref.model and harel_ref.stateful live in folders of their own (pyproject.toml's
    # package-dir), so walking harel_ref's folder does not reach them: they are named here
    for package_name in ("harel_ref", "harel_ref.model", "harel_ref.stateful", "examples"):
        try:
            package = importlib.import_module(package_name)
        except ImportError:  # examples/ is importable only from the repository's root
            continue
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            try:
                importlib.import_module(module.name)
            except ImportError:  # an optional extra is not installed: its tests say so
                pass


_import_every_project_module()


# --- how many workers `pytest -n auto` starts -----------------------------------------------
# Twice the cores, up to eight more, and a worker for each group of WAITING_GROUPS below: about
# a fifth of the suite's time is spent waiting, not computing (a wall-clock transport's leases
# and parks, the servers' round trips, commands a test starts), and with one worker per core a
# core then idles.  On the 2-core machine the suite took 1,144 s with 2 workers and 964 s with 3
# (the cores idle 21 % of that time); with 4, and two tests made cheaper, 808 s (idle 8 %).  With
# the two groups on 2 of 4 workers, the other two both took tests that wait at the start, and
# the cores idled 17-43 % of its first three minutes; with 6, under 8 % (docs/certify-speed.md).
# PYTEST_XDIST_AUTO_NUM_WORKERS decides where it is set.

@pytest.hookimpl(optionalhook=True)  # -p no:xdist: no such hook
def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(2 * cores, cores + 8) + len(set(WAITING_GROUPS.values()))


# Modules that mostly wait run first, each group on one worker of its own.  The rqlite
# cluster's tests wait for Raft and take turns at the cluster's lock (a fault test holds it
# alone); the SQS tests wait for ElasticMQ's whole-second leases and parks.  Left in the
# alphabet's order they came last, behind the cluster's lock: through the last four and a half
# minutes of a 924 s suite the cores were 13-74 % idle.  Run from the start beside the tests
# that compute, they fill the cores' gaps instead, and each group starts one server, not one
# per worker.
# (xdist's own --dist loadgroup names each test by its group through Item._nodeid, which
# pytest 9.2 no longer reads.)
WAITING_GROUPS = {
    "test_rqlite.py": "rqlite-cluster", "test_rqlite_faults.py": "rqlite-cluster",
    "test_harel_rqlite.py": "rqlite-cluster",
    "test_sqs.py": "sqs-wall-clock", "test_harel_sqs.py": "sqs-wall-clock",
}


def _waiting_group(nodeid: str) -> str | None:
    return WAITING_GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])


def _dist_chosen(config) -> bool:
    """Whether the user gave ``--dist`` (``-n`` alone sets xdist's default, ``load``)."""
    words = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split(),
             *config.getini("addopts")]
    return any(word == "--dist" or word.startswith("--dist=") or word == "-d" for word in words)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n`` without a ``--dist``: xdist's load-by-scope scheduler, where a scope is a
    group of WAITING_GROUPS or else one test.  It hands out the scopes with the most tests
    first, so the groups go first, each to one worker; every other test goes alone to the next
    worker that has two or fewer left.  Where the tests collected are all of one group (or
    of none), each is a scope of its own: a run of test_sqs.py alone keeps every worker."""
    if config.getoption("dist") != "load" or _dist_chosen(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WaitingFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if not hasattr(self, "_mixed"):  # the collection is complete when this is first asked
                self._mixed = len({_waiting_group(each) for each in self.collection}) > 1
            group = _waiting_group(nodeid) if self._mixed else None
            return group or nodeid

    return WaitingFirst(config, log)


def pytest_collection_modifyitems(items):
    """Tests marked ``waits`` first, in their order, then the rest in theirs: a long wait
    starts beside tests that compute, not at the end with the cores idle (the last 70 s of a
    913 s suite were one such test, 9 s of CPU)."""
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)


# --- what each test cost: HAREL_REF_RECORD_DURATIONS=path --------------------------------------
# Writes ``wall-seconds cpu-seconds nodeid`` for each test of 2 s or more, the longest first:
# its setup, call and teardown, and the CPU of its worker and of the children it waited for
# (commands, branch processes), measured in the worker.  Under ``pytest -n auto`` on 2 cores a
# test's wall time is mostly its wait for a core; its CPU says what it costs the suite.
# (Ordering the tests by a file of such times, the longest first, was tried: 910 s against
# 915 s, the workers were busy throughout either way.)

RECORD_DURATIONS_FROM = 2.0  # seconds: shorter tests are not worth a line
_measured: dict[str, list[float]] = {}
_cpu_at_start: dict[str, float] = {}


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_logstart(nodeid):
    if os.environ.get("HAREL_REF_RECORD_DURATIONS"):
        _cpu_at_start[nodeid] = _cpu_seconds()


def _record_duration(report) -> None:
    if os.environ.get("HAREL_REF_RECORD_DURATIONS"):
        wall_and_cpu = _measured.setdefault(report.nodeid, [0.0, 0.0])
        wall_and_cpu[0] += report.duration
        wall_and_cpu[1] += sum(value for name, value in report.user_properties if name == "cpu_seconds")


def pytest_sessionfinish(session):
    target = os.environ.get("HAREL_REF_RECORD_DURATIONS")
    if not target or hasattr(session.config, "workerinput"):  # only the controller writes
        return
    long = sorted(((wall, cpu, nodeid) for nodeid, (wall, cpu) in _measured.items() if wall >= RECORD_DURATIONS_FROM),
                  reverse=True)
    Path(target).write_text("".join(f"{wall:.1f} {cpu:.1f} {nodeid}\n" for wall, cpu, nodeid in long))


# --- machine classes: forgotten after each test ------------------------------------------------
# Hypothesis keeps every state machine class it ran for the life of the process, and the tests
# make many (a focused machine per broken variant), each holding its factory and the stores its
# transports made: a worker's heap grew to well over a million objects, which the garbage
# collector walks again and again.  The certifier forgets its own (hypothesis_apart); the tests
# that run machines themselves are forgotten here.

@pytest.fixture(autouse=True)
def _machine_classes_forgotten():
    from harel_ref.certify._driver import machines_forgotten

    with machines_forgotten():
        yield


# A test that starts branch or search processes outside certify() (which stops its own) starts
# a fork server that would outlive it: later tests would take it for one of the caller's, and
# its CPU, never waited for, would be missing from the suite's `time`.

@pytest.fixture(autouse=True)
def _fork_server_stopped():
    from harel_ref.stateful import _forking

    running_before = _forking.fork_server() is not None
    yield
    if not running_before:
        _forking._stop_fork_server(_forking.STOP_GRACE)


# --- counts: what the fault and bad-input tests measured, printed once at the end -------------
# A test appends ("counts", "one line") or ("fault_counts", "one line") to
# request.node.user_properties; xdist carries them to the controller with the report, so the
# lines reach the CI log even under `pytest -n auto`.

_counts: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    _record_duration(report)
    if report.when == "call":
        _counts.extend((report.nodeid, value) for name, value in report.user_properties if name in ("counts", "fault_counts"))


def pytest_terminal_summary(terminalreporter):
    if _counts:
        terminalreporter.section("counts")
        for nodeid, line in sorted(_counts):
            for part in str(line).splitlines():
                terminalreporter.write_line(f"{nodeid}: {part}")


def _fail_skips_in_ci(report) -> None:
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where nothing may be: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skips_in_ci(outcome.get_result())
    if call.when == "teardown" and item.nodeid in _cpu_at_start:
        outcome.get_result().user_properties.append(("cpu_seconds", _cpu_seconds() - _cpu_at_start.pop(item.nodeid)))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skips_in_ci(outcome.get_result())
