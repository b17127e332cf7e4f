"""SIGKILL faults on the SQLite and libSQL transports (issue 12, part 4).

Three worker processes work one database file at once, publishing, claiming (leases of 0.2 to
0.5 s of wall clock), acking and nacking; each records its calls in its own JSON-lines history.
Workers die by SIGKILL, a hundred times per backend, and a fresh worker (a new worker id)
replaces each one.  Most deaths are planned: the worker kills itself the n-th time it reaches
a chosen point *inside* a claim, ack, publish or nack (after ``BEGIN IMMEDIATE``, after each
UPDATE or DELETE before it commits, after COMMIT), or while it holds a lease between calls; the
others are timed kills sent by the driver, which land wherever the worker is.  tests/kill_worker.py has the
workers, the fork server that starts them, and the seam (a wrapper of the DB-API connection
that ``_connect()`` returns; the transports are otherwise used unchanged).

The hundred kills are dealt in rounds of ten, each round on its own queue (its own table
prefix) in the same database file.  After each round every lease and park lapses, the file
must pass ``PRAGMA integrity_check``, a final drain empties the round's queue, and the history
checker judges the round's histories (harel_ref.stateful.history.check): nothing published is lost,
nothing acked twice or redelivered after its ack, no two leases of one group overlap beyond
what lapsed leases allow, FIFO per group, and the whole history linearizable against the model.
A call cut short by a kill has no completion line: its outcome is unknown, and the checker lets
it have happened or not.  (Why rounds: the model search grows about 2.7-fold with each
unanswered claim in a group's partition, so one history with ~35 of them is undecidable within
its step budget; ten rounds of ten kills take a few seconds to judge.)

Each test's counts (kills by where they landed, operations, lost, duplicated, unknown
outcomes, elapsed) are printed, put in ``user_properties`` (``fault_counts``: the line,
``fault_counts_json``: the numbers) of the test's report, written to
``$HAREL_FAULT_COUNTS/<test>.txt`` when that variable is set, and repeated in any assertion
message.

The same harness catches a broken transport whose claim commits in two transactions
(tests/kill_worker.py ``two-step-claim``).
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harel_ref.stateful.history import History, RecordingTransport, check, drain, load

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "kill_worker.py"

KILLS = 100
WORKERS = 3
GROUPS = 6
SEED = 20240612
LAPSE = 0.6  # longer than any lease (0.5 s) or park (0.3 s) a worker takes
OVERDUE = 4.0  # a worker whose planned death has not come by then is killed from outside
RUN_LIMIT = 60.0  # seconds: a bound on one round's kill loop, so a hang fails, not stalls CI
PER_ROUND = 10  # kills per queue: the model search is exponential in unanswered claims (docstring)

# Where a planned death happens: (op, stage) in tests/kill_worker.py's names.  A round deals one
# of these two sets of ten, shuffled, in turn: every point within two rounds, and never more than
# four kills inside claims in one round (each leaves an unanswered claim; see the docstring).
# A claim and an ack are one statement each: killed at "update-groups" / "delete-messages",
# the statement has changed its rows but not committed (its RETURNING rows are not read yet).
ROUND_POINTS = [
    [("claim", "update-groups"), ("claim", "update-groups"), ("claim", "returned"),
     ("ack", "delete-messages"), ("ack", "delete-messages"), ("ack", "returned"),
     ("publish", "insert-messages"), ("nack", "update-groups"), ("idle", "holding"), ("external", None)],
    [("claim", "update-groups"), ("claim", "update-groups"), ("claim", "returned"),
     ("ack", "delete-messages"), ("ack", "delete-messages"), ("ack", "call"),
     ("publish", "begin"), ("publish", "commit"), ("idle", "holding"), ("external", None)],
]
# The broken two-step claim commits twice per claim; it marks "reserved" between the two.
TWO_STEP_POINTS = [
    [("claim", "reserved")] * 3 + [("claim", "returned"), ("ack", "delete-messages"), ("publish", "commit"),
                                   ("idle", "holding"), ("ack", "returned"), ("nack", "update-groups"),
                                   ("external", None)],
]
NTH = {"claim": (1, 6), "ack": (1, 4), "publish": (1, 6), "nack": (1, 1), "idle": (1, 4)}


def schedule(kills: int, seed: int, round_points: list[list[tuple[str, str | None]]]) -> list[dict[str, Any]]:
    """The deaths, in order: a plan for the worker to kill itself, or a delay for the driver."""
    rng = random.Random(seed)
    plans = []
    for number in range(-(-kills // PER_ROUND)):
        points = round_points[number % len(round_points)][:]
        rng.shuffle(points)
        for op, stage in points:
            if op == "external":
                plans.append({"op": op, "after": rng.uniform(0.05, 1.2)})
            else:
                plans.append({"op": op, "stage": stage, "nth": rng.randint(*NTH[op])})
    return plans[:kills]


def where(phase: str) -> str:
    """The kill's place, from the phase the worker last marked (tests/kill_worker.py)."""
    op, _, stage = phase.partition(":")
    stage = stage.split(":")[0]
    if op == "idle":
        return "holding a lease" if stage == "holding" else "between calls"
    if op in ("open", ""):
        return "while opening"
    if stage in ("invoking", "call"):
        return f"{op} before its transaction"
    if op == "nack":
        return "nack (one autocommit statement)"
    if stage in ("commit", "rollback", "returned"):
        return f"{op} committed, answer unrecorded"
    return f"{op} txn"


# --- The driver -----------------------------------------------------------------------------


@dataclass
class Life:
    name: str
    plan: dict[str, Any]
    phase: Path
    pid: int = 0
    spawned: float = 0.0
    kill_at: float = 0.0
    kill_sent: bool = False


@dataclass
class Death:
    name: str
    plan: dict[str, Any]
    phase: str
    by: str  # "self", "driver" (an external kill), "overdue" (a plan that did not come)

    @property
    def where(self) -> str:
        return where(self.phase)


@dataclass
class Round:
    """One queue (its own table prefix in the shared file) through a share of the kills."""

    number: int
    prefix: str
    deaths: list[Death] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    drained: list[tuple[str, str]] = field(default_factory=list)
    report: Any = None
    integrity: list[str] = field(default_factory=list)
    torn: int = 0
    check_seconds: float = 0.0


@dataclass
class Outcome:
    backend: str
    variant: str
    rounds: list[Round]
    counts: dict[str, Any] = field(default_factory=dict)
    line: str = ""

    @property
    def ok(self) -> bool:
        return all(r.report.ok for r in self.rounds)

    def violations(self, most: int = 3) -> str:
        bad = [r for r in self.rounds if not r.report.ok]
        return "\n".join(f"round {r.number} ({r.prefix}): {r.report}" for r in bad[:most])


class Zygote:
    """tests/kill_worker.py as a fork server: spawns and kills workers, reports their exits."""

    def __init__(self, backend: str, directory: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.stderr_path = directory / "zygote.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, cwd=str(ROOT), env=env,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "zygote-gone"})

    def send(self, command: dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send({"cmd": "quit"})
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:  # our own child: end it by its id
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=10)  # it ends at the end of the zygote's stdout
            self.proc.stdout.close()
            self._stderr.close()


def kill_run(directory: Path, backend: str, *, variant: str = "correct", kills: int = KILLS,
             seed: int = SEED, round_points: list[list[tuple[str, str | None]]] = ROUND_POINTS) -> Outcome:
    """``kills`` SIGKILLs, PER_ROUND to a queue; after each round, drain and judge it."""
    started = time.monotonic()
    db = directory / "queue.db"
    transport_class = _transport_class(backend)
    plans = schedule(kills, seed, round_points)
    rng = random.Random(seed + 1)
    rounds: list[Round] = []
    workers = iter(range(1, 10**6))
    zygote = Zygote(backend, directory)
    try:
        for number, first in enumerate(range(0, kills, PER_ROUND), start=1):
            this = Round(number, f"round{number}")
            rounds.append(this)
            transport_class(db, prefix=this.prefix).close()  # its tables, before workers race
            _kill_loop(zygote, this, plans[first:first + PER_ROUND], directory, db, backend, variant, rng, workers)
    finally:
        zygote.close()
    ran = time.monotonic() - started - sum(r.check_seconds for r in rounds)
    outcome = Outcome(backend, variant, rounds)
    outcome.counts = _counts(outcome)
    outcome.counts.update(elapsed=round(time.monotonic() - started, 1), run=round(ran, 1),
                          check=round(sum(r.check_seconds for r in rounds), 1))
    outcome.line = _line(outcome)
    return outcome


def _kill_loop(zygote: Zygote, this: Round, plans: list[dict[str, Any]], directory: Path, db: Path,
               backend: str, variant: str, rng: random.Random, workers) -> None:
    histories = directory / this.prefix / "histories"
    phases = directory / this.prefix / "phases"
    histories.mkdir(parents=True)
    phases.mkdir()
    plans = list(plans)
    live: dict[int, Life] = {}

    def handle(event: dict[str, Any]) -> None:
        if event["event"] == "zygote-gone":
            raise AssertionError(f"the zygote died:\n{zygote.stderr()}")
        if event["event"] != "exit":
            return
        life = live.pop(event["pid"])
        try:
            phase = life.phase.read_bytes().rstrip(b"\0").decode()
        except FileNotFoundError:  # killed before it wrote its first phase
            phase = ""
        if event["signal"] != signal.SIGKILL:
            raise AssertionError(
                f"worker {life.name} ended without being killed ({event}), at {phase!r}:\n{zygote.stderr()}")
        by = "self" if phase.endswith(":self") else ("driver" if life.plan["op"] == "external" else "overdue")
        this.deaths.append(Death(life.name, life.plan, phase, by))

    deadline = time.monotonic() + RUN_LIMIT
    while plans or live:
        if time.monotonic() > deadline:
            raise AssertionError(f"round {this.number} took over {RUN_LIMIT} s: {len(this.deaths)} kills so far")
        while plans and len(live) < WORKERS:
            plan = plans.pop(0)
            name = f"w{next(workers):03d}"
            life = Life(name, plan, phases / f"{name}.bin")
            config = {
                "name": name, "backend": backend, "variant": variant, "db": str(db),
                "prefix": this.prefix, "history": str(histories / f"{name}.jsonl"),
                "phase": str(life.phase), "plan": None if plan["op"] == "external" else plan,
                "groups": GROUPS, "seed": rng.randrange(2**32),
            }
            zygote.send({"cmd": "spawn", "config": config})
            while (event := zygote.events.get(timeout=30))["event"] != "spawned":
                handle(event)
            life.pid, life.spawned = event["pid"], time.monotonic()
            life.kill_at = life.spawned + (plan["after"] if plan["op"] == "external" else OVERDUE)
            live[life.pid] = life
        try:
            handle(zygote.events.get(timeout=0.01))
        except queue.Empty:
            pass
        now = time.monotonic()
        for life in list(live.values()):
            if not life.kill_sent and now >= life.kill_at:
                zygote.send({"cmd": "kill", "pid": life.pid})
                life.kill_sent = True

    time.sleep(LAPSE)  # every lease and park lapses (wall clock, as the transports use)
    this.integrity.append(_integrity(backend, db))
    drain_history = History(histories / "drain.jsonl")
    transport = _transport_class(backend)(db, prefix=this.prefix)
    try:
        this.drained = drain(RecordingTransport(transport, drain_history, "drain"))
    finally:
        transport.close()
        drain_history.close()
    this.integrity.append(_integrity(backend, db))
    this.torn = _mend_torn_lines(histories)
    this.records = load(histories)
    checking = time.monotonic()
    this.report = check(this.records, this.drained)
    this.check_seconds = time.monotonic() - checking


def _transport_class(backend: str) -> type:
    if backend == "sqlite":
        from harel_ref.transport import SqliteTransport

        return SqliteTransport
    from harel_ref.transport import LibsqlTransport  # no skip: the fault test must run

    return LibsqlTransport


def _integrity(backend: str, db: Path) -> str:
    """``PRAGMA integrity_check`` with the backend's own driver (one driver per file and process)."""
    if backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(db)
    else:
        import libsql

        conn = libsql.connect(str(db))
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    return "; ".join(str(row[0]) for row in rows)


def _mend_torn_lines(directory: Path) -> int:
    """A kill during the write of a history line can leave half a line at the end of the file
    (harel_ref.stateful.history.load would fail on it): cut it.  The call it began stays unanswered."""
    torn = 0
    for path in directory.glob("*.jsonl"):
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])
            torn += 1
    return torn


def _counts(outcome: Outcome) -> dict[str, Any]:
    records = [record for r in outcome.rounds for record in r.records]  # names and events are unique
    deaths = [death for r in outcome.rounds for death in r.deaths]
    violations = [v for r in outcome.rounds for v in r.report.violations]
    work = [r for r in records if r.worker != "drain"]
    ops = Counter(r.op for r in work)
    unknown = Counter(r.op for r in work if r.complete is None)
    errors = Counter(r.op for r in work if r.complete is not None and r.error is not None)
    stale = sum(1 for r in work if r.op == "ack" and r.ok and r.result is False)

    # Deliveries of one message by more than one claim: each must follow a nack of the lease
    # before it, or come after that lease may have lapsed.
    deliveries = defaultdict(list)
    for record in records:
        if record.op == "claim" and record.ok and record.result is not None:
            deliveries[(record.result["group_id"], record.result["event"])].append(record)
    nacked = {r.args["lease"]["token"]: r for r in records  # given back, or maybe (killed)
              if r.op == "nack" and (r.complete is None or (r.ok and r.result is True))}
    after_nack = after_lapse = unexplained = 0
    for claims in deliveries.values():
        claims.sort(key=lambda r: r.complete)  # concurrent claims: the one answered first led
        for before, after in zip(claims, claims[1:]):
            nack = nacked.get(before.result["token"])
            if nack is not None and nack.invoke <= after.complete:
                after_nack += 1
            elif before.invoke + before.args["visibility"] <= after.complete:
                after_lapse += 1
            else:
                unexplained += 1
    # Each kill inside a call left exactly that call unanswered, and a kill between calls none.
    unanswered = defaultdict(list)
    for record in work:
        if record.complete is None:
            unanswered[record.worker].append(record.op)
    mismatched = []
    for death in deaths:
        op, _, stage = death.phase.partition(":")
        expected = [[op]] if op in ("publish", "claim", "ack", "nack") else [[]]
        if stage.startswith(("invoking", "returned")):  # killed while writing a history line
            expected.append([])
        if unanswered.get(death.name, []) not in expected:
            mismatched.append(f"{death.name} killed at {death.phase!r}, unanswered {unanswered.get(death.name, [])}")
    kills = Counter(death.where for death in deaths)
    integrity = Counter(result for r in outcome.rounds for result in r.integrity)
    return {
        "backend": outcome.backend,
        "variant": outcome.variant,
        "rounds": len(outcome.rounds),
        "kills": len(deaths),
        "kills_by_place": dict(sorted(kills.items(), key=lambda item: (-item[1], item[0]))),
        "kills_by": dict(Counter(death.by for death in deaths)),
        "workers": len(deaths),  # one life per kill: every worker dies by SIGKILL
        "operations": len(work),
        "operations_by_op": dict(sorted(ops.items())),
        "unknown_outcomes": sum(unknown.values()),
        "unknown_by_op": dict(sorted(unknown.items())),
        "unknown_not_matching_kills": mismatched,
        "errors": dict(errors),
        "lost": sum(len(r.report.lost) for r in outcome.rounds),
        "acked_twice": sum(len(r.report.duplicates) for r in outcome.rounds),
        "redelivered": after_nack + after_lapse + unexplained,
        "redelivered_after_lapse": after_lapse,
        "redelivered_after_nack": after_nack,
        "redelivered_unexplained": unexplained,
        "stale_acks_refused": stale,
        "drained": sum(len(r.drained) for r in outcome.rounds),
        "torn_history_lines": sum(r.torn for r in outcome.rounds),
        "integrity": dict(integrity),
        "violations": len(violations),
        "violation_kinds": dict(Counter(v.kind for v in violations)),
        "model_steps": sum(r.report.linearizability.steps for r in outcome.rounds),
    }


def _line(outcome: Outcome) -> str:
    c = outcome.counts
    places = ", ".join(f"{place} {n}" for place, n in c["kills_by_place"].items())
    by = ", ".join(f"{who} {n}" for who, n in sorted(c["kills_by"].items()))
    ops = ", ".join(f"{op} {n}" for op, n in c["operations_by_op"].items())
    unknown = ", ".join(f"{op} {n}" for op, n in c["unknown_by_op"].items())
    integrity = ", ".join(f"{result} x{n}" for result, n in c["integrity"].items())
    kinds = f" ({', '.join(f'{k} {n}' for k, n in c['violation_kinds'].items())})" if c["violations"] else ""
    return (
        f"kill faults [{c['backend']}, {c['variant']}]: kills {c['kills']} ({places}; by {by}); "
        f"workers {c['workers']}; operations {c['operations']} ({ops}); lost {c['lost']}; "
        f"duplicated: acked twice {c['acked_twice']}, redelivered {c['redelivered']} "
        f"({c['redelivered_after_lapse']} after a lapse, {c['redelivered_after_nack']} after a nack, "
        f"{c['redelivered_unexplained']} unexplained); unknown outcomes {c['unknown_outcomes']} ({unknown}); "
        f"stale acks refused {c['stale_acks_refused']}; drained {c['drained']}; "
        f"torn history lines {c['torn_history_lines']}; integrity_check {integrity}; "
        f"violations {c['violations']}{kinds}; {c['rounds']} rounds, model search {c['model_steps']} steps; elapsed {c['elapsed']} s (kill loop {c['run']} s, check {c['check']} s)"
    )


def _publish(request: pytest.FixtureRequest, outcome: Outcome) -> None:
    """Print the counts and leave them where CI can show them (see the module docstring)."""
    request.node.user_properties.append(("fault_counts", outcome.line))
    request.node.user_properties.append(("fault_counts_json", json.dumps(outcome.counts)))
    print("\n" + outcome.line)
    directory = os.environ.get("HAREL_FAULT_COUNTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        (Path(directory) / f"{name}.txt").write_text(outcome.line + "\n" + json.dumps(outcome.counts) + "\n")


# --- The tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "libsql"])
def test_a_hundred_sigkills_lose_and_duplicate_nothing(backend, tmp_path, request):
    outcome = kill_run(tmp_path, backend)
    _publish(request, outcome)
    c = outcome.counts
    assert outcome.ok, f"{outcome.line}\n{outcome.violations()}"
    assert c["kills"] == KILLS, outcome.line
    assert set(c["integrity"]) == {"ok"}, outcome.line
    assert c["lost"] == 0 and c["acked_twice"] == 0 and c["redelivered_unexplained"] == 0, outcome.line
    assert not c["errors"], outcome.line  # no StorageError: a dead writer's lock is released
    # A call cut short by the kill is in the history, unanswered (an unknown outcome), and no other.
    assert not c["unknown_not_matching_kills"] or c["torn_history_lines"], c["unknown_not_matching_kills"]
    # The kills landed where they were meant to: inside claim and ack transactions, and more.
    places = c["kills_by_place"]
    assert places.get("claim txn", 0) >= 15 and places.get("ack txn", 0) >= 15, outcome.line
    assert places.get("claim committed, answer unrecorded", 0) >= 5, outcome.line
    assert c["unknown_outcomes"] >= 50, outcome.line
    assert c["redelivered_after_lapse"] > 0, outcome.line


def test_the_same_kills_catch_a_claim_committed_in_two_transactions(tmp_path, request):
    """A claim that reserves the head in one transaction and sets its lease in a second: a kill
    between the two blocks the group for an hour, and the drain cannot reach its messages.
    (The same harness, with a kill point this claim has: between its two COMMITs.)"""
    outcome = kill_run(tmp_path, "sqlite", variant="two-step-claim", kills=20, round_points=TWO_STEP_POINTS)
    _publish(request, outcome)
    assert not outcome.ok, f"the checker missed the broken claim: {outcome.line}"
    assert outcome.counts["lost"] > 0, f"{outcome.line}\n{outcome.violations()}"


def test_a_torn_history_line_is_mended_not_fatal(tmp_path):
    """What a kill in the middle of a history write leaves is cut off, the call unanswered."""
    history = History(tmp_path / "w.jsonl")
    call = history.invoke("w", "ack", lease={"group_id": "g", "event": "e", "seq": 1, "token": "t"})
    call.complete(True)
    history.invoke("w", "ack", lease={"group_id": "g", "event": "f", "seq": 2, "token": "u"})
    history.close()
    path = tmp_path / "w.jsonl"
    path.write_bytes(path.read_bytes()[:-7])  # the second invocation line, cut short
    assert _mend_torn_lines(tmp_path) == 1
    (record,) = load(tmp_path)
    assert record.result is True


def test_where_a_kill_landed():
    assert where("claim:update-groups:self") == "claim txn"
    assert where("ack:begin") == "ack txn"
    assert where("ack:commit:self") == "ack committed, answer unrecorded"
    assert where("claim:returned") == "claim committed, answer unrecorded"
    assert where("publish:call") == "publish before its transaction"
    assert where("ack:invoking") == "ack before its transaction"
    assert where("idle:holding:self") == "holding a lease"
    assert where("idle:between") == "between calls"
    assert where("open:pragma") == "while opening"
    assert where("nack:update-groups") == "nack (one autocommit statement)"
