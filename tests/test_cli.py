"""`harel-ref certify` and the pytest plugin: exit codes, reports, agreement, documentation."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harel_ref._cli import build_parser, main
from harel_ref.pytest_plugin import pytest_addoption
from stateful import Capabilities

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


def test_cli_and_pytest_plugin_agree_on_the_seeds_example(tmp_path):
    cli = subprocess.run(
        ["harel-ref", "certify", SEEDS, "--profile", "quick", "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 1, cli.stderr
    cli_verdicts, _ = _report(tmp_path)

    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "--harel-transport", SEEDS, "--harel-profile", "quick",
         "-rA", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert plugin.returncode == 1, plugin.stdout[-3000:]
    pytest_verdicts = {}
    for outcome, prop in re.findall(r"^(PASSED|FAILED) harel-certify::([a-z-]+)", plugin.stdout, re.M):
        pytest_verdicts[prop] = outcome.lower()
    for prop, verdict in re.findall(r"^SKIPPED .*?: ([a-z-]+): (not applicable|unknown)", plugin.stdout, re.M):
        pytest_verdicts[prop] = verdict
    assert pytest_verdicts == cli_verdicts
    assert cli_verdicts["fencing"] == cli_verdicts["bad-input"] == "failed"  # the seeds' design

    # The committed report was made by the certifier and still says the same.
    committed = (ROOT / "examples" / "seeds_sqlite" / "REPORT.md").read_text()
    table = dict(re.findall(r"^\| ([a-z-]+) \| (?:contract|strict) \| \*\*([a-z ]+)\*\* \|", committed, re.M))
    assert table == cli_verdicts


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
