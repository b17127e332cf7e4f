"""Claims per second on rqlite: this transport's one-request claim against the seeds' three.

The seeds' claim (seeds/004, "RqliteTransport") costs three HTTP requests, two of them Raft
writes: ``UPDATE messages ... WHERE seq = (SELECT ...)`` on /db/execute, the read-back
``SELECT ... WHERE locked_by = token`` on /db/query?level=strong, then ``UPDATE groups SET
last_claimed_at``.  RqliteTransport does the same work in one ``/db/execute?transaction``
request.  Both run here side by side, on the same cluster, against the same backlog (each in
its own tables), in alternating rounds so that any drift of the machine affects both alike.

    python benchmarks/rqlite_claim.py [--url http://127.0.0.1:4001] [--groups 400] [--per-group 5] [--claims 300]

Run it while nothing else uses the cluster.
"""

from __future__ import annotations

import argparse
import time
import uuid

import httpx

from harel_ref.transport import RqliteTransport
from harel_ref.transport._base import new_token
from harel_ref.transport._sql import Tables

__all__ = ["SeedsClaim", "main"]


class SeedsClaim:
    """The seeds' three-request claim, as written there, on the seeds' own tables (their lease
    on the message's row), made under ``prefix``."""

    def __init__(self, client: httpx.Client, url: str, prefix: str) -> None:
        self.client = client
        self.url = url
        self.t = Tables.named(prefix)
        self.clock = time.time
        self._post("/db/execute?transaction", [
            [f"CREATE TABLE {self.t.messages} (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,"
             " event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)"],
            [f"CREATE TABLE {self.t.groups} (group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0.0,"
             " priority INT NOT NULL DEFAULT 0)"],
            [f"CREATE INDEX {self.t.messages}_by_group ON {self.t.messages} (group_id, seq)"],
        ])

    def _post(self, path: str, statements: list) -> list:
        results = self.client.post(self.url + path, json=statements, timeout=10).json()["results"]
        for result in results:
            if "error" in result:
                raise RuntimeError(result["error"])
        return results

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0):
        t, now, token = self.t, self.clock(), new_token(worker_id)
        (result,) = self._post("/db/execute", [[
            f"UPDATE {t.messages} SET locked_by = ?, lock_expiry = ? WHERE seq = ("
            f" SELECT m.seq FROM {t.messages} m JOIN {t.groups} g ON g.group_id = m.group_id"
            f" WHERE (m.locked_by IS NULL OR m.lock_expiry < ?)"
            f" AND m.group_id NOT IN (SELECT group_id FROM {t.messages}"
            f"  WHERE locked_by IS NOT NULL AND lock_expiry >= ?)"
            f" AND g.priority >= ?"
            f" ORDER BY g.last_claimed_at ASC, m.seq ASC LIMIT 1)",
            token, now + visibility, now, now, min_priority,
        ]])
        if not result.get("rows_affected"):
            return None
        (rows,) = self._post("/db/query?level=strong", [[
            f"SELECT seq, group_id, event FROM {t.messages} WHERE locked_by = ?", token,
        ]])
        seq, group_id, event = rows["values"][0]
        self._post("/db/execute", [[f"UPDATE {t.groups} SET last_claimed_at = ? WHERE group_id = ?", now, group_id]])
        return seq, group_id, event, token


def _backlog(client: httpx.Client, url: str, t: Tables, groups: int, per_group: int) -> None:
    """The same backlog in every queue: ``per_group`` messages in each of ``groups`` groups,
    published in batches of 400 statements, one request each (the seeds' tables and
    harel-ref's take the same two inserts)."""
    batch = []
    for n in range(per_group):
        for g in range(groups):
            batch += [[f"INSERT INTO {t.messages} (group_id, event) VALUES (?, ?)", f"group-{g}", f"event-{g}-{n}"],
                      [f"INSERT OR IGNORE INTO {t.groups} (group_id) VALUES (?)", f"group-{g}"]]
            if len(batch) >= 400:
                client.post(url + "/db/execute?transaction", json=batch, timeout=60).raise_for_status()
                batch = []
    if batch:
        client.post(url + "/db/execute?transaction", json=batch, timeout=60).raise_for_status()


def _drop(url: str, prefix: str) -> None:
    t = Tables.named(prefix)
    httpx.post(f"{url}/db/execute?transaction", timeout=30,
               json=[[f"DROP TABLE IF EXISTS {name}"] for name in (t.messages, t.groups, t.meta)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:4001")
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--claims", type=int, default=300, help="claims per variant (< groups)")
    parser.add_argument("--round", type=int, default=25, help="claims per variant per round")
    args = parser.parse_args()
    if args.claims > args.groups:
        parser.error("--claims must not exceed --groups: each claim leases a different group")

    run = uuid.uuid4().hex[:8]
    one = RqliteTransport.from_url(args.url, prefix=f"bench_one_{run}")
    client = httpx.Client()
    try:
        seeds = SeedsClaim(client, args.url, f"bench_seeds_{run}")
        for t in (one._core.tables, seeds.t):
            _backlog(client, args.url, t, args.groups, args.per_group)
        variants = {"one request (this transport)": lambda: one.claim("bench", 3600.0),
                    "three requests (seeds)": lambda: seeds.claim("bench", 3600.0)}
        spent = dict.fromkeys(variants, 0.0)
        done = dict.fromkeys(variants, 0)
        while min(done.values()) < args.claims:
            for name, claim in variants.items():
                n = min(args.round, args.claims - done[name])
                started = time.perf_counter()
                for _ in range(n):
                    if claim() is None:
                        raise RuntimeError(f"{name}: nothing claimable; enlarge --groups")
                spent[name] += time.perf_counter() - started
                done[name] += n
        print(f"rqlite at {args.url}: backlog {args.groups} groups x {args.per_group} messages, "
              f"{args.claims} claims per variant in rounds of {args.round}")
        rates = {}
        for name in variants:
            rates[name] = done[name] / spent[name]
            print(f"  {name:32s} {rates[name]:8.1f} claims/s  ({1000 * spent[name] / done[name]:.2f} ms per claim)")
        first, second = rates.values()
        print(f"  ratio one-request / seeds: {first / second:.2f}x")
    finally:
        one.close()
        client.close()
        _drop(args.url, f"bench_one_{run}")
        _drop(args.url, f"bench_seeds_{run}")


if __name__ == "__main__":
    main()
