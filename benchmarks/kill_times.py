"""How fast the default certification kills each broken variant, beside ``--only`` its property.

For each broken variant of ``tests/broken.py`` (those of SPEC.md C13, ``OF_VALUES``, those
only the probes show, ``PAST_SEARCHED_SIZES`` (C13a), and ``WIDE``, the concurrent ones of more
than three callers, by default; ``--all`` adds every
lockstep variant), two certifications, interleaved, each in a fresh interpreter: the default
run (profile standard, every property, no flags) and the focused run (``properties=`` the ones
it breaks).  Each row gives, for both, the verdict of the property it breaks (failed if it or
one it also breaks, ``ALSO_BREAKS``, failed; any other it failed is named), the seconds to the
report and the steps of its counterexample (between ``state = ...Machine()`` and
``state.teardown()``, the initial rules that draw the example's ids and clock included; for a
concurrent program, its calls).  Each certification runs as a user's
``harel-ref certify module:factory`` of an in-memory transport does: the variant's factory
imported by name (``broken.importable_factory``), its searches in processes of their own, as
many at once as there are cores (the ``jobs`` column), the concurrent search's branches in
threads.  Below: the median and maximum of the kill times, and the variants the default run
missed where the focused run caught them (SPEC.md C5: there must be none).

    python benchmarks/kill_times.py                   # OF_VALUES, seed 0
    python benchmarks/kill_times.py --all --seeds 0 1 # every lockstep variant, two seeds
    python benchmarks/kill_times.py --variants "gives up after 5 nacks"

The load average is printed before and after: the machines are shared, so read the columns of
one row, which ran back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ONE = r'''
import dataclasses, json, re, sys, time
sys.path.insert(0, sys.argv[1])
from broken import ALSO_BREAKS, BROKEN, OF_VALUES, PAST_SEARCHED_SIZES, WIDE, importable_factory
from harel_ref.certify import certify
from harel_ref.certify._progress import Progress
from harel_ref.certify._target import Target
from harel_ref.stateful._processes import FactoryRecipe

class Planned(Progress):
    def planned(self, plan):
        self.jobs = plan.jobs

name, focused, seed = sys.argv[2], sys.argv[3] == "only", int(sys.argv[4])
prop = {**BROKEN, **OF_VALUES, **PAST_SEARCHED_SIZES, **WIDE}[name][1]
breaks = (prop, *ALSO_BREAKS.get(name, ()))
factory = importable_factory(name)
# as the bundled in-memory transport runs: searches in processes, the branches in threads
target = Target.from_factory(factory, None, False)
target = dataclasses.replace(target, in_process=True, recipe=FactoryRecipe(target.recipe.spec, path=sys.argv[1]))
began = time.monotonic()
planned = Planned()
report = certify(factory, seed=seed, properties=list(breaks) if focused else None, _target=target, progress=planned)
failed = [report.verdict(p) for p in breaks if report.verdict(p).verdict == "failed"]
verdict = failed[0] if failed else report.verdict(prop)
steps = len(verdict.failure.steps) - 2 if verdict.failure and verdict.failure.steps else None
if verdict.failure and verdict.failure.found_by == "concurrent":  # a program: its calls
    steps = len(re.findall(r"\b(?:Publish|Claim|Ack|Nack|Lapse)\(", verdict.failure.reproduction))
others = [v.property for v in report.verdicts if v.verdict == "failed" and v.property != prop]
print(json.dumps({"verdict": verdict.verdict, "seconds": time.monotonic() - began, "steps": steps, "others": others,
                  "jobs": planned.jobs}))
'''


def one(name: str, way: str, seed: int, timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", ONE, str(ROOT / "tests"), name, way, str(seed)],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"verdict": f"over {timeout:g} s", "seconds": timeout, "steps": None, "others": [], "jobs": None}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"verdict": f"error: {done.stderr.strip().splitlines()[-1:]}", "seconds": 0.0, "steps": None,
                "others": []}
    return json.loads(lines[-1])


def shown(run: dict) -> str:
    """A run's verdict on the variant's property, and any other property it failed (a bug may
    show first as another property's fact: a page of groups as a routed claim that finds none)."""
    others = run.get("others") or []
    return run["verdict"] + (f" ({', '.join(others)} failed)" if others else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every lockstep variant, not only OF_VALUES")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", metavar="NAME", help="only these variants (names of tests/broken.py)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run counts as missed")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from broken import BROKEN, OF_VALUES, PAST_SEARCHED_SIZES, WIDE

    lockstep = {**BROKEN, **OF_VALUES, **PAST_SEARCHED_SIZES, **WIDE}
    names = sorted(OF_VALUES) + sorted(PAST_SEARCHED_SIZES) + sorted(WIDE) + (sorted(BROKEN) if args.all else [])
    if args.variants:
        unknown = sorted(set(args.variants) - set(lockstep))
        if unknown:
            parser.error(f"no broken variant is named {unknown}")
        names = [name for name in args.variants]
    print(f"load average at the start: {load()}; {os.cpu_count()} cores; seeds {args.seeds}\n")
    print("| variant | property | seed | default: verdict | s | steps | --only: verdict | s | steps | jobs | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    kills, missed = [], []
    for name in names:
        prop = lockstep[name][1]
        for seed in args.seeds:
            default, focused = one(name, "default", seed, args.timeout), one(name, "only", seed, args.timeout)
            if default["verdict"] == "failed":
                kills.append(default["seconds"])
            elif focused["verdict"] == "failed":
                missed.append(f"{name} (seed {seed})")
            print(f"| {name} | {prop} | {seed} | {shown(default)} | {default['seconds']:.1f} | {default['steps']} "
                  f"| {shown(focused)} | {focused['seconds']:.1f} | {focused['steps']} | {default.get('jobs')} | {load()} |",
                  flush=True)
    if kills:
        print(f"\ndefault run, kill times: median {statistics.median(kills):.1f} s, min {min(kills):.1f} s, "
              f"max {max(kills):.1f} s over {len(kills)} kills")
    print(f"missed by the default run, caught by --only: {missed or 'none'}")
    print(f"load average at the end: {load()}")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"took {time.monotonic() - started:.0f} s")
