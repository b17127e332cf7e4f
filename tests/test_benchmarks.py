"""The benchmark scripts run to their end and print every row (their figures are not judged:
speed is measured by running them, never in tests).  Tiny sizes keep this a few seconds."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_peers_prints_every_peer_and_every_scenario():
    from rqlite_support import cluster_lock

    with cluster_lock(exclusive=False):  # its latency table claims on the cluster: no fault test meanwhile
        result = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--rounds", "1", "--opens", "2", "--messages", "200",
             "--groups", "20", "--samples", "5", "--scale", "0.01", "--event-bytes", "50,108"],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    skipped = [line for line in out.splitlines() if line.startswith("# skipped")]
    if os.environ.get("CI"):  # CI installs every peer and starts the cluster: nothing may be missing
        assert not skipped, skipped
    rows = ["harel-ref SqliteTransport", "harel-ref AsyncSqliteTransport", "harel-ref LibsqlTransport",
            "harel-ref AsyncLibsqlTransport", "harel 0.9.0 SqliteTransport", "harel 0.9.0 AsyncSqliteTransport",
            "harel 0.9.0 LibsqlTransport", "harel 0.9.0 AsyncLibsqlTransport", "persist-queue", "litequeue", "raw limit"]
    opens = r"\| [\d,]+ \| [\d,]+ \| [\d,]+ \| \**[\d.]+\** \| [\d,]+ \([\d,]+\) \| [\d.]+ \([\d.]+\) \|"  # min, median, max, ...
    for level in ("FULL", "EXTRA", "NORMAL"):  # each table once per level and event size, in that order
        for event_bytes in (50, 108):
            table = out[out.index(f"| synchronous={level}, {event_bytes}-byte events: claim+ack"):]
            table = table[:table.index("\n\n")]
            for row in rows:
                assert re.search(rf"^\| {re.escape(row)}[^|]*{opens}", table, re.MULTILINE) or any(
                    row.split()[0] in line for line in skipped), (level, row, out)
            assert re.search(r"^\| harel-ref AsyncSqliteTransport \|.*\| [\d.]+ \([\d.]+\) \|$", table, re.MULTILINE), table
            # the goals of issues 22 and 43: at FULL and NORMAL
            assert (f"| synchronous={level}, {event_bytes}-byte events: goal |" in out) == (level != "EXTRA")
        assert f"| synchronous={level}: where a claim+ack goes" in out
        latency = out[out.index(f"| synchronous={level}: claim latency"):]
        for scenario in "abcd":
            assert re.search(rf"^\| \({scenario}\) .*\| [\d,]+ \(", latency, re.MULTILINE), (scenario, out)
    assert "page faults per 10,000 claim+acks, the most of any open of a harel-ref peer" in out
    for event_bytes in (50, 108):  # harel-ref at EXTRA and FULL beside harel 0.9.0 at FULL
        table = out[out.index(f"| like with like, {event_bytes}-byte events: claim+ack"):]
        for transport in ("SqliteTransport", "AsyncSqliteTransport", "LibsqlTransport", "AsyncLibsqlTransport"):
            for who in (f"harel-ref {transport} EXTRA", f"harel-ref {transport} FULL", f"harel 0.9.0 {transport} FULL"):
                assert re.search(rf"^\| {re.escape(who)}[^|]*{opens}", table, re.MULTILINE) or skipped, (who, out)
    assert re.search(r"^\| harel-ref SqliteTransport \| [\d.]+ \| [\d.]+ \| [\d,]+ \|$", out, re.MULTILINE), out  # WAL frames
    assert "| total |" in out and "load average" in out


def test_thread_hop_prints_every_way_and_both_drivers():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "thread_hop.py"), "--rounds", "1", "--calls", "50"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for way in ["inline (no trip)", "asyncio.to_thread", "run_in_executor, a one-thread pool",
                "own thread, call_soon_threadsafe", "ConnectionThread (eventfd)"]:
        for job in ["nothing", "write 2 KiB and fsync"]:
            assert re.search(rf"^\| {re.escape(way)}[^|]* \| {job} \| [\d,.]+ \(", out, re.MULTILINE), (way, job, out)
    assert re.search(r"^\| aiosqlite[^|]* \| nothing \| [\d,.]+ \(", out, re.MULTILINE), out
    for driver in ["stdlib sqlite3", "libsql"]:
        assert re.search(rf"^\| {driver} \| [\d.]+ \| \d+ \| [\d.]+ \|$", out, re.MULTILINE), (driver, out)
    assert "load average" in out


def test_overlap_prints_every_transport_in_every_way_of_running_branches():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overlap.py"), "--runs", "3", "--rounds", "1"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for row in ["SqliteTransport", "AsyncSqliteTransport", "PublishGroupFirstApart", "AckDropsItsGroupApart",
                "AckCheckThenDelete", "ClaimWithoutTransaction"]:
        for mode in ["threads" if "Async" not in row else "tasks", "processes", "processes, barrier only"]:
            assert re.search(rf"^\| [^|]*{row}[^|]* \| {mode} \| +[\d.]+ % \| ", out, re.MULTILINE), (row, mode, out)
    assert "load average" in out


def test_servers_prints_every_peer_at_every_worker_count_and_both_scenarios():
    from server_support import require_mongo

    require_mongo(motor=False)
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "servers.py"), "--rounds", "1", "--seconds", "0.2",
         # a message a group: with nine tenths drained, 20 groups are left, more than the 16
         # workers hold at once, so no claim finds nothing ("ran out of messages"), at any load
         "--messages", "200", "--groups", "200", "--samples", "3", "--scale", "0.002"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for row in ["harel-ref PostgresTransport", "harel 0.9.0 PostgresTransport", "plain SKIP LOCKED job table",
                "harel-ref RedisTransport", "harel 0.9.0 RedisTransport", "plain LMOVE reliable queue",
                "harel-ref MongoTransport", "harel 0.9.0 MongoTransport", "plain find_one_and_update job collection",
                "harel-ref SqsTransport", "harel 0.9.0 SqsTransport", "plain ReceiveMessage + DeleteMessage"]:
        assert re.search(rf"^\| {re.escape(row)}[^|]*(\| [\d,]+ \([^|]*){{3}}\|$", out, re.MULTILINE), (row, out)
    for scenario in "ac":
        assert re.search(rf"^\| \({scenario}\) (\| [\d,]+ \([^|]*){{6}}\|$", out, re.MULTILINE), (scenario, out)
    assert "load average" in out and "fsync on" in out and "mongo-java-server 1.47.0" in out


def _worktrees() -> set[str]:
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return {line for line in listed.stdout.splitlines() if line.startswith("worktree ")}


def test_certify_speed_prints_both_tables_before_and_after():
    worktrees = _worktrees()
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "certify_speed.py"), "--before", "HEAD", "--transports", "memory",
         "--profiles", "quick/10", "--jobs", "2", "--kill-seeds", "1", "--variants", "1"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^memory +quick/10 +[\d.]+ s passed \(quick/10\) +[\d.]+ s passed \(quick/10\) +"
                     r"[\d.]+ s passed \(quick/10\) +[\d.]+ s passed \(quick/10\) +[\d.]+x", out, re.MULTILINE), out
    rows = [line for line in out.splitlines() if re.search(r"^\S.* (bad-input|fifo|fencing|no-loss|fairness|"
                                                          r"lease-expiry|parking|single-in-flight|priority-floor|"
                                                          r"routing|durability|close|tie-break|contention) ", line)]
    assert len(rows) == 1 and all(re.search(r"[\d.]+ / +[\d.]+|never", row) for row in rows), out
    assert "median over the variants" in out and "load average at the end" in out
    assert not {tree for tree in _worktrees() - worktrees if "certify-speed-before" in tree}  # its own, removed
    assert "median of every kill (a miss counts as never)" in out


def test_transport_calls_prints_every_transport_and_call_before_and_now():
    worktrees = _worktrees()
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "transport_calls.py"), "--before", "HEAD", "--messages", "200",
         "--rounds", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for transport in ("memory", "sqlite", "sqlite-async"):
        for call in ("publish", "claim+ack"):
            assert re.search(rf"^{re.escape(transport)} +{re.escape(call)} +[\d.]+ \([\d.-]+\) +[\d.]+ \([\d.-]+\) +"
                             r"[\d.]+x$", out, re.MULTILINE), (transport, call, out)
    assert "load average at the end" in out
    assert not {tree for tree in _worktrees() - worktrees if "transport-calls-" in tree}  # its own, removed


def test_model_scale_prints_every_size_with_its_spread():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_scale.py"), "--repeats", "1"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for groups in ["10", "100", "1,000", "10,000"]:
        assert re.search(rf"^\| {groups} \| [\d.]+ / [\d.]+ / [\d.]+ \| ", result.stdout, re.MULTILINE), result.stdout
    assert "load average" in result.stdout


def test_caller_stack_prints_each_way_with_its_spread_over_the_depths():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "caller_stack.py"), "--transports", "memory-async",
         "--depths", "0,3", "--examples", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for way in ("search thread", "caller's thread"):
        assert re.search(rf"^\| memory-async \| {way} \| [\d.]+ / [\d.]+ / [\d.]+ \| [\d,]+ / [\d,]+ / [\d,]+ \| "
                         r"[\d.]+ [\d.]+ [\d.]+ \|$", result.stdout, re.MULTILINE), result.stdout
    assert "load average at start" in result.stdout and "load average at the end" in result.stdout


def test_branches_prints_each_width_on_each_transport():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "branches.py"), "--programs", "30", "--runs", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| (\d) \| \d+ \| ([a-z ]+) \| [\d.]+ / [\d.]+ / [\d.]+ \| [\d.]+ / [\d.]+ / [\d.]+ "
                      r"\| \d+ of \d+ \|$", result.stdout, re.MULTILINE)
    widths = {int(width) for width, _ in rows}
    assert widths == {2, 3, 4, 5, 6}, result.stdout  # the draws are derandomized: every width comes
    assert sorted(rows) == sorted((str(w), t) for w in widths for t in ("memory", "sqlite", "refuses a fourth"))
    assert "load average at the start" in result.stdout and "load average at the end" in result.stdout


def test_regression_tests_prints_a_row_per_variant_and_the_totals():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "regression_tests.py"), "--variants", "unfenced ack",
         "routing keys ignored", "panics"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("unfenced ack", "routing keys ignored", "panics"):
        assert re.search(rf"^\| {name} \| \w[\w-]* \| failed \(quick, seed 0\) \| [\d.]+ \| \d+ \| \d+ \|  \| failed \| "
                         r"passed \|  \|$", result.stdout, re.MULTILINE), result.stdout
    assert "3 variants, 3 failed their property, 3 got a regression test, 3 of those fail" in result.stdout
    assert "load average before" in result.stdout and "load average after" in result.stdout


def test_initialize_rules_prints_both_ways_and_the_same_choices():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "initialize_rules.py"), "--repeats", "1",
                             "--examples", "10", "--shapes", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| (.+) \(\d+ examples\) \| ([\d.]+) / [\d.]+ / [\d.]+ \| [\d.]+ / [\d.]+ / [\d.]+ \| [\d.]+ \| (\w+) \|$",
                      result.stdout, re.MULTILINE)
    assert [(name, same) for name, _, same in rows] == [
        ("in-memory, passes (searched)", "yes"), ("group ids fold case (searched, shrunk)", "yes")], result.stdout
    assert "load average at the start" in result.stdout and "load average at the end" in result.stdout


def test_harel_matrix_prints_each_class_with_its_failures_mapped_to_findings(tmp_path):
    """Two properties of one class, for speed: the row, its time and load, each failure with
    the finding docs/harel-0.9.md gives for it, and the file asked for."""
    out = tmp_path / "matrix.md"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "harel_matrix.py"), "--classes", "harel-memory", "--profile",
         "quick/10", "--only", "close", "--only", "bad-input", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert re.search(r"^\| `harel-memory` \| unknown \| \*\*failed\*\* \|(  \|){13} \*\*FAIL\*\* \| \*\*FAIL\*\* \| "
                     r"\d+ s \| [\d. ]+ → [\d. ]+ \|$", text, re.MULTILINE), text
    assert re.search(r"^\| `harel-memory` \| close \| 4 \| .*after close\(\)", text, re.MULTILINE), text
    assert re.search(r"^\| `harel-memory` \| bad-input \| 5 \| ", text, re.MULTILINE), text
    assert "0 failure(s) that no finding of docs/harel-0.9.md covers; 0 class(es) without a report" in text
    assert out.read_text() == text  # what it printed


def test_harel_matrix_lists_a_failure_no_finding_covers_as_new():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import harel_matrix
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    row = {"name": "harel-sqlite-async", "report": {"properties": [
        {"property": "tie-break", "verdict": "failed", "reason": "claim(...): the model allows 'g2'"},
        {"property": "close", "verdict": "failed", "reason": "publish after close()"},
        {"property": "fifo", "verdict": "passed", "reason": "120 examples"}]}}
    nul = {"name": "harel-postgres", "report": {"properties": [
        {"property": "event-integrity", "verdict": "failed", "reason": "publish(...) raised: DataError: NUL (0x00)"},
        {"property": "fifo", "verdict": "failed", "reason": "claim(...): the model allows the head of 'g\\x00'"}]}}
    lines, new = harel_matrix.failures_by_finding([row, nul])
    assert new == 1 and lines[2:] == [
        "| `harel-sqlite-async` | tie-break | **new**: no finding covers it | claim(...): the model allows 'g2' |",
        "| `harel-sqlite-async` | close | 4 | publish after close() |",
        "| `harel-postgres` | event-integrity | 22 | publish(...) raised: DataError: NUL (0x00) |",
        "| `harel-postgres` | fifo | 22 | claim(...): the model allows the head of 'g\\x00' |"]
    consequence = {"property": "fencing", "verdict": "unknown", "reason": "a consequence of no-loss's failure: ..."}
    assert [harel_matrix._cell(entry) for entry in (consequence, {**consequence, "reason": "interrupted"}, None)] == [
        "(no-loss)", "?", ""]
