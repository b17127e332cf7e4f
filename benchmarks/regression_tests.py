"""Every broken variant's regression test, run against the variant and against its fixed self.

For each broken in-memory variant of ``tests/broken.py`` (the lockstep ones, and ``WIDE``,
whose races the concurrent search finds; their fixed self is ``InMemoryTransport``), each
SQLite race (``CONCURRENCY_BROKEN``, ``NARROW_RACE``, ``WIDE_RACE`` and the claims kept apart
by their process, certified by their ``module:factory`` name, so that the branches run in
processes as well as threads; their fixed self is ``SqliteTransport``) and each fault
(``FAULTS``: a nack that panics, ends its thread or hangs; their fixed self is the in-memory
reference or its asyncio twin): a focused certification of the properties it breaks (its own,
``ALSO_BREAKS`` and ``FOUND_BY``; every property for ``SHARED_ONLY``, which the shared search
alone finds), at ``--profile`` (quick by default) and then standard, each at ``--seeds`` in
turn, until one of them fails; then the regression test written for its failure (issue 44)
run twice: against the variant (it must fail) and against the fixed transport (it must pass).
A row per variant: the verdict, the seconds to the report, the test's lines and calls, and the
two outcomes, or why no test was written.  The totals at the end count the variants whose
test did both.

    python benchmarks/regression_tests.py
    python benchmarks/regression_tests.py --variants "unfenced ack" "8 lease slots"

The load average is printed before and after: the seconds are the machine's, not the tests'.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import broken  # noqa: E402
from broken import (  # noqa: E402
    BROKEN, OF_VALUES, ONE_BUG_MANY_SEARCHES, PAST_SEARCHED_SIZES, SHARED_ONLY, WIDE, broken_backend,
)

from harel_ref.certify import certify  # noqa: E402
from harel_ref.certify._target import Target  # noqa: E402
from harel_ref.stateful.backends import load  # noqa: E402
from harel_ref.stateful.backends.memory import AsyncInMemoryTransport  # noqa: E402
from harel_ref.transport import InMemoryTransport  # noqa: E402

SQLITE_RACES = {**broken.CONCURRENCY_BROKEN, **broken.NARROW_RACE, **broken.WIDE_RACE,
                "claims kept apart by their process": (broken.ClaimKeptApartByItsProcess, "single-in-flight")}
SPECS = {**broken.IMPORTABLE, "claims kept apart by their process": "broken:claim_kept_apart_by_its_process",
         "ack drops its emptied group apart": "broken:ack_drops_its_group_apart",
         "publish makes its group, then appends apart": "broken:publish_group_first_apart",
         "ack checks the token, waits, then deletes by seq": "broken:ack_check_wait_then_delete"}
FIXED_SPEC = "broken:sqlite_in_broken_dir"
FAULTS = {name: (cls, "fifo") for name, (cls, _) in broken.FAULTS.items()}  # each breaks nack alone
VARIANTS = {**BROKEN, **SHARED_ONLY, **ONE_BUG_MANY_SEARCHES, **OF_VALUES, **PAST_SEARCHED_SIZES, **WIDE, **SQLITE_RACES,
            **FAULTS}


def outcome(code: str, factory) -> str:
    """``failed`` (an assertion or pytest.fail), ``raised X`` (the call's own error), or ``passed``:
    the regression test ``code`` run with ``factory`` as its factory."""
    from test_regression import run_test

    try:
        failed = run_test(code, factory)
    except Exception as exc:  # the transport's own error at the failing call
        return f"raised {type(exc).__name__}"
    return "passed" if failed is None else "failed"


def under_test(name: str) -> tuple[Any, dict[str, Any], Any]:
    """The variant's factory, how to certify it, and its fixed self's factory."""
    if name in SPECS:  # by name: branch processes import it
        target = Target.from_spec(SPECS[name])
        return target.factory, {"_target": target}, broken.sqlite_in_broken_dir
    if name in FAULTS:  # a hang ends its search at the call deadline, here 2 s
        backend = broken.fault_backend(name)
        fixed = load("memory-async" if backend.is_async else "memory")(None).factory
        return backend.factory, {"capabilities": backend.capabilities, "is_async": backend.is_async,
                                 "call_deadline": 2.0}, fixed
    backend = broken_backend(name)
    return backend.factory, {"capabilities": backend.capabilities}, load("memory")(None).factory


def row(name: str, profiles: list[str], seeds: list[int]) -> dict:
    cls, prop = VARIANTS[name]
    factory, how, fixed = under_test(name)
    began = time.monotonic()
    # any of the properties it breaks, and that of the search that finds it: the test is of its failure
    breaks = [prop, *broken.ALSO_BREAKS.get(name, ()), *([broken.FOUND_BY[name]] if name in broken.FOUND_BY else [])]
    searched = None if name in SHARED_ONLY else breaks  # the shared search alone finds those: every property
    for profile, seed in ((profile, seed) for profile in profiles for seed in seeds):
        report = certify(factory, profile=profile, properties=searched, seed=seed, **how)
        verdict = next((v for v in map(report.verdict, breaks) if v.verdict == "failed"), report.verdict(prop))
        broken.RELEASE_HUNG.set()  # a hung call's thread ends
        broken.RELEASE_HUNG.clear()
        if verdict.verdict == "failed":
            break
    prop = verdict.property
    found = {"variant": name, "property": prop, "profile": f"{profile}, seed {seed}", "verdict": verdict.verdict,
             "seconds": time.monotonic() - began}
    failure = verdict.failure
    if failure is None or not failure.regression:
        return {**found, "why": failure.no_regression if failure else "no failure"}
    code = failure.regression
    if "check_at_once(" in code:  # a race's: its calls are the tuples of PREFIX and BRANCHES
        calls = len(re.findall(r"^ +\('", code, flags=re.MULTILINE))
    else:
        body = code[code.index("    try:"):]
        calls = body.count("q0.") + body.count("q1.")
    # a race seen in processes: its test names the factory the processes import
    fixed_code = code.replace(repr(SPECS[name]), repr(FIXED_SPEC)) if name in SPECS else code
    found.update(lines=len(code.splitlines()), calls=calls, branches="processes" if "processes=" in code else "",
                 on_variant=outcome(code, factory), on_fixed=outcome(fixed_code, fixed))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", help="these variants only (default: every in-memory one, and the "
                                                      "SQLite races)")
    parser.add_argument("--profile", default="quick", help="the focused search's profile (then standard if it passes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="the seeds tried at each profile, in turn, until the property fails")
    args = parser.parse_args()
    names = args.variants or [n for n, (cls, _) in VARIANTS.items()
                              if issubclass(cls, (InMemoryTransport, AsyncInMemoryTransport)) or n in SPECS]
    profiles = [args.profile] + (["standard"] if args.profile != "standard" else [])
    made = None if "HAREL_BROKEN_DIR" in os.environ else tempfile.mkdtemp(prefix="harel-ref-regression-")
    os.environ.setdefault("HAREL_BROKEN_DIR", made or "")  # the SQLite variants' files
    try:
        table(names, profiles, args.seeds)
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)


def table(names: list[str], profiles: list[str], seeds: list[int]) -> None:
    """Certify each variant, run its test both ways, print a row per variant and the totals."""
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| variant | property | verdict (profile) | seconds | test lines | calls | branches | on the variant | on the fixed "
          "| why no test |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        found = row(name, profiles, seeds)
        rows.append(found)
        print(f"| {name} | {found['property']} | {found['verdict']} ({found['profile']}) | {found['seconds']:.1f} | "
              f"{found.get('lines', '')} | {found.get('calls', '')} | {found.get('branches', '')} | "
              f"{found.get('on_variant', '')} | "
              f"{found.get('on_fixed', '')} | {found.get('why', '')} |", flush=True)
    written = [r for r in rows if "lines" in r]
    both = [r for r in written if r["on_variant"] != "passed" and r["on_fixed"] == "passed"]
    caught = [r for r in rows if r["verdict"] == "failed"]
    print(f"\n{len(rows)} variants, {len(caught)} failed their property, {len(written)} got a regression test, "
          f"{len(both)} of those fail on the variant and pass on the fixed transport")
    for r in written:
        if r not in both:
            print(f"  not both: {r['variant']}: on the variant {r['on_variant']}, on the fixed {r['on_fixed']}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
