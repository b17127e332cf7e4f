"""`harel-ref certify` and the pytest plugin: exit codes, reports, agreement, documentation."""

import concurrent.futures
import dataclasses
import io
import itertools
import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harel_ref._cli import build_parser, main
from harel_ref.certify._target import remove_directory
from harel_ref.pytest_plugin import pytest_addoption
from harel_ref.certify import certify
from harel_ref.certify._signals import stopped_by
from harel_ref.stateful import Capabilities
from harel_ref.stateful._properties import PROPERTIES
from harel_ref.stateful.backends.memory import memory

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SEEDS = "examples.seeds_sqlite:factory"


def _report(directory):
    data = json.loads((Path(directory) / "report.json").read_text())
    return {p["property"]: p["verdict"] for p in data["properties"]}, data


def test_certify_alone_certifies_bundled_sqlite(tmp_path):
    code = main(["certify", "--profile", "quick", "--only", "fifo", "--only", "close",
                 "--quiet", "--report-dir", str(tmp_path)])
    verdicts, data = _report(tmp_path)
    assert code == 0
    assert data["transport"] == "bundled sqlite"
    assert verdicts == {"fifo": "passed", "close": "passed"}


def test_exit_code_1_when_a_property_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    code = main(["certify", SEEDS, "--profile", "quick", "--only", "bad-input", "--quiet",
                 "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "--only bad-input" in out  # how to replay the failure
    assert (tmp_path / "REPORT.md").exists()


@pytest.mark.parametrize("argv", [
    ["certify", "no_such_module:factory"],
    ["certify", "examples.seeds_sqlite"],  # no :factory
    ["certify", "examples.seeds_sqlite:nothing"],
    ["certify", SEEDS, "--bundled", "memory"],
    ["certify", "--bundled", "memory", "--fairness", "unspecified", "--time-budget", "-1"],
])
def test_exit_code_2_on_usage_errors(argv, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(ROOT)
    assert main([*argv, "--report-dir", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err


def test_exit_code_2_for_a_module_that_fails_on_import_or_a_factory_that_cannot_open(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "fails_on_import.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "opens_nothing.py").write_text("def factory(clock, namespace):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    reports = str(tmp_path / "reports")
    assert main(["certify", "fails_on_import:factory", "--report-dir", reports]) == 2
    assert "boom at import" in capsys.readouterr().err
    assert main(["certify", "opens_nothing:factory", "--report-dir", reports]) == 2
    assert "could not open and close a transport" in capsys.readouterr().err


def test_exit_code_2_for_an_unwritable_report_dir(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["certify", "--bundled", "memory", "--report-dir", str(blocker / "reports")]) == 2
    assert "--report-dir" in capsys.readouterr().err


def test_plugin_refuses_a_factory_that_cannot_open_before_running_anything(tmp_path):
    (tmp_path / "opens_nothing.py").write_text("def factory(clock, namespace):\n    return None\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--harel-transport", "opens_nothing:factory", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "could not open and close a transport" in run.stderr


def test_exit_code_2_from_argparse_for_unknown_choices():
    with pytest.raises(SystemExit) as exited:
        main(["certify", "--only", "speed"])
    assert exited.value.code == 2


def test_exit_code_3_when_cut_short(tmp_path):
    code = main(["certify", "--bundled", "sqlite", "--profile", "thorough", "--time-budget", "0.3",
                 "--quiet", "--report-dir", str(tmp_path)])
    verdicts, _ = _report(tmp_path)
    assert code == 3 and "unknown" in verdicts.values()


def test_capability_flags_override_what_the_factory_declares(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["certify", SEEDS, "--profile", "quick", "--only", "durability", "--only", "routing",
                 "--no-durable", "--no-routing", "--quiet", "--report-dir", str(tmp_path)])
    verdicts, data = _report(tmp_path)
    assert code == 0  # every selected property not applicable
    assert verdicts == {"durability": "not applicable", "routing": "not applicable"}
    assert data["capabilities"]["shared"] is True  # still as declared by HAREL_CAPABILITIES


# A failure of the seeds' design and three passing properties.  The whole certification, twice,
# took four minutes of the suite's time, most of it shrinking the two failures on disk.
AGREE_ON = ["fencing", "fifo", "tie-break", "close"]


def test_cli_and_pytest_plugin_agree_on_the_seeds_example(tmp_path):
    cli = subprocess.run(
        ["harel-ref", "certify", SEEDS, "--profile", "quick/1", "--report-dir", str(tmp_path),
         *(f"--only={prop}" for prop in AGREE_ON)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 1, cli.stderr
    cli_verdicts, _ = _report(tmp_path)
    cli_verdicts = {prop: verdict for prop, verdict in cli_verdicts.items() if verdict != "not selected"}
    assert sorted(cli_verdicts) == sorted(AGREE_ON)

    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "--harel-transport", SEEDS, "--harel-profile", "quick/1",
         *(f"--harel-only={prop}" for prop in AGREE_ON), "-rA", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert plugin.returncode == 1, plugin.stdout[-3000:]
    pytest_verdicts = {}
    for outcome, prop in re.findall(r"^(PASSED|FAILED) harel-certify::([a-z-]+)", plugin.stdout, re.M):
        pytest_verdicts[prop] = outcome.lower()
    for prop, verdict in re.findall(r"^SKIPPED .*?: ([a-z-]+): (not applicable|unknown)", plugin.stdout, re.M):
        pytest_verdicts[prop] = verdict
    assert pytest_verdicts == cli_verdicts
    assert cli_verdicts["fencing"] == "failed"  # the seeds' design
    assert cli_verdicts["fifo"] == cli_verdicts["tie-break"] == cli_verdicts["close"] == "passed"

    # The committed report (the whole certification) was made by the certifier and still says
    # the same of these properties.
    committed = (ROOT / "examples" / "seeds_sqlite" / "REPORT.md").read_text()
    table = dict(re.findall(r"^\| ([a-z-]+) \| (?:contract|strict) \| \*\*([a-z ]+)\*\* \|", committed, re.M))
    assert len(table) == len(PROPERTIES)
    assert {prop: table[prop] for prop in AGREE_ON} == cli_verdicts


def test_every_cli_option_is_documented():
    parser = build_parser()
    certify_parser = parser._subparsers._group_actions[0].choices["certify"]
    section = README.split("## Certify your transport", 1)[1].split("\n## ", 1)[0]
    missing = [
        option
        for action in certify_parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help") and f"`{option}" not in section
    ]
    assert not missing, f"document these options in README.md's 'Certify your transport': {missing}"


def test_every_pytest_plugin_option_is_documented():
    options = []

    class Group:
        def addoption(self, *names, **kwargs):
            options.extend(names)

    class Parser:
        def getgroup(self, *args):
            return Group()

    pytest_addoption(Parser())
    section = README.split("## Certify your transport", 1)[1].split("\n## ", 1)[0]
    assert options and not [o for o in options if f"`{o}" not in section]


def test_every_capability_is_documented():
    section = README.split("## Certify your transport", 1)[1].split("\n## ", 1)[0]
    missing = [f.name for f in dataclasses.fields(Capabilities) if f"`{f.name}`" not in section]
    assert not missing, f"document these capabilities in README.md: {missing}"


def test_a_new_reader_finds_how_to_certify_in_the_first_30_lines_of_the_readme():
    """Issue 44: what harel-ref is, then the three lines a transport author types (install,
    certify, read the report), before the CI block and the reference sections."""
    first = README.splitlines()[:30]
    commands = [line for line in first if re.match(r"(python3 |harel-ref certify |less reports/)", line)]
    assert len(commands) == 3 and "pip install" in commands[0], first
    assert re.match(r"harel-ref certify \w[\w.]*:\w+", commands[1]) and "REPORT.md" in commands[2], commands
    assert "flight" in "\n".join(first[:8])  # it says what a transport promises before anything else
    assert README.index("<!-- ci:begin -->") > len("\n".join(first))


# --- what `harel-ref certify` prints: a header, each verdict once (issue 12) -------------------


def _verdict_lines(text, prop):
    return re.findall(rf"^  {re.escape(prop)} +(passed|failed|not applicable|unknown) ", text, re.M)


def test_certify_prints_a_header_then_each_verdict_once(tmp_path, capsys):
    code = main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "fifo", "--only", "routing",
                 "--only", "close", "--no-routing", "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    header = out.split("\n\n", 1)[0]
    assert header.startswith("harel-ref certify bundled memory (sync; ")
    assert "profile quick: 50 examples × 20 steps per lockstep search, 20 programs × 20 runs" in header
    assert "properties: 2 to search (fifo, close); not applicable: routing" in header
    assert re.search(r"^expected time: about \d+ (s|min)", header, re.M)
    for prop, verdict in (("fifo", "passed"), ("routing", "not applicable"), ("close", "passed")):
        assert _verdict_lines(out, prop) == [verdict], out
    assert "\r" not in out and "\033" not in out  # not a terminal: no live line
    assert "outcome at the harel-ref strict level: passed" in out


def test_certify_quiet_prints_each_verdict_once_at_the_end(tmp_path, capsys):
    main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "fifo", "--quiet",
          "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert not out.startswith("harel-ref certify")  # no header
    assert _verdict_lines(out, "fifo") == ["passed"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _screen(written: str) -> str:
    """What a terminal shows for ``written``: each line as its last carriage return left it."""
    return "\n".join(line.rsplit("\r", 1)[-1].replace("\033[K", "") for line in written.split("\n"))


def test_on_a_terminal_the_searched_property_has_a_live_line_replaced_by_its_verdict(monkeypatch):
    from harel_ref._cli import Console
    from harel_ref.certify import Profile, certify
    from harel_ref.stateful.backends import load

    terminal = _Terminal()
    console = Console(terminal)
    monkeypatch.setattr(Console, "REDRAW", 0.0)  # draw every example
    backend = load("memory")()
    certify(backend.factory, backend.capabilities, profile=Profile("tiny", 5, 5, programs=3, repeats=2),
            properties=["fifo", "contention"], progress=console)
    written = terminal.getvalue()
    assert "\r\033[K  fifo              lockstep search: examples 5/5 · " in written
    assert "\r\033[K  contention        concurrent search: programs 3/3 · " in written
    shown = _screen(written)
    for prop in ("fifo", "contention"):
        assert _verdict_lines(shown, prop) == ["passed"], shown
    assert "search:" not in shown  # every live line was replaced


def test_an_interrupted_run_writes_the_report_so_far_then_stops(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT / "tests")  # broken:interrupted_on_nack
    code = main(["certify", "broken:interrupted_on_nack", "--profile", "quick", "--only", "priority-floor",
                 "--only", "fifo", "--only", "close", "--report-dir", str(tmp_path)])
    assert code == 130  # as Ctrl-C: 128 + SIGINT
    verdicts, data = _report(tmp_path)
    assert verdicts == {"priority-floor": "passed", "fifo": "unknown", "close": "unknown"}
    assert data["properties"][1]["reason"] == "interrupted: the certification was stopped by KeyboardInterrupt"
    assert "stopped by KeyboardInterrupt; the report so far" in capsys.readouterr().err


def test_an_interrupt_raised_by_the_transport_in_a_search_process_stops_the_run(tmp_path, monkeypatch):
    """The same KeyboardInterrupt in a search process (``--jobs 2``) is no signal: the process
    says so before it ends, and the run stops with it instead of going on as if the search had
    merely died."""
    monkeypatch.chdir(ROOT / "tests")  # broken:interrupted_on_nack
    with pytest.raises(RuntimeError, match="the certifier failed in a search process"):
        main(["certify", "broken:interrupted_on_nack", "--profile", "quick", "--only", "fifo",
              "--only", "close", "--report-dir", str(tmp_path), "--jobs", "2"])
    verdicts, _ = _report(tmp_path)
    assert verdicts["fifo"] == "unknown"


def test_a_failure_of_the_certifier_writes_the_report_so_far_then_raises(tmp_path, monkeypatch):
    from harel_ref.certify import _passes

    def judge_fails(search, *args, **kwargs):
        raise RuntimeError("a bug in the certifier")

    monkeypatch.setattr(_passes, "how_ended", judge_fails)
    with pytest.raises(RuntimeError, match="a bug in the certifier"):
        main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "fifo", "--quiet",
              "--report-dir", str(tmp_path)])
    verdicts, _ = _report(tmp_path)
    assert verdicts == {"fifo": "unknown"}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_run_writes_the_report_so_far_and_leaves_nothing(tmp_path, stop, jobs):
    """A real SIGINT (Ctrl-C) or SIGTERM (timeout, kill) from another process while a search
    runs (its calls on a call thread, or in a search process): the run exits 128 + the signal's
    number, the verdicts so far are written, the bundled transport's temporary directory is
    removed, and no search process is left.  The search is a thorough one, minutes long, so the
    signal lands inside it however fast the machine."""
    scratch = tmp_path / "tmp"  # the command's TMPDIR: where the bundled sqlite keeps its files
    scratch.mkdir()
    reports = tmp_path / "reports"
    command = subprocess.Popen(
        [sys.executable, "-m", "harel_ref._cli", "certify", "--bundled", "sqlite", "--profile", "thorough",
         "--only", "single-in-flight", "--report-dir", str(reports), "--jobs", jobs],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    try:
        for line in command.stdout:
            if line.startswith("expected time"):
                break
        time.sleep(1.0)  # the search has begun (or is about to: either way it is far from done)
        command.send_signal(stop)
        _, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 128 + stop, err[-2000:]
    stopped_by = "KeyboardInterrupt" if stop == signal.SIGINT else "Terminated"
    assert f"stopped by {stopped_by}" in err, err[-2000:]
    verdicts, _ = _report(reports)
    assert verdicts == {"single-in-flight": "unknown"}
    assert list(scratch.iterdir()) == []
    assert _processes_with(f"TMPDIR={scratch}") == []  # the command and any search process of it


# Where a signal lands (tests/signal_at.py), and the verdicts the report then holds: stopped
# inside a search, the property searched and those after it are unknown; stopped as the
# verdicts are told (once every search has ended), the processes close, the report is written
# or the files removed, every verdict was reached, and the run still exits as stopped.
STOP_POINTS = {
    "first-property": ("unknown", "unknown", "unknown"),
    "between-verdicts": ("passed", "passed", "passed"),
    "last-property": ("passed", "passed", "unknown"),
    "closing": ("passed", "passed", "passed"),
    "report": ("passed", "passed", "passed"),
    "clean-up": ("passed", "passed", "passed"),
}
STOPPED_PROPERTIES = ("close", "fifo", "bad-input")
# A signal that lands in a search can be swallowed (or come twice); one that lands as the
# processes close, the report is written or the files removed waits for it to finish (it is
# recorded, never raised there), so swallowing it changes nothing.
STOP_CASES = [(point, how) for point in STOP_POINTS
              for how in (["raised", "swallowed", "twice"] if STOP_POINTS[point][-1] == "unknown" else ["raised"])]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(("point", "how"), STOP_CASES)
def test_a_signal_at_any_point_stops_the_run_with_its_report_and_nothing_left(tmp_path, point, how):
    """The signal is sent at a fixed point of the run, so the verdict of this test does not
    depend on timing.  ``swallowed``: the handler's exception is lost in a ``__del__`` (as one
    was in Hypothesis's gc callback, and the run went on to exit 0); the run stops all the
    same, at its next checkpoint.  ``twice``: a second signal as the certifier closes its
    processes does not cost the report.  SIGINT and SIGTERM take turns."""
    stop = (signal.SIGINT, signal.SIGTERM)[STOP_CASES.index((point, how)) % 2]
    verdicts, err = _run_stopped_at(tmp_path, point, stop, how, STOPPED_PROPERTIES)
    assert tuple(verdicts[p] for p in STOPPED_PROPERTIES) == STOP_POINTS[point]
    assert ("Exception ignored" in err) == (how == "swallowed"), err[-2000:]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_swallowed_signal_stops_a_soak(tmp_path):
    """A soak runs for its seconds in worker threads while the main thread waits: a signal
    swallowed as it begins stops it at its next checkpoint, so contention, whose verdict
    waits for the soak, stays unknown (a soak run to its end would pass it)."""
    verdicts, _ = _run_stopped_at(tmp_path, "soak", signal.SIGTERM, "swallowed", ("contention",), "--soak", "5")
    assert verdicts == {"contention": "unknown"}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("how", ["raised", "swallowed"])
def test_a_signal_stops_a_run_whose_searches_are_in_other_processes(tmp_path, how):
    """With ``--jobs 2`` the certifying process waits for its search processes: a signal that
    lands there (swallowed or not) stops the run, and the search processes with it.  Later
    searches run beside close's, so they may have ended first: only close's verdict is fixed."""
    verdicts, err = _run_stopped_at(tmp_path, "first-property", signal.SIGTERM, how, STOPPED_PROPERTIES, "--jobs", "2")
    assert verdicts["close"] == "unknown" and set(verdicts.values()) <= {"unknown", "passed"}
    assert "search process(es) had not stopped" not in err, err[-2000:]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_run_started_with_sigint_ignored_still_stops_its_search_processes_at_once(tmp_path):
    """A certification started as a background job of a script inherits SIGINT ignored, and
    its search processes with it; SIGINT is how the certifier tells them to stop, so they take
    it anyway: none is left to be ended after its grace (5 s, which every stop cost before).
    The searches are thorough ones, far longer than the grace."""
    verdicts, err = _run_stopped_at(tmp_path, "first-property", signal.SIGTERM, "raised", STOPPED_PROPERTIES,
                                    "--jobs", "2", "--profile", "thorough", ignoring_sigint=True)  # searches of minutes
    assert verdicts["close"] == "unknown"
    assert "search process(es) had not stopped" not in err, err[-2000:]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("how", ["raised", "swallowed"])
def test_a_signal_stops_a_run_that_is_shrinking_a_failure(tmp_path, how):
    """The signal lands as a search that found a failure begins to shrink it (each shrink step
    is an example, and each example a checkpoint): the run stops there, with its report, and
    the failure is in it as it was found (SPEC.md C10)."""
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "signal_at.py"), "shrinking", "SIGTERM", how, "certify",
         "broken:slow_nack_to_back", "--profile", "quick", "--only", "fifo", "--report-dir", str(reports),
         "--jobs", "1"],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=300,
    )
    assert command.returncode == 128 + signal.SIGTERM, command.stderr[-2000:]
    verdicts, data = _report(reports)
    assert verdicts == {"fifo": "failed"}
    assert data["properties"][0]["failure"]["unshrunk"] == "the run's stop (stopped by Terminated)"
    assert "Shrinking stopped at the run's stop (stopped by Terminated)" in (reports / "REPORT.md").read_text()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_failure_found_before_the_stop_is_reported_as_found(tmp_path, jobs):
    """The signal lands as the certifying process hears that fifo's search found a failure,
    which it is about to shrink, here or in a search process: the report shows the failure as
    it was found, not an unknown verdict (SPEC.md C10)."""
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "signal_at.py"), "found", "SIGINT", "raised", "certify",
         "broken:slow_nack_to_back", "--profile", "quick", "--only", "fifo", "--only", "close", "--report-dir",
         str(reports), "--jobs", jobs],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=300,
    )
    assert command.returncode == 128 + signal.SIGINT, command.stderr[-2000:]
    assert ("searches: 2 at once, each in a process of its own" in command.stdout) == (jobs == "2")
    verdicts, data = _report(reports)
    # One at a time, close's search comes after fifo's and never runs; two at a time, it runs
    # beside fifo's, and whether it ended before fifo's search found its failure is timing.
    assert verdicts["fifo"] == "failed" and verdicts["close"] in ({"unknown"} if jobs == "1" else {"unknown", "passed"})
    fifo = data["properties"][0]
    assert fifo["failure"]["unshrunk"] == "the run's stop (stopped by KeyboardInterrupt)" and fifo["property"] == "fifo"
    assert fifo["examples"] > 0  # the examples the search ran to its failure (0 once, read off the wrong object)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_run_stuck_in_a_transports_event_loop_is_ended_with_its_report(tmp_path):
    """SIGTERM lands inside an asyncio transport's call that blocks the event loop and swallows
    every exception (tests/broken.py's StuckInItsLoop): no checkpoint comes again.  The last
    resort ends the run a few seconds later (SPEC.md C8), the report so far written, the
    scratch removed; without it the command would never end."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, "-m", "harel_ref._cli", "certify", "broken:stuck_in_its_loop", "--profile", "quick",
         "--only", "fifo", "--only", "close", "--report-dir", str(reports), "--jobs", "1"],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert command.returncode == 128 + signal.SIGTERM, command.stderr[-2000:]
    assert "has not stopped" in command.stderr, command.stderr[-2000:]
    verdicts, _ = _report(reports)
    assert verdicts == {"fifo": "unknown", "close": "unknown"}
    assert "had not stopped by itself" in (reports / "REPORT.md").read_text()
    assert list(scratch.iterdir()) == []
    assert _processes_with(f"TMPDIR={scratch}") == []


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the memory limit reads /proc (Linux)")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_run_whose_memory_keeps_growing_is_stopped_at_its_memory_limit(tmp_path, jobs):
    """A transport that keeps a mebibyte of every publish (tests/broken.py's HoardsMemory), in
    the certifying process (``--jobs 1``) or in a search process of it: past ``--memory-limit``
    the run stops as a signal stops it (SPEC.md C11), exit 3, the verdicts unknown with the
    reason, and no process left."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, "-m", "harel_ref._cli", "certify", "broken:hoards_memory", "--profile", "quick",
         "--only", "fifo", "--only", "close", "--memory-limit", "256M", "--report-dir", str(reports), "--jobs", jobs],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert command.returncode == 3, command.stderr[-2000:]
    assert "stopped by MemoryLimitReached" in command.stderr, command.stderr[-2000:]
    verdicts, data = _report(reports)
    assert verdicts == {"fifo": "unknown", "close": "unknown"}
    assert "over the limit of 256 MiB (--memory-limit)" in data["properties"][0]["reason"]
    assert _processes_with(f"TMPDIR={scratch}") == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_stop_asked_from_another_thread_wakes_the_main_thread_where_it_waits():
    """The memory limit's watch stops a run from its own thread, while the main thread may be
    blocked waiting for a transport's call.  A real signal wakes it there, and the stop's own
    exception is raised (Python's ``interrupt_main`` would leave a wait without a timeout
    waiting for ever, until the last resort ended the process)."""
    command = subprocess.run([sys.executable, "-c", WAITS_FOR_EVER], capture_output=True, text=True, timeout=120)
    assert command.returncode == 0 and command.stdout == "woken by MemoryLimitReached\n", command.stderr[-2000:]


WAITS_FOR_EVER = """
import threading
from harel_ref.certify import MemoryLimitReached
from harel_ref.certify._signals import stop_from_thread, stop_on_signals

try:
    with stop_on_signals():
        threading.Timer(0.1, stop_from_thread, args=(MemoryLimitReached(1 << 30, 1 << 20),)).start()
        threading.Event().wait()  # never set, no timeout: only the stop ends it
except MemoryLimitReached as stop:
    print(f"woken by {type(stop).__name__}")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_background_run_lets_the_terminals_ctrl_c_pass_its_search_processes_too(tmp_path):
    """Started with SIGINT ignored (a background job of a script), a run goes on when the
    terminal's Ctrl-C reaches its whole process group: its search processes ignore it too (the
    certifier stops them with SIGTERM), so every verdict is reached."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "signal_at.py"), "first-property", "SIGINT", "group", "certify",
         "--bundled", "sqlite", "--profile", "quick", "--only", "close", "--only", "fifo", "--only", "bad-input",
         "--report-dir", str(reports), "--jobs", "2"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(scratch)}, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), start_new_session=True,
    )
    assert command.returncode == 0, command.stderr[-2000:]
    assert _report(reports)[0] == {"close": "passed", "fifo": "passed", "bad-input": "passed"}
    assert list(scratch.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_signal_that_lands_while_memory_grows_stops_the_run_with_its_report(tmp_path):
    """SIGTERM lands in a publish that takes a mebibyte each time, and its exception is
    swallowed there (tests/broken.py's HoardsMemoryAndIsStopped): the next checkpoint stops the
    run, with its report, before the memory limit would."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    reports = tmp_path / "reports"
    command = subprocess.run(
        [sys.executable, "-m", "harel_ref._cli", "certify", "broken:hoards_memory_and_is_stopped", "--profile",
         "quick", "--only", "fifo", "--only", "close", "--report-dir", str(reports), "--jobs", "1"],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert command.returncode == 128 + signal.SIGTERM, command.stderr[-2000:]
    assert "stopped by Terminated" in command.stderr, command.stderr[-2000:]
    verdicts, _ = _report(reports)
    assert verdicts == {"fifo": "unknown", "close": "unknown"}
    assert _processes_with(f"TMPDIR={scratch}") == []


def test_memory_limit_option(tmp_path, capsys):
    """Sizes as people write them; anything else is a usage error that says what a size is."""
    assert main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "close", "--memory-limit",
                 "none", "--report-dir", str(tmp_path)]) == 0
    assert main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "close", "--memory-limit",
                 "1.5GiB", "--report-dir", str(tmp_path)]) == 0
    for bad in ("0", "-1G", "2T", "lots"):
        with pytest.raises(SystemExit):
            main(["certify", f"--memory-limit={bad}"])
        assert "expected a size such as 2G, 500M or 'none'" in capsys.readouterr().err


def test_a_signal_that_stopped_one_run_does_not_stop_the_next_in_a_thread(tmp_path):
    """The stop is recorded for the run it came in: a run after it, here in a thread (which
    cannot take signals), is not stopped by it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the first run must take the signal in the main thread")
    backend = memory()

    def progress(prop, verdict):
        if verdict is None:  # fifo's search begins
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as stopped:
        certify(backend.factory, backend.capabilities, profile="quick", properties=["fifo", "close"],
                progress=progress, jobs=1)
    assert stopped.value.report.verdict("fifo").verdict == "unknown"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        report = pool.submit(certify, backend.factory, backend.capabilities, profile="quick",
                             properties=["fifo"], jobs=1).result()
        assert pool.submit(stopped_by).result() is None  # what closing reads to cut branches short
    assert report.verdict("fifo").verdict == "passed"


def _run_stopped_at(tmp_path, point, stop, how, properties, *options, ignoring_sigint=False):
    """Certify the bundled sqlite on ``properties`` with ``stop`` sent at ``point``; check that
    it exits as stopped and leaves nothing; the report's verdicts, and what it wrote to stderr.
    ``ignoring_sigint``: the command starts with SIGINT ignored, as a background job does."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignoring_sigint else None
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    reports = tmp_path / "reports"
    only = [arg for prop in properties for arg in ("--only", prop)]
    command = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "signal_at.py"), point, stop.name, how,
         "certify", "--bundled", "sqlite", "--profile", "quick", *only, "--report-dir", str(reports),
         "--jobs", "1", *options],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(scratch)}, timeout=120,
        preexec_fn=ignore,
    )
    assert command.returncode == 128 + stop, command.stderr[-2000:]
    stopped_by = "KeyboardInterrupt" if stop == signal.SIGINT else "Terminated"
    assert f"stopped by {stopped_by}" in command.stderr, command.stderr[-2000:]
    assert list(scratch.iterdir()) == []
    assert _processes_with(f"TMPDIR={scratch}") == []
    return _report(reports)[0], command.stderr


def _processes_with(variable: str) -> list[int]:
    """The processes whose environment holds ``variable`` (``NAME=value``)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if variable.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # gone, or not ours to read
            pass
    return found


def test_a_bundled_directory_is_removed_while_a_thread_still_writes_into_it(tmp_path):
    """The race behind a directory left by a stopped run: a branch still finishing a call
    creates a file while the tree is being removed."""
    directory = tmp_path / "bundled"
    directory.mkdir()
    until = time.monotonic() + 0.5

    def keep_writing():
        for n in itertools.count():
            if time.monotonic() > until:
                return
            try:
                (directory / f"file-{n}").write_text("x")
            except FileNotFoundError:  # the directory is gone
                return

    writer = threading.Thread(target=keep_writing)
    writer.start()
    time.sleep(0.05)
    remove_directory(directory)
    writer.join()
    assert not directory.exists()


def test_call_deadline_option(tmp_path, capsys):
    assert main(["certify", "--bundled", "memory", "--profile", "quick", "--only", "close", "--call-deadline",
                 "none", "--report-dir", str(tmp_path)]) == 0
    assert "call deadline none" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["certify", "--call-deadline", "0"])


def test_profile_option_takes_a_profile_divided(tmp_path, capsys):
    assert main(["certify", "--bundled", "memory", "--profile", "quick/5", "--only", "close",
                 "--report-dir", str(tmp_path)]) == 0
    assert "profile quick/5: 10 examples × 20 steps per lockstep search, 20 programs × 4 runs" in capsys.readouterr().out
    assert _report(tmp_path)[1]["profile"]["name"] == "quick/5"
    # a full certification: the shared lockstep search first (SPEC.md C5)
    assert main(["certify", "--bundled", "memory", "--profile", "quick/10", "--report-dir", str(tmp_path / "full")]) == 0
    lockstep = sum(row.search == "lockstep" for row in PROPERTIES.values())
    assert (f"profile quick/10: one shared lockstep search of 20 examples for {lockstep} properties, then, only if "
            "it finds anything, 5 examples × 20 steps per lockstep search") in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["certify", "--profile", "quick/0"])
