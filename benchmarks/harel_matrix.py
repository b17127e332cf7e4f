"""harel 0.9.0's 16 transport classes certified by one command: the verdict table of docs/harel-0.9.md.

    pip install -e '.[all]'                      # harel-ref with harel 0.9.0 and every client
    bash .ci/cluster up                          # the rqlite cluster (the rqlite rows need it)
    python benchmarks/harel_matrix.py            # all 16 classes at standard, seed 0
    python benchmarks/harel_matrix.py --classes harel-memory,harel-sqlite --profile quick
    python benchmarks/harel_matrix.py --out matrix.md    # the tables also written to a file
    python benchmarks/harel_matrix.py --classes harel-memory --profile quick/10 --only close   # to try it

Each class is certified as a user would, ``harel-ref certify --bundled NAME --profile P --seed S
--level strict``, in a fresh process, one class after another, on storage the kit starts and
removes (Postgres and Redis from Debian's binaries, mongo-java-server and ElasticMQ from Maven
Central, files in a temporary directory; rqlite on the cluster of ``compose.yaml``).

It prints, as Markdown:

- the verdict table: one row per class, one column per property (``pass``, **FAIL**, ``n/a``,
  ``?`` for unknown, ``(no-loss)`` where what the property's search saw is a consequence of
  no-loss's failure and it was not judged on its own), both conformance levels, the row's time,
  and the load average before and after it; above it the harel, harel-ref and Hypothesis
  versions, the profile and the seed;
- every failure with the finding of docs/harel-0.9.md it is (:data:`FINDINGS`: what that page
  gives for the class's backend and the property).  A failure of a backend and property that
  no finding covers is listed as **new**, to be looked at: a change in harel, or in harel-ref,
  that the page does not know of yet.

A class whose certification ends without a report (it could not start its storage, say) gets a
row saying why, the rest go on, and the command exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harel_ref.certify import PROPERTIES  # noqa: E402  (the checkout's, not an installed one)

BACKENDS = ("memory", "sqlite", "libsql", "rqlite", "postgres", "redis", "mongo", "sqs")
CLASSES = tuple(f"harel-{backend}{twin}" for backend in BACKENDS for twin in ("", "-async"))

FINDINGS: dict[str, dict[str, tuple[int | str, ...]]] = {
    "memory": {"single-in-flight": (1,), "fencing": (1,), "no-loss": (1,), "tie-break": (2,), "close": (4,),
               "bad-input": (5,)},
    "sqlite": {"single-in-flight": (1,), "fencing": (1,), "no-loss": (1,), "close": (4,), "bad-input": (5,)},
    "libsql": {"single-in-flight": (1,), "fencing": (1,), "no-loss": (1, 22), "contention": (3,), "close": (4,),
               "bad-input": (5,)},
    "rqlite": {"single-in-flight": (1,), "fencing": (1,), "no-loss": (1,), "tie-break": (2,), "contention": (6,),
               "close": (4, 6), "bad-input": (5,)},
    "postgres": {"fencing": (8,), "no-loss": (8, 9), "contention": (9,), "fairness": (11,), "tie-break": (21,),
                 "fifo": (19, 22), "bad-input": (5,)},
    "redis": {"single-in-flight": (20,), "fencing": (8,), "no-loss": (8, 10), "parking": (10,), "fairness": (11,),
              "tie-break": (21,), "close": (4,), "bad-input": (5,)},
    "mongo": {"lease-expiry": (12, 13), "parking": (12,), "fencing": (8, 14), "no-loss": (8,), "fairness": (11,),
              "tie-break": (11,), "fifo": (19,), "contention": ("mongo-java-server's seq counter, not harel's",),
              "single-in-flight": ("mongo-java-server's comparison of numbers from `2**31` on, not harel's",),
              "bad-input": (5,)},
    "sqs": {"lease-expiry": (16,), "fencing": (15,), "no-loss": (17,), "close": (4,), "bad-input": (5,)},
}
"""For each backend, the findings of docs/harel-0.9.md (by number) that fail each property,
as that page's sections and its table of failures by finding give them; a text where the
failure is not harel's.  By backend, not by class: where a finding names one twin (finding 4,
close, on ``harel-sqlite-async``), the other twin failing the same property is filed under it
too.  A property the page does not know (``event-integrity``) has no entry: its failures are
new.  Keyed by property alone, an entry files every failure of its property so: a Mongo
single-in-flight failure at an everyday clock would be harel's, and still be filed as the
server's comparison, which only a clock from ``2**31`` on meets (look at its steps)."""

NUL_IDS = {"libsql", "postgres"}
"""Finding 22: group ids that differ after a NUL, merged (libSQL) or refused (Postgres), in any
search that publishes one; told by the NUL in the failing step or in the error (Postgres's
``DataError`` does not say which field held it: a NUL in an event would be filed there too)."""
NUL = re.compile(r"\\x00|\bNUL\b")
CONSEQUENCE = re.compile(r"^a consequence of ([a-z-]+)'s failure")

CELLS = {"passed": "pass", "failed": "**FAIL**", "not applicable": "n/a", "unknown": "?", "not selected": ""}


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def certify(name: str, profile: str, seed: int, only: list[str], directory: Path) -> dict:
    """One class certified in a fresh process: its report (report.json), its time and the load
    around it; ``error`` instead of the report where the run wrote none."""
    before, began = load(), time.monotonic()
    run = subprocess.run([sys.executable, "-m", "harel_ref._cli", "certify", "--bundled", name, "--profile", profile,
                          "--seed", str(seed), "--level", "strict", "--report-dir", str(directory / name),
                          *(f"--only={prop}" for prop in only)], cwd=ROOT, capture_output=True, text=True)
    row = {"name": name, "seconds": time.monotonic() - began, "load": f"{before} → {load()}"}
    report = directory / name / "report.json"
    if report.exists():
        row["report"] = json.loads(report.read_text())
    else:
        row["error"] = f"exit code {run.returncode}: {(run.stderr or run.stdout).strip()[-300:]}"
    return row


def verdict_table(rows: list[dict]) -> list[str]:
    header = ["transport", "harel contract", "harel-ref strict", *PROPERTIES, "time", "load before → after"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        if "error" in row:
            cells = [f"no report: {row['error']}".replace("|", "\\|").replace("\n", " ")] + [""] * (len(header) - 4)
        else:
            report = row["report"]
            entries = {entry["property"]: entry for entry in report["properties"]}
            levels = report["levels"]
            cells = [_level(levels.get("contract")), _level(levels.get("strict")),
                     *(_cell(entries.get(prop)) for prop in PROPERTIES)]
        lines.append(f"| `{row['name']}` | " + " | ".join([*cells, f"{row['seconds']:.0f} s", row["load"]]) + " |")
    return lines


def _cell(entry: dict | None) -> str:
    """A property's cell: its verdict, or, where it was not judged on its own because what its
    search saw is a consequence of another property's failure (SPEC.md C12), that property."""
    if entry is None:
        return ""
    if entry["verdict"] == "unknown" and (consequence := CONSEQUENCE.match(entry["reason"])):
        return f"({consequence[1]})"
    return CELLS.get(entry["verdict"], "?")


def _level(outcome: str | None) -> str:
    return "**failed**" if outcome == "failed" else outcome or "?"


def failures_by_finding(rows: list[dict]) -> tuple[list[str], int]:
    """Every failure with its finding, and how many no finding covers (new)."""
    lines, new = ["| transport | property | finding | what the certifier saw |", "| --- | --- | --- | --- |"], 0
    for row in rows:
        backend = row["name"].removeprefix("harel-").removesuffix("-async")
        for entry in row.get("report", {}).get("properties", []):
            if entry["verdict"] != "failed":
                continue
            found = (22,) if backend in NUL_IDS and NUL.search(entry["reason"]) else \
                FINDINGS[backend].get(entry["property"])
            new += found is None
            finding = ", ".join(map(str, found)) if found else "**new**: no finding covers it"
            seen = " ".join(entry["reason"].split())[:160].replace("|", "\\|")
            lines.append(f"| `{row['name']}` | {entry['property']} | {finding} | {seen} |")
    return lines, new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated, of: " + ", ".join(CLASSES))
    parser.add_argument("--profile", default="standard")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[], choices=list(PROPERTIES),
                        help="certify only this property (repeatable); its cells alone are filled")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.classes.split(",") if name.strip()]
    if unknown := [name for name in names if name not in CLASSES]:
        parser.error(f"unknown classes {unknown}; choose from {', '.join(CLASSES)}")
    head = [f"harel {version('harel')}, harel-ref {version('harel-ref')}, Hypothesis {version('hypothesis')}; "
            f"profile {args.profile}, seed {args.seed}, level strict; {os.cpu_count()} cores; load at the start {load()}",
            ""]
    rows = []
    with tempfile.TemporaryDirectory(prefix="harel-matrix-") as directory:
        for name in names:
            rows.append(certify(name, args.profile, args.seed, args.only, Path(directory)))
            print(f"{name}: {rows[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
    findings, new = failures_by_finding(rows)
    unreported = sum("error" in row for row in rows)
    text = "\n".join([*head, *verdict_table(rows), "", *findings, "",
                      f"{new} failure(s) that no finding of docs/harel-0.9.md covers; {unreported} class(es) without "
                      f"a report; load at the end {load()}"])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if unreported else 0


if __name__ == "__main__":
    sys.exit(main())
