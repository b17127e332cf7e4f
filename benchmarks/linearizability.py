"""How fast the linearizability checker judges long histories of a correct transport.

Records soak histories (4 threads on the in-memory transport, the soak's workload: publishes
to 12 groups, claims with leases of 20-100 ms, acks, nacks, parks, late acks; then a drain) of
1k, 10k and 100k calls, and times, interleaved over the rounds:

- ``partitioned``: ``check_linearizable(records, partition=True)``, what soaks and
  ``harel_ref.stateful.history.check`` use;
- ``whole``: the same search over the whole history at once (no partitions), where it finishes
  within its step limit (it is what the parallel search uses, on histories of a dozen calls);
- ``porcupine``: Porcupine (github.com/anishathalye/porcupine, Go), the checker a user would
  reach for, on the *same partitions* with the same one-group queue model written in Go
  (``benchmarks/porcupine/``), when Go is installed.  The Python side exports each partition
  as JSON; the Go side is timed without reading it, on one core (``GOMAXPROCS=1``) as the
  Python checker runs.

Prints the load average before and after, the median of the rounds and the ratios.
Usage: python benchmarks/linearizability.py [rounds]
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harel_ref.stateful import check_linearizable
from harel_ref.stateful._linearize import _Call, _partitions
from harel_ref.stateful.backends import load
from harel_ref.stateful.soak import soak

SIZES = (1_000, 10_000, 100_000)
HERE = Path(__file__).parent


def record(calls: int):
    backend = load("memory")()
    return list(soak(backend.factory, backend.capabilities, seconds=600, calls=calls).records)


def timed(check, records) -> tuple[float, str]:
    started = time.perf_counter()
    result = check(records)
    return time.perf_counter() - started, str(result).split(":")[0]


def partitioned(records):
    return check_linearizable(records, partition=True)


def whole(records):
    return check_linearizable(records, max_steps=300_000)


class Porcupine:
    """The Go checker, built once; each history's partitions written as JSON for it."""

    def __init__(self) -> None:
        self.binary = None
        if shutil.which("go") is None:
            self.why = "go is not installed"
            return
        self.work = Path(tempfile.mkdtemp(prefix="harel-ref-porcupine-"))
        build = subprocess.run(["go", "build", "-o", str(self.work / "check"), "."], cwd=HERE / "porcupine",
                               capture_output=True, text=True)
        if build.returncode != 0:
            self.why = f"go build failed: {build.stderr.strip()[:300]}"
            return
        self.binary = self.work / "check"

    def export(self, records, name: str) -> Path:
        """The partitions the Python checker makes, each call as the Go model reads it."""
        calls = [call for call in (_Call.of(i, r) for i, r in enumerate(records)) if not call.did_nothing]
        partitions = []
        for part in _partitions(calls):
            partitions.append([_as_json(call) for call in part])
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(partitions))
        return path

    def __call__(self, path: Path) -> tuple[float, str]:
        # One core, as the Python checker has: Porcupine checks partitions in parallel otherwise.
        out = subprocess.run([str(self.binary), str(path)], capture_output=True, text=True, check=True,
                             env={**os.environ, "GOMAXPROCS": "1"})
        seconds, verdict = out.stdout.split()
        return float(seconds), verdict

    def close(self) -> None:
        if self.binary is not None:
            shutil.rmtree(self.work, ignore_errors=True)


def _as_json(call) -> dict:
    record = call.record
    lease = record.args.get("lease") or record.result or {}
    field = (lambda name: lease.get(name)) if isinstance(lease, dict) else (lambda name: getattr(lease, name))
    return {
        "op": record.op,
        "invoke": call.invoke,
        "complete": min(call.complete, 9e9),  # JSON has no infinity; 9e9 s is after every call
        "at_lo": call.at.lo,
        "at_hi": min(call.at.hi, 1e300),
        "event": record.args.get("event", field("event") if lease else ""),
        "token": field("token") if lease else "",
        "none": record.op == "claim" and record.result is None,
        "visibility": record.args.get("visibility", 0.0),
        "delay": record.args.get("delay", 0.0),
        "answer": record.result if record.op in ("ack", "nack") else None,
    }


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"linearizability checker: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    histories = {size: record(size) for size in SIZES}
    porcupine = Porcupine()
    exported = {size: porcupine.export(h, str(size)) for size, h in histories.items()} if porcupine.binary else {}
    times: dict[tuple[int, str], list[float]] = {}
    verdicts: dict[tuple[int, str], str] = {}
    for _ in range(rounds):  # interleaved: every checker on every size, round after round
        for size, records in histories.items():
            for name, run in (("partitioned", lambda r=records: timed(partitioned, r)),
                              ("whole", lambda r=records: timed(whole, r) if len(r) <= 20_000 else (None, "skipped")),
                              ("porcupine", lambda s=size: porcupine(exported[s]) if porcupine.binary else (None, "n/a"))):
                seconds, verdict = run()
                verdicts[size, name] = verdict
                if seconds is not None:
                    times.setdefault((size, name), []).append(seconds)
    porcupine.close()
    print(f"{'calls':>8} {'partitioned':>14} {'whole':>14} {'porcupine':>14} {'porcupine/ours':>15}")
    for size, records in histories.items():
        row = [f"{len(records):>8}"]
        for name in ("partitioned", "whole", "porcupine"):
            found = times.get((size, name))
            row.append(f"{statistics.median(found):>11.3f} s " if found else f"{verdicts[size, name]:>14}")
        ours, theirs = times.get((size, "partitioned")), times.get((size, "porcupine"))
        ratio = statistics.median(theirs) / statistics.median(ours) if ours and theirs else None
        row.append(f"{ratio:>14.2f}x" if ratio else f"{'-':>15}")
        print(" ".join(row), "  verdicts:", {name: verdicts[size, name] for name in ("partitioned", "whole", "porcupine")})
    if not porcupine.binary:
        print(f"porcupine: not run ({porcupine.why})")
    print(f"median of {rounds} rounds; load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
