"""How long the certifier takes to reach a verdict, now and at an earlier commit, side by side.

Two tables, each run interleaved (before, then after, for each row) in fresh interpreters:

1. Time to a verdict: ``harel-ref certify --bundled NAME --profile P`` for each transport and
   profile asked for; each side one at a time and with ``--jobs N`` (the earlier commit only one
   at a time if it has no ``--jobs``).
2. Time to kill: each broken variant of ``tests/broken.py`` certified on the property it breaks
   (profile quick) at several seeds; the seconds until the verdict "failed" (median and maximum
   over the seeds), and the seeds at which it was missed.  Below the table: the median over the
   variants of each one's median, and the median of every kill, a miss counted as never (a
   variant's median leaves its misses out).

The earlier commit is checked out with ``git worktree`` into a temporary directory and laid out
as its wheel would be, and so is a copy of this checkout taken at the start: each side imports
its own ``harel_ref``, and editing the checkout during a run changes nothing.  Each run
starts in a temporary directory, which is removed afterwards, as is the worktree.

    python benchmarks/certify_speed.py                       # memory and sqlite at quick and standard
    python benchmarks/certify_speed.py --transports rqlite --profiles quick --kill-seeds 0
    python benchmarks/certify_speed.py --before 8a39f0a --kill-seeds 5
    python benchmarks/certify_speed.py --before 8a39f0a --skip-times --kill-seeds 10 --first-seed 5
    python benchmarks/certify_speed.py --before none --transports rqlite --profiles standard --kill-seeds 0

The load average is printed before and after each row: the machines are shared, so compare
the columns of one row, which ran back to back.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLI = "import sys; from harel_ref._cli import main; sys.exit(main(sys.argv[1:]))"

KILLS = r'''
import json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])  # the tree's tests/
from broken import BROKEN, CONCURRENCY_BROKEN, broken_backend, broken_sqlite_backend
from harel_ref.certify import certify

seed = int(sys.argv[2])
variants = [(name, prop, False) for name, (_, prop) in BROKEN.items()]
variants += [(name, prop, True) for name, (_, prop) in CONCURRENCY_BROKEN.items()]
for name, prop, concurrent in variants[:int(sys.argv[3]) or None]:
    with tempfile.TemporaryDirectory() as files:
        backend = broken_sqlite_backend(name, files) if concurrent else broken_backend(name)
        began = time.monotonic()
        report = certify(backend.factory, backend.capabilities, profile="quick", properties=[prop], seed=seed)
        seconds = time.monotonic() - began
    print(json.dumps({"variant": name, "property": prop, "verdict": report.verdict(prop).verdict,
                      "seconds": seconds}), flush=True)
'''


def wheel_layout(tree: Path, site: Path) -> None:
    """``tree``'s packages laid out as its wheel installs them: model/ and stateful/ inside
    harel_ref/, or beside it for a commit from before they moved there (such as 8a39f0a, where
    issue 19's figures start), whose wheel had them as top-level packages."""
    shutil.copytree(tree / "harel_ref", site / "harel_ref")
    nested = "harel_ref.stateful" in (tree / "pyproject.toml").read_text()
    for name in ("model", "stateful"):
        if (tree / name).is_dir():
            shutil.copytree(tree / name, site / "harel_ref" / name if nested else site / name)


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def run(code: list[str], site: Path, *, timeout: float = 7200) -> tuple[float, subprocess.CompletedProcess]:
    """Run a Python command in a fresh temporary directory; its wall time and result."""
    env = dict(os.environ)
    env.pop("HAREL_REF_JOBS", None)
    env["PYTHONPATH"] = str(site)
    with tempfile.TemporaryDirectory(prefix="certify-speed-") as cwd:
        began = time.monotonic()
        done = subprocess.run([sys.executable, *code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return time.monotonic() - began, done


def verdict_time(site: Path, transport: str, profile: str, jobs: int | None) -> str:
    args = ["-c", CLI, "certify", "--bundled", transport, "--profile", profile, "--quiet", "--report-dir", "reports"]
    if jobs is not None:
        args += ["--jobs", str(jobs)]
    seconds, done = run(args, site)
    outcome = re.search(r"outcome at the .* level: (\w+) \(([\d.]+) s, profile (\S+),", done.stdout)
    if outcome is None:
        return f"error ({done.returncode}): {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return f"{seconds:6.1f} s {outcome.group(1)} ({outcome.group(3)})"


def kill_times(site: Path, tests: Path, seed: int, variants: int) -> dict[str, dict]:
    seconds, done = run(["-c", KILLS, str(tests), str(seed), str(variants)], site)
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[row["variant"]] = row
    if done.returncode != 0:
        print(f"  (seed {seed} stopped: {done.stderr.strip().splitlines()[-1:]})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="7905f4d", help="the commit to compare with (default: 7905f4d, "
                        "the last one before searches ran in processes; 8a39f0a is where issue 19 started); "
                        "'none': this checkout only, for rows too long to run twice")
    parser.add_argument("--transports", default="memory,sqlite", help="bundled transports, comma-separated")
    parser.add_argument("--profiles", default="quick,standard", help="profiles, comma-separated")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="jobs of the parallel column")
    parser.add_argument("--kill-seeds", type=int, default=3, help="seeds per broken variant (0: no kill table)")
    parser.add_argument("--first-seed", type=int, default=0, help="the kill table's seeds start here")
    parser.add_argument("--variants", type=int, default=0, help="only the first N broken variants (0: all)")
    parser.add_argument("--skip-times", action="store_true", help="only the kill table")
    args = parser.parse_args()
    compare = args.before != "none"

    signal.signal(signal.SIGTERM, _interrupt)  # so that the worktree is removed on kill too
    with tempfile.TemporaryDirectory(prefix="certify-speed-before-") as scratch:
        before_tree, before_site = Path(scratch) / "tree", Path(scratch) / "site"
        after_site, after_tests = Path(scratch) / "after", Path(scratch) / "after-tests"
        wheel_layout(ROOT, after_site)  # a copy: editing the checkout during a run changes nothing
        shutil.copytree(ROOT / "tests", after_tests)
        if compare:
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before_tree), args.before], cwd=ROOT, check=True)
        try:
            if compare:
                wheel_layout(before_tree, before_site)
            print(f"certify_speed: before = {args.before}, after = this checkout; {os.cpu_count()} cores; "
                  f"Python {sys.version.split()[0]}; load average at start {load()}")
            if not args.skip_times:
                print("\ntime to a verdict (wall seconds of the command; verdict; the profile that ran)")
                has_jobs = compare and "--jobs" in (before_site / "harel_ref" / "_cli.py").read_text()
                print(f"{'transport':<10} {'profile':<9} {'before, serial':<32} {f'before, --jobs {args.jobs}':<32} "
                      f"{'after, --jobs 1':<32} {f'after, --jobs {args.jobs}':<32} {'ratio':>6}  load")
                for transport in args.transports.split(","):
                    for profile in args.profiles.split(","):
                        before = verdict_time(before_site, transport, profile, 1 if has_jobs else None) if compare else "-"
                        before_spread = verdict_time(before_site, transport, profile, args.jobs) if has_jobs else "-"
                        serial = verdict_time(after_site, transport, profile, 1)
                        spread = verdict_time(after_site, transport, profile, args.jobs)
                        ratio = _ratio(before_spread if has_jobs else before, spread)
                        print(f"{transport:<10} {profile:<9} {before:<32} {before_spread:<32} {serial:<32} {spread:<32} "
                              f"{ratio:>6}  {load()}", flush=True)
            if args.kill_seeds and compare:
                kill_table(before_tree / "tests", before_site, after_tests, after_site,
                           range(args.first_seed, args.first_seed + args.kill_seeds), args.variants)
        finally:
            if compare:
                subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT, check=False)
    print(f"\nload average at the end {load()}")


def kill_table(before_tests: Path, before_site: Path, after_tests: Path, after_site: Path, seeds: range,
               variants: int) -> None:
    print(f"\ntime to kill (profile quick, the variant's property only; seconds until 'failed' over seeds "
          f"{seeds.start}..{seeds.stop - 1}: median / max; missed: seeds at which it passed)")
    before: dict[str, list] = {}
    after: dict[str, list] = {}
    for seed in seeds:  # interleaved: a seed of each, in turn
        for variant, row in kill_times(before_site, before_tests, seed, variants).items():
            before.setdefault(variant, []).append(row)
        for variant, row in kill_times(after_site, after_tests, seed, variants).items():
            after.setdefault(variant, []).append(row)
        print(f"  seed {seed} done, load average {load()}", flush=True)
    print(f"{'variant':<52} {'property':<17} {'before':<22} {'after':<22}")
    medians: dict[str, list] = {"before": [], "after": []}
    every: dict[str, list] = {"before": [], "after": []}  # each (variant, seed): its seconds, or inf if missed
    for variant in after:
        cells = []
        for side, rows in (("before", before.get(variant, [])), ("after", after[variant])):
            killed = [r["seconds"] for r in rows if r["verdict"] == "failed"]
            missed = len(rows) - len(killed)
            every[side] += killed + [math.inf] * missed
            if killed:
                medians[side].append(statistics.median(killed))
            cell = f"{statistics.median(killed):5.1f} / {max(killed):5.1f}" if killed else "never"
            cells.append(cell + (f" ({missed} missed)" if missed else ""))
        print(f"{variant[:52]:<52} {after[variant][0]['property']:<17} {cells[0]:<22} {cells[1]:<22}")
    for side, values in medians.items():
        if values:
            print(f"median over the variants of the median time to kill, {side}: {statistics.median(values):.2f} s; "
                  f"the largest: {max(values):.2f} s")
    for side, values in every.items():
        if values:
            print(f"median of every kill (a miss counts as never), {side}: {statistics.median(values):.2f} s "
                  f"over {len(values)}; misses: {values.count(math.inf)}")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _ratio(before: str, after: str) -> str:
    numbers = [re.match(r"\s*([\d.]+) s", cell) for cell in (before, after)]
    if not all(numbers):
        return "-"
    return f"{float(numbers[0].group(1)) / float(numbers[1].group(1)):.2f}x"


if __name__ == "__main__":
    main()
