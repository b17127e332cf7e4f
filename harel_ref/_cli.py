"""The ``harel-ref`` command.  ``harel-ref certify`` is its one subcommand for now.

    harel-ref certify                      # the bundled SQLite transport, on a temporary file
    harel-ref certify --bundled memory     # another bundled transport
    harel-ref certify mypkg.queue:factory  # your transport
    harel-ref certify mypkg.queue:factory --durable --shared --profile thorough
    harel-ref certify --bundled harel-sqlite   # harel's own SQLite transport, in its Protocol
    harel-ref certify mypkg.queue:make         # a harel transport: make(clock) is enough

Exit codes, at the chosen ``--level`` (by default ``contract`` for a transport of harel's
Protocol, else ``strict``): 0 every property passed (or is not applicable), 1 some property
failed, 2 the command was wrong, 3 some property is unknown (cut short) and none failed;
130 or 143 stopped by SIGINT or SIGTERM (128 plus the signal's number, as a shell reports a
process a signal ended), with the report so far written and the bundled transport's files
removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from harel_ref.certify import (
    DEFAULT_CALL_DEADLINE,
    DEFAULT_SHRINK_LIMIT,
    EXIT_CODES,
    PROFILES,
    PROPERTIES,
    CertificationError,
    Plan,
    Profile,
    Progress,
    PropertyVerdict,
    Report,
    certify,
)
from harel_ref.certify._memory import DEFAULT_MEMORY_LIMIT, parse_size
from harel_ref.certify._signals import describe, exit_status, last_resort, signals_deferred, stop_on_signals, stopping
from harel_ref.certify._report import BRANCHES, LEVELS
from harel_ref.certify._target import Target, remove_directory, scratch_directory

__all__ = ["Console", "build_parser", "main", "profile_type"]

DEFAULT_BUNDLED = "sqlite"


def build_parser() -> argparse.ArgumentParser:
    from harel_ref.stateful.backends import BUNDLED

    parser = argparse.ArgumentParser(
        prog="harel-ref", description="The reference and certification kit for harel transports."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cert = commands.add_parser(
        "certify",
        help="certify a transport against the specification",
        description="Run one seeded search per property and give a verdict on each. "
        f"Without a TARGET, certify the bundled {DEFAULT_BUNDLED} transport on a temporary file.",
    )
    cert.add_argument("target", nargs="?", metavar="MODULE:FACTORY",
                      help="the factory(clock, namespace) to certify, e.g. examples.seeds_sqlite:factory")
    cert.add_argument("--bundled", metavar="NAME", choices=sorted(BUNDLED),
                      help=f"certify a bundled transport instead: {', '.join(BUNDLED)}")
    cert.add_argument("--async", dest="is_async", action="store_true",
                      help="the factory returns an awaitable / an asyncio transport "
                      "(detected for an async def factory)")
    cert.add_argument("--profile", type=profile_type, default="standard", metavar="|".join(PROFILES),
                      help="how hard to look (default: standard); quick aims at about "
                      f"{PROFILES['quick'].target:g} s and is fitted to a slower transport as quick/N, "
                      "which can also be asked for")
    cert.add_argument("--seed", type=int, default=0, help="seed of every search (default: 0)")
    cert.add_argument("--only", metavar="PROPERTY", action="append", choices=list(PROPERTIES),
                      help="certify only this property (repeatable)")
    cert.add_argument("--time-budget", metavar="SECONDS", type=float,
                      help="a budget shared by the searches: no example starts after it, a failure found in time may take one more share to shrink; what was not searched is unknown")
    where = cert.add_mutually_exclusive_group()
    where.add_argument("--processes", dest="branches", action="store_const", const="processes",
                       help="run the branches of the concurrent search in separate processes, every run "
                       "(the factory must be importable, its storage shared across processes); by default "
                       "every other run does, where that can be done")
    where.add_argument("--threads", dest="branches", action="store_const", const="threads",
                       help="run the branches of the concurrent search in threads (tasks, for an asyncio "
                       "transport), every run")
    cert.add_argument("--shrink-limit", metavar="SECONDS", type=float, default=DEFAULT_SHRINK_LIMIT,
                      help=f"seconds each search may spend shrinking a failure it found; then the failure is shown "
                      f"as found, and the report says so (default {DEFAULT_SHRINK_LIMIT:g})")
    cert.add_argument("--memory-limit", metavar="SIZE", type=memory_type, default=DEFAULT_MEMORY_LIMIT,
                      help=f"how much memory the certification's processes may take beyond what they held as it "
                      f"began (2G, 500M, or none); past it the run stops with its report so far, exit 3 "
                      f"(default {DEFAULT_MEMORY_LIMIT >> 20} MiB: 4 GiB, or half the machine's memory)")
    cert.add_argument("--jobs", metavar="N", type=jobs_type, default=None,
                      help="run N searches at once, each in a process of its own (default: the cores "
                      "available, or HAREL_REF_JOBS); the report is the same as one at a time")
    cert.add_argument("--lanes", metavar="N", type=jobs_type, default=None,
                      help="run up to N examples of each lockstep search at once, each in a thread with "
                      "transports of its own (default: 4 for the bundled rqlite transports, 8 for a transport "
                      "on a wall clock, else 1; a few help a transport that answers over a network); the "
                      "report is the seed's all the same")
    cert.add_argument("--soak", metavar="SECONDS", type=float,
                      help="also run several workers against the wall clock for SECONDS, and judge "
                      "their history against the model")
    cert.add_argument("--level", choices=list(LEVELS),
                      help="the conformance level the exit code follows: contract (what harel promises) "
                      "or strict (all of harel-ref's spec); default: contract for a transport of harel's "
                      "Protocol, else strict. Both are reported")
    cert.add_argument("--report-dir", metavar="DIR", default="reports",
                      help="where report.json and REPORT.md go (default: ./reports)")
    cert.add_argument("--write-tests", metavar="DIR",
                      help="also write each failure's regression test, a pytest module in the transport's "
                      "own calls, into DIR as test_PROPERTY.py")
    cert.add_argument("--call-deadline", metavar="SECONDS", type=_deadline, default=DEFAULT_CALL_DEADLINE,
                      help=f"a call of the transport that takes longer is declared hung, a failure of the "
                      f"property being searched (default: {DEFAULT_CALL_DEADLINE:g}; 'none': no deadline)")
    cert.add_argument("--quiet", action="store_true",
                      help="no header and no progress: print the verdicts at the end")

    caps = cert.add_argument_group(
        "capabilities", "override what the factory declares (factory.capabilities or the "
        "module's HAREL_CAPABILITIES)"
    )
    for name, help_text in (
        ("priority", "groups have priorities and claim(min_priority=...) honours them"),
        ("routing", "groups have routing keys and claim(routing_keys=...) honours them"),
        ("parking", "nack(lease, delay > 0) parks the message"),
        ("durable", "close and reopen on the same namespace keeps the queue"),
        ("shared", "two transports open on one namespace see one queue"),
    ):
        caps.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None, help=help_text)
    caps.add_argument("--fairness", choices=["claim", "ack", "unspecified"],
                      help="when a group's fairness stamp is taken")
    caps.add_argument("--wall-clock", action=argparse.BooleanOptionalAction, default=None,
                      help="the transport keeps its own time (cannot take the given clock)")
    caps.add_argument("--protocol", choices=["harel-ref", "harel"],
                      help="the Protocol it speaks: harel-ref's, or harel's own (Event objects, ack and nack "
                      "answering None, no routing keys); harel's is detected from claim()")
    caps.add_argument("--acks", choices=["fenced", "until-reclaimed", "by-seq"],
                      help="how ack and nack find their message: by the lease's token while it holds the "
                      "message (fenced), by the token until the message is claimed again (until-reclaimed: "
                      "SQS's receipt handles), or by its seq alone (by-seq, the default for harel's Protocol)")
    caps.add_argument("--resolution", metavar="SECONDS", type=_resolution,
                      help="the shortest time it keeps (SQS: 1): every lease and delay it is given is a "
                      "whole multiple of it (default 0: any)")
    caps.add_argument("--group-ids", metavar="REGEX",
                      help="a regular expression every group id it accepts matches in full (SQS: "
                      "'[!-~]{1,128}'); only such ids are used (default: any Unicode text)")
    caps.add_argument("--event-bytes", metavar="BYTES", type=_event_bytes,
                      help="the longest event it takes in UTF-8 bytes, whatever its characters; no longer "
                      "ones are drawn (default 0: any, up to 1 MiB)")
    return parser


def _event_bytes(text: str) -> int:
    """``--event-bytes BYTES``: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes >= 0, got {text!r}")
    return int(text)


def _resolution(text: str) -> float:
    """``--resolution SECONDS``: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def profile_type(text: str) -> str:
    """``--profile`` (and the plugin's ``--harel-profile``): a profile's name, or one divided
    (``quick/3``)."""
    try:
        Profile.named(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def memory_type(text: str) -> int | None:
    """``--memory-limit SIZE``: bytes, ``2G``, ``500M``, or ``none``."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def jobs_type(text: str) -> int:
    """``--jobs N``: a whole number of at least 1."""
    if not (text.strip().isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _deadline(text: str) -> float | None:
    """``--call-deadline``: seconds, or ``none``."""
    if text.strip().lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'none', got {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "certify":
        try:
            with stop_on_signals():
                return _certify(parser, args)
        except KeyboardInterrupt as stop:  # SIGINT, SIGTERM or the memory limit, wherever it came
            partial = getattr(stop, "report", None)
            if partial is None:  # else the console said where the report is
                print(f"harel-ref certify: stopped by {type(stop).__name__}", file=sys.stderr)
            return _stopped_status(stop, partial)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse refuses first


def _stopped_status(stop: KeyboardInterrupt, partial) -> int:
    """What a stopped run exits with: ``128 +`` a signal's number; for the memory limit, the
    report so far's code (3, unknown, or 1 if a property failed before the limit came)."""
    if getattr(stop, "exit_status", None) is not None and partial is not None:
        return partial.exit_code
    return exit_status(stop)


def _certify(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    overrides = {
        "priority": args.priority, "routing": args.routing, "parking": args.parking,
        "durable": args.durable, "shared": args.shared, "fairness": args.fairness,
        "clock": None if args.wall_clock is None else ("wall" if args.wall_clock else "injectable"),
        "protocol": args.protocol, "acks": args.acks, "resolution": args.resolution, "group_ids": args.group_ids,
        "event_bytes": args.event_bytes,
    }
    if args.target and args.bundled:
        return _usage(parser, "give either MODULE:FACTORY or --bundled NAME, not both")
    for option, folder in (("--report-dir", args.report_dir), ("--write-tests", args.write_tests)):
        try:  # an unwritable directory is a usage error, found before any search runs
            if folder is not None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                if not os.access(folder, os.W_OK):
                    raise PermissionError(f"{folder} is not writable")
        except OSError as exc:
            return _usage(parser, f"{option} {folder!r}: {exc}")
    directory = None
    console = Console(sys.stdout, quiet=args.quiet)
    def stuck(stop: KeyboardInterrupt, handed: dict) -> None:
        """The last resort of a run that did not stop (harel_ref.certify._signals): the report
        so far, and the bundled transport's files removed."""
        if (partial := handed.get("report")) is not None:
            console.stopped(stop, *partial.write(args.report_dir))
        handed["exit_status"] = _stopped_status(stop, partial)
        _clean_up(directory, args.bundled)

    with last_resort(stuck):
        try:
            if args.target:
                target = Target.from_spec(args.target, overrides, is_async=args.is_async)
            else:
                directory = scratch_directory()
                target = Target.from_bundled(args.bundled or DEFAULT_BUNDLED, directory, overrides)
            report = certify(
                target.factory, profile=args.profile, seed=args.seed, properties=args.only,
                time_budget=args.time_budget, processes={"processes": True, "threads": False}.get(args.branches), soak=args.soak,
                level=args.level, call_deadline=args.call_deadline, shrink_limit=args.shrink_limit,
                memory_limit=args.memory_limit, progress=console,
                jobs=args.jobs, lanes=args.lanes, _target=target,
            )
        except BaseException as exc:
            partial = getattr(exc, "report", None)
            if partial is None and isinstance(exc, (CertificationError, ValueError, TypeError)):
                return _usage(parser, str(exc))  # refused before any search ran
            if partial is not None:  # stopped, or the certifier failed: the verdicts so far stand
                with signals_deferred():  # a second signal does not leave the report half written
                    paths = partial.write(args.report_dir)
                console.stopped(exc, *paths)
            raise
        finally:
            with signals_deferred():  # nor the bundled transport's files half removed
                _clean_up(directory, args.bundled)
        with signals_deferred():
            paths = report.write(args.report_dir)
            tests = report.write_tests(args.write_tests) if args.write_tests else []
        console.summary(report, *paths)
        if tests:
            print(f"regression tests: {', '.join(str(path) for path in tests)}")
        return report.exit_code


def _clean_up(directory: str | None, bundled: str | None) -> None:
    """Remove what a bundled transport left: its temporary directory, or its tables in the
    rqlite cluster.  A failure here is reported, never raised: the report is what matters."""
    if directory is not None:
        remove_directory(directory)
    if bundled and "rqlite" in bundled:
        from harel_ref.stateful.backends.rqlite import drop_opened_tables

        try:  # a stopped run does not wait long for a cluster that does not answer
            drop_opened_tables(timeout=1.0 if stopping() else 10.0)
        except Exception as exc:
            print(f"harel-ref certify: warning: the rqlite tables it made were not all dropped: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"harel-ref certify: error: {message}", file=sys.stderr)
    return EXIT_CODES["usage"]


class Console(Progress):
    """What ``harel-ref certify`` prints on stdout, each verdict once.

    - A header: the transport, the profile, the properties, an estimate of the time.
    - A line per property, once every search has ended (what any search finds may bear on any
      verdict).  Meanwhile, on a terminal, a live line shows the search under way (the property
      it runs for, its examples done of the most it will run, seconds), redrawn in place and
      replaced by the verdicts.  Elsewhere (a pipe, a CI log) there is no live line and no
      control character: only the verdict lines.
    - A summary: both conformance levels, the outcome, where the report is, how to replay.

    ``quiet``: no header and nothing live; the verdict lines come together before the summary.
    """

    REDRAW = 0.1  # seconds between two redraws of the live line

    def __init__(self, stream: TextIO, *, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.live = not quiet and stream.isatty()
        self.verdicts: list[PropertyVerdict] = []
        self._drawn = False  # a live line is on the screen
        self._began = self._last_draw = 0.0

    # --- what certify says -----------------------------------------------------------------

    def planned(self, plan: Plan) -> None:
        if self.quiet:
            return
        profile, caps = plan.profile, plan.capabilities
        declared = [name for name in ("priority", "routing", "parking", "durable", "shared") if getattr(caps, name)]
        applicable = [p for p in plan.properties if p not in plan.not_applicable]
        branches = BRANCHES[plan.branches] + (f"; not in processes: {plan.branches_note}" if plan.branches_note else "")
        branches = branches.replace("threads (tasks)", "tasks" if plan.is_async else "threads")
        budget = f"; time budget {plan.time_budget:g} s" if plan.time_budget else ""
        deadline = f"{plan.call_deadline:g} s" if plan.call_deadline else "none"
        fitted = ""
        if plan.fitted_from is not None:
            fitted = (f" ({plan.fitted_from.name} made smaller, to come near its {plan.fitted_from.target:g} s "
                      "with a transport this slow)")
        self._print(
            f"harel-ref certify {plan.transport} ({'async' if plan.is_async else 'sync'}; "
            f"{', '.join(declared) or 'no optional capability'}; fairness {caps.fairness}; "
            f"clock {caps.clock}; protocol {caps.protocol})",
            f"profile {profile.name}{fitted}: "
            + (f"one shared lockstep search of {profile.shared_examples} examples for {len(plan.shared)} properties, "
               "then, only if it finds anything, " if plan.shared else "")
            + f"{profile.max_examples} examples × {profile.step_count} steps per "
            f"lockstep search, {profile.programs} programs × {profile.repeats} runs in the concurrent search "
            f"(branches in {branches}){f'; a soak of {plan.soak:g} s' if plan.soak else ''}; seed {plan.seed}; "
            f"call deadline {deadline}{budget}",
            f"searches: {plan.jobs} at once" + (", each in a process of its own" if plan.jobs > 1 else "")
            + (f" ({plan.jobs_note})" if plan.jobs_note else "")
            + (f"; each lockstep search runs up to {plan.lanes} examples at once, in lanes" if plan.lanes > 1 else ""),
            f"properties: {len(applicable)} to search ({', '.join(applicable) or 'none'})"
            + (f"; not applicable: {', '.join(plan.not_applicable)}" if plan.not_applicable else ""),
            f"expected time: about {_duration(plan.estimate)} (an estimate from the profile and how fast "
            "the transport answered a few calls)",
            "",
        )

    def started(self, prop: str) -> None:
        self._began = time.monotonic()
        self._draw(prop, "searching")

    def searching(self, prop: str, search: str, done: int, total: int) -> None:
        what = "programs" if search == "concurrent" else "examples"
        detail = "soaking" if search == "soak" else f"{search} search: {what} {done}/{total}"
        self._draw(prop, detail)

    def finished(self, verdict: PropertyVerdict) -> None:
        self.verdicts.append(verdict)
        if not self.quiet:
            self._clear()
            self._print(self._verdict_line(verdict))

    def stopped(self, error: BaseException, json_path: Path, md_path: Path) -> None:
        """The certification was stopped, or failed: where the verdicts so far are."""
        self._clear()
        self.stream.flush()
        why = f" ({describe(error)})" if getattr(error, "why", None) else ""
        print(f"harel-ref certify: stopped by {type(error).__name__}{why}; the report so far: {md_path} and "
              f"{json_path}", file=sys.stderr)

    def summary(self, report: Report, json_path: Path, md_path: Path) -> None:
        """After the verdicts: the outcome, the report, the replays (and, when quiet, the
        verdicts themselves, which were not shown as they came)."""
        lines = [self._verdict_line(v) for v in report.verdicts] if self.quiet else [""]
        lines += [
            f"levels: {report.levels_line()}",
            f"outcome at the {LEVELS[report.level]} level: {report.outcome} "
            f"({report.seconds:.1f} s, profile {report.profile.name}, seed {report.seed})",
            f"report: {md_path} and {json_path}",
        ]
        lines += [f"replay {v.property}: {v.failure.replay}" for v in report.verdicts
                  if v.failure is not None and v.failure.replay]
        lines += [f"{v.property}: its failure disturbed {', '.join(v.consequences)} (see REPORT.md)"
                  for v in report.verdicts if v.consequences]
        self._print(*lines)

    # --- drawing ---------------------------------------------------------------------------

    @staticmethod
    def _verdict_line(v: PropertyVerdict) -> str:
        return f"  {v.property:<17} {v.verdict:<14} {v.seconds:6.1f} s  {v.reason}"

    def _draw(self, prop: str, detail: str) -> None:
        """Redraw the live line (on a terminal, at most every REDRAW seconds)."""
        now = time.monotonic()
        if not self.live or (self._drawn and now - self._last_draw < self.REDRAW):
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        line = f"  {prop:<17} {detail} · {now - self._began:.1f} s"
        self.stream.write("\r\033[K" + line[:width])
        self.stream.flush()
        self._drawn, self._last_draw = True, now

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self._drawn = False

    def _print(self, *lines: str) -> None:
        for line in lines:
            self.stream.write(line + "\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    """``40 s``, ``3 min 20 s``, ``1 h 5 min``."""
    seconds = max(1, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s" if seconds < 600 else f"{round(seconds / 60)} min"
    return f"{seconds // 3600} h {round(seconds % 3600 / 60)} min"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
