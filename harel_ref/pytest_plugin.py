"""A pytest plugin: ``pytest --harel-transport module:factory`` certifies that transport.

Installed with harel-ref (entry point ``pytest11``) and inactive unless ``--harel-transport``
or ``--harel-bundled`` is given.  When active, pytest collects nothing else: it runs the
certification once and shows one test per property, named ``harel-certify::<property>``:

- passed: PASSED; failed: FAILED, with the counterexample as runnable Python;
- not applicable (a capability the transport does not declare) and unknown (cut short):
  SKIPPED, the reason saying which ("not applicable: ..." or "unknown: ...").

Options: ``--harel-async``, ``--harel-profile``, ``--harel-seed``, ``--harel-only``,
``--harel-time-budget``, ``--harel-processes``, ``--harel-threads``, ``--harel-shrink-limit``,
``--harel-memory-limit``,
``--harel-soak``, ``--harel-level``,
``--harel-call-deadline``, ``--harel-report-dir`` and ``--harel-capabilities`` (a comma list such as
``durable,shared,no-routing,fairness=ack,wall-clock,protocol=harel,acks=by-seq``), matching
``harel-ref certify``.  A property that failed but is not part of the chosen level (say fencing,
certifying at harel's ``contract`` level) is shown XFAIL, its reason saying so.  A run that is
interrupted still writes ``--harel-report-dir``, with the verdicts reached so far.
"""

from __future__ import annotations


import pytest

__all__ = ["pytest_addoption"]

NODE = "harel-certify"


def pytest_addoption(parser: pytest.Parser) -> None:
    from harel_ref._cli import jobs_type, memory_type, profile_type
    from harel_ref.certify import DEFAULT_CALL_DEADLINE, DEFAULT_SHRINK_LIMIT, PROFILES, PROPERTIES
    from harel_ref.certify._memory import DEFAULT_MEMORY_LIMIT

    group = parser.getgroup("harel-ref", "certify a harel transport (harel-ref)")
    group.addoption("--harel-transport", metavar="MODULE:FACTORY",
                    help="certify this factory(clock, namespace) instead of collecting tests")
    group.addoption("--harel-bundled", metavar="NAME",
                    help="certify a bundled transport (memory, sqlite, libsql, ...) instead")
    group.addoption("--harel-async", action="store_true", help="the factory is asyncio")
    group.addoption("--harel-profile", type=profile_type, default="standard", metavar="|".join(PROFILES),
                    help="quick, standard (default) or thorough, or one divided (quick/3); quick is "
                    "fitted to a transport too slow for it")
    group.addoption("--harel-seed", type=int, default=0, help="seed of every search (default 0)")
    group.addoption("--harel-only", action="append", choices=list(PROPERTIES), metavar="PROPERTY",
                    help="certify only this property (repeatable)")
    group.addoption("--harel-time-budget", type=float, metavar="SECONDS",
                    help="a budget shared by the searches: no example starts after it, a failure found in time may take one more share to shrink; what was not searched is unknown")
    group.addoption("--harel-processes", dest="harel_branches", action="store_const", const=True,
                    help="run the branches of the concurrent search in separate processes, every run "
                    "(by default every other run does, where that can be done)")
    group.addoption("--harel-threads", dest="harel_branches", action="store_const", const=False,
                    help="run the branches of the concurrent search in threads (tasks), every run")
    group.addoption("--harel-shrink-limit", type=float, metavar="SECONDS", default=DEFAULT_SHRINK_LIMIT,
                    help="seconds each search may spend shrinking a failure it found")
    group.addoption("--harel-memory-limit", type=memory_type, metavar="SIZE", default=DEFAULT_MEMORY_LIMIT,
                    help="memory the certification's processes may take beyond what they held as it began "
                    "(2G, 500M, none); past it the run stops with its report so far")
    group.addoption("--harel-jobs", type=jobs_type, metavar="N", default=None,
                    help="searches run at once, each in a process of its own (default: the cores available)")
    group.addoption("--harel-lanes", type=jobs_type, metavar="N", default=None,
                    help="examples of each lockstep search run at once, in lanes (default: 4 for the bundled "
                    "rqlite transports, 8 on a wall clock, else 1)")
    group.addoption("--harel-soak", type=float, metavar="SECONDS",
                    help="also run a soak of SECONDS against the wall clock")
    group.addoption("--harel-capabilities", metavar="LIST", default="",
                    help="override declared capabilities: e.g. durable,shared,no-routing,fairness=ack,wall-clock")
    group.addoption("--harel-level", choices=["contract", "strict"],
                    help="the conformance level that fails the session (default: contract for harel's "
                    "Protocol, else strict)")
    group.addoption("--harel-call-deadline", type=float, metavar="SECONDS", default=DEFAULT_CALL_DEADLINE,
                    help="a call of the transport that takes longer is declared hung (default "
                    f"{DEFAULT_CALL_DEADLINE:g})")
    group.addoption("--harel-report-dir", metavar="DIR",
                    help="also write report.json and REPORT.md there")


def _active(config: pytest.Config) -> bool:
    return bool(config.getoption("harel_transport") or config.getoption("harel_bundled"))


_TARGET = pytest.StashKey()
_REPORT = pytest.StashKey()
_DIRECTORY = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    """Load the target early, so a wrong one is a usage error before anything runs."""
    if not _active(config):
        return
    from harel_ref.certify import CertificationError
    from harel_ref.certify._certify import preflight
    from harel_ref.certify._target import Target, parse_capabilities, scratch_directory

    try:
        overrides = parse_capabilities(config.getoption("harel_capabilities"))
        spec = config.getoption("harel_transport")
        if spec and config.getoption("harel_bundled"):
            raise CertificationError("give either --harel-transport or --harel-bundled, not both")
        if spec:
            config.stash[_TARGET] = Target.from_spec(spec, overrides, is_async=config.getoption("harel_async"))
        else:
            config.stash[_DIRECTORY] = scratch_directory()
            config.stash[_TARGET] = Target.from_bundled(
                config.getoption("harel_bundled"), config.stash[_DIRECTORY], overrides
            )
        preflight(config.stash[_TARGET])  # a factory that cannot open a transport at all
    except CertificationError as exc:
        raise pytest.UsageError(f"harel-ref: {exc}") from exc


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A failure found for a property that ``--harel-only`` did not select has no test item:
    say so, and fail the session anyway."""
    report = session.config.stash.get(_REPORT, None)
    if report is None:
        return
    chosen = set(session.config.getoption("harel_only") or ())
    hidden = [p for p in report.failed_at(report.level) if chosen and p not in chosen]
    if hidden:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"harel-ref: failed outside --harel-only: {', '.join(hidden)} (see the report)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DIRECTORY in config.stash:
        from harel_ref.certify._target import remove_directory

        remove_directory(config.stash[_DIRECTORY])


def pytest_ignore_collect(collection_path, config: pytest.Config):
    if _active(config):
        return True  # certification replaces the test suite
    return None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if not _active(config):
        return
    from harel_ref.certify import PROPERTIES

    collector = _Certification.from_parent(session, name=NODE, nodeid=NODE)
    chosen = config.getoption("harel_only") or list(PROPERTIES)
    items[:] = [_PropertyItem.from_parent(collector, name=prop) for prop in chosen]


class _Certification(pytest.Collector):
    """Runs the certification once, for all its property items."""

    report = None

    def collect(self):  # pragma: no cover - items are made in pytest_collection_modifyitems
        return []

    def certified(self):
        if self.report is None:
            self.report = self.config.stash[_REPORT] = _run(self.config)
        return self.report


class _PropertyItem(pytest.Item):
    def runtest(self) -> None:
        from harel_ref.certify._report import in_level

        report = self.parent.certified()
        try:
            verdict = report.verdict(self.name)
        except KeyError:
            pytest.skip(f"{self.name}: unknown: not searched")
        if verdict.verdict == "failed" and not in_level(self.name, report.level):
            pytest.xfail(f"{self.name}: failed, outside the {report.level} level: {verdict.reason}")
        if verdict.verdict == "failed":
            raise _PropertyFailed(verdict)
        if verdict.verdict != "passed":
            pytest.skip(f"{self.name}: {verdict.verdict}: {verdict.reason}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, _PropertyFailed):
            return excinfo.value.describe()
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return NODE, None, f"{NODE}::{self.name}"


class _PropertyFailed(Exception):
    def __init__(self, verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict

    def describe(self) -> str:
        from harel_ref.certify._regression_text import LONG

        f = self.verdict.failure
        lines = [
            f"{self.verdict.property} failed (found by the {f.found_by} search, which saw {f.kind!r})",
            f"  step:                   {f.step}",
            f"  the model allows:       {f.expected}",
            f"  the transport answered: {f.answered}",
        ]
        if f.state:
            lines += ["  queue per the model:", f.state]
        if f.regression and f.regression.count("\n") <= LONG:
            lines += ["", "a regression test in the transport's own calls (fails until the bug is fixed):",
                      f.regression]
        elif f.regression:
            lines += ["", "a regression test in the transport's own calls: in report.json (regression), "
                      "or written by harel-ref certify --write-tests DIR"]
        if f.reproduction:
            lines += ["", "runnable reproduction:", f.reproduction]
        if f.replay:
            lines += ["", f"replay: {f.replay}"]
        return "\n".join(lines)


def _run(config: pytest.Config):
    from harel_ref.certify import certify

    directory = config.getoption("harel_report_dir")
    try:
        report = certify(
            config.stash[_TARGET].factory,
            profile=config.getoption("harel_profile"),
            seed=config.getoption("harel_seed"),
            properties=config.getoption("harel_only"),
            time_budget=config.getoption("harel_time_budget"),
            processes=config.getoption("harel_branches"), shrink_limit=config.getoption("harel_shrink_limit"),
            memory_limit=config.getoption("harel_memory_limit"),
            soak=config.getoption("harel_soak"),
            level=config.getoption("harel_level"),
            call_deadline=config.getoption("harel_call_deadline"),
            jobs=config.getoption("harel_jobs"), lanes=config.getoption("harel_lanes"),
            _target=config.stash[_TARGET],
        )
    except BaseException as stop:  # interrupted, or the certifier failed: keep the verdicts so far
        partial = getattr(stop, "report", None)
        if directory and partial is not None:
            partial.write(directory)
        raise
    if directory:
        report.write(directory)
    return report
