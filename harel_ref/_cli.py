"""The ``harel-ref`` command.  ``harel-ref certify`` is its one subcommand for now.

    harel-ref certify                      # the bundled SQLite transport, on a temporary file
    harel-ref certify --bundled memory     # another bundled transport
    harel-ref certify mypkg.queue:factory  # your transport
    harel-ref certify mypkg.queue:factory --durable --shared --profile thorough
    harel-ref certify --bundled harel-sqlite   # harel's own SQLite transport, in its Protocol
    harel-ref certify mypkg.queue:make         # a harel transport: make(clock) is enough

Exit codes, at the chosen ``--level`` (by default ``contract`` for a transport of harel's
Protocol, else ``strict``): 0 every property passed (or is not applicable), 1 some property
failed, 2 the command was wrong, 3 some property is unknown (cut short) and none failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from harel_ref.certify import EXIT_CODES, PROFILES, PROPERTIES, CertificationError, PropertyVerdict, certify
from harel_ref.certify._report import LEVELS
from harel_ref.certify._target import Target

__all__ = ["build_parser", "main"]

DEFAULT_BUNDLED = "sqlite"


def build_parser() -> argparse.ArgumentParser:
    from stateful.backends import BUNDLED

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
    cert.add_argument("--profile", choices=list(PROFILES), default="standard",
                      help="how hard to look (default: standard)")
    cert.add_argument("--seed", type=int, default=0, help="seed of every search (default: 0)")
    cert.add_argument("--only", metavar="PROPERTY", action="append", choices=list(PROPERTIES),
                      help="certify only this property (repeatable)")
    cert.add_argument("--time-budget", metavar="SECONDS", type=float,
                      help="a budget shared by the searches: no example starts after it, a failure found in time may take one more share to shrink; what was not searched is unknown")
    cert.add_argument("--processes", action="store_true",
                      help="run the branches of the concurrent searches in separate processes "
                      "(the factory must be importable, its storage shared across processes)")
    cert.add_argument("--soak", metavar="SECONDS", type=float,
                      help="also run several workers against the wall clock for SECONDS, and judge "
                      "their history against the model")
    cert.add_argument("--level", choices=list(LEVELS),
                      help="the conformance level the exit code follows: contract (what harel promises) "
                      "or strict (all of harel-ref's spec); default: contract for a transport of harel's "
                      "Protocol, else strict. Both are reported")
    cert.add_argument("--report-dir", metavar="DIR", default="reports",
                      help="where report.json and REPORT.md go (default: ./reports)")
    cert.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

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
    caps.add_argument("--acks", choices=["fenced", "by-seq"],
                      help="how ack and nack find their message: by the lease's token (fenced) or by its "
                      "seq alone (by-seq, the default for harel's Protocol)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "certify":
        return _certify(parser, args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse refuses first


def _certify(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    overrides = {
        "priority": args.priority, "routing": args.routing, "parking": args.parking,
        "durable": args.durable, "shared": args.shared, "fairness": args.fairness,
        "clock": None if args.wall_clock is None else ("wall" if args.wall_clock else "injectable"),
        "protocol": args.protocol, "acks": args.acks,
    }
    if args.target and args.bundled:
        return _usage(parser, "give either MODULE:FACTORY or --bundled NAME, not both")
    try:  # an unwritable report directory is a usage error, found before any search runs
        Path(args.report_dir).mkdir(parents=True, exist_ok=True)
        if not os.access(args.report_dir, os.W_OK):
            raise PermissionError(f"{args.report_dir} is not writable")
    except OSError as exc:
        return _usage(parser, f"--report-dir {args.report_dir!r}: {exc}")
    directory = None
    try:
        if args.target:
            target = Target.from_spec(args.target, overrides, is_async=args.is_async)
        else:
            directory = tempfile.mkdtemp(prefix="harel-ref-certify-")
            target = Target.from_bundled(args.bundled or DEFAULT_BUNDLED, directory, overrides)
        progress = None if args.quiet else _Progress(sys.stderr)
        report = certify(
            target.factory, profile=args.profile, seed=args.seed, properties=args.only,
            time_budget=args.time_budget, processes=args.processes, soak=args.soak,
            level=args.level, progress=progress, _target=target,
        )
    except (CertificationError, ValueError, TypeError) as exc:
        return _usage(parser, str(exc))
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if args.bundled and "rqlite" in args.bundled:  # the tables of its namespaces, in the cluster
            from stateful.backends.rqlite import drop_opened_tables

            drop_opened_tables()
    json_path, md_path = report.write(args.report_dir)
    width = max(len(v.property) for v in report.verdicts)
    for v in report.verdicts:
        print(f"{v.property:<{width}}  {v.verdict:<14}  {v.seconds:6.1f} s  {v.reason}")
    print(f"levels: {report.levels_line()}")
    print(f"outcome at the {LEVELS[report.level]} level: {report.outcome} "
          f"({report.seconds:.1f} s, profile {report.profile.name}, seed {report.seed})")
    print(f"report: {md_path} and {json_path}")
    for failure in report.failures:
        if failure.replay:
            print(f"replay {failure.property}: {failure.replay}")
    return report.exit_code


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"harel-ref certify: error: {message}", file=sys.stderr)
    return EXIT_CODES["usage"]


class _Progress:
    """One line per property on stderr; on a terminal, a "searching" line first."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def __call__(self, prop: str, verdict: PropertyVerdict | None) -> None:
        if verdict is None:
            if self.tty:
                self.stream.write(f"  {prop:<17} searching...")
                self.stream.flush()
            return
        if self.tty and verdict.verdict != "not applicable":
            self.stream.write("\r\033[K")
        self.stream.write(f"  {prop:<17} {verdict.verdict:<14} {verdict.seconds:6.1f} s\n")
        self.stream.flush()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
