"""harel-ref's Postgres, Redis, Mongo and SQS transports beside the queues a user would run on the same servers.

    pip install -e '.[all]'                              # psycopg, redis-py, PyMongo, harel 0.9.0
    python benchmarks/servers.py                         # durable throwaway servers, 3 rounds
    python benchmarks/servers.py --seconds 1 --rounds 1 --scale 0.05   # to try it out
    python benchmarks/servers.py --servers mongo         # one family (postgres, redis, mongo, sqs)
    HAREL_POSTGRES_URL=... HAREL_REDIS_URL=... HAREL_MONGO_URL=... HAREL_SQS_URL=... python benchmarks/servers.py

**Throughput**: claim+ack per second for ``--seconds``, with 1, 4 and 16 workers (threads, each
with its own transport and connection), the queue holding ``--messages`` messages in
``--groups`` groups when the clock starts.  The peers:

- Postgres: harel-ref ``PostgresTransport``; harel 0.9.0's ``PostgresTransport`` (unfenced
  nack, no arrival order); a plain ``SKIP LOCKED`` job table without groups (one row per job,
  claim = lease the first free row, ack = delete it): the known limit of that design;
- Redis: harel-ref ``RedisTransport``; harel 0.9.0's ``RedisTransport``; a plain reliable queue
  (``LMOVE jobs processing``, ack = ``LREM processing``), without groups;
- Mongo (mongo-java-server 1.47.0 in memory, or a server of yours): harel-ref
  ``MongoTransport`` (compare-and-set, no transactions, docs/mongo.md); harel 0.9.0's
  ``MongoTransport`` (one ``find_one_and_update`` per claim, unfenced park); a plain job
  collection without groups (claim = ``find_one_and_update`` of the first due job, ack =
  ``delete_one``).
- SQS (ElasticMQ 1.7.1 in memory, or a server of yours): harel-ref ``SqsTransport``; harel
  0.9.0's ``SqsTransport`` (``wait_seconds=0``, as the certifier runs it); the same
  ``ReceiveMessage`` and ``DeleteMessage`` requests made directly (the limit of any transport on
  SQS); at most ``SQS_BACKLOG`` messages per fill, and no latency scenarios (see there).

**Claim latency** (the median of ``--samples`` claims, each followed by an untimed ack) for
harel-ref and harel 0.9.0 on each server: (a) 1,000 groups; (c) 100,000 groups of which 20,000
are blocked (half leased, half parked, until far in the future).

Every figure is measured ``--rounds`` times with the peers in a rotating order, and the median
is printed with the range, and the load average before and after each round.  The throwaway
Postgres server runs with ``fsync`` on (``PostgresServer(durable=True)``); the throwaway Redis
with no persistence (Redis's common cache setting; every peer alike).  Tables and keys are
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import load, rounds, spread  # noqa: E402  (benchmarks/ is not a package)

from harel_ref.transport import PostgresTransport, RedisTransport  # noqa: E402
from harel_ref.transport.postgres import PgNames  # noqa: E402
from harel_ref.transport.redis import key_prefix  # noqa: E402

FAR = 1e12  # a lease or park end no benchmark outlives
EVENT = '{"kind": "bench"}'


@dataclass
class Peer:
    """A queue under test: ``fill(messages, groups)`` loads a fresh backlog, ``worker()``
    gives one worker's ``(claim, ack)`` pair (its own connection), ``close()`` cleans up."""

    fill: Callable[[int, int], None]
    worker: Callable[[], tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], None]]]
    close: Callable[[], None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput: seconds per run")
    parser.add_argument("--messages", type=int, default=40_000, help="throughput: backlog at the start of a run")
    parser.add_argument("--groups", type=int, default=4_000)
    parser.add_argument("--samples", type=int, default=300, help="latency: claims timed per scenario and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="latency: scenario sizes times this")
    parser.add_argument("--only", choices=["throughput", "latency"])
    parser.add_argument("--servers", default="postgres,redis,mongo,sqs",
                        help="the families to run, comma-separated (default: postgres,redis,mongo,sqs)")
    args = parser.parse_args()
    kinds = [kind.strip() for kind in args.servers.split(",") if kind.strip()]
    if not kinds or set(kinds) - set(SERVERS):
        parser.error(f"--servers takes some of {', '.join(SERVERS)}, got {args.servers!r}")

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, python {sys.version.split()[0]}, {os.cpu_count()} cores, {load()}",
          flush=True)
    with ExitStack() as stack:
        urls = {kind: start(stack) for kind, start in SERVERS.items() if kind in kinds}
        if args.only in (None, "throughput"):
            throughput_table(urls, args)
        if args.only in (None, "latency"):
            latency_table(urls, args)
    print(f"\n# done, {load()}")


def _postgres_server(stack: ExitStack) -> str:
    from harel_ref.testing.servers import PostgresServer

    url = os.environ.get("HAREL_POSTGRES_URL") or stack.enter_context(PostgresServer(durable=True)).url
    import psycopg

    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    print(f"# postgres {version} (fsync {fsync})", flush=True)
    return url


def _redis_server(stack: ExitStack) -> str:
    from harel_ref.testing.servers import RedisServer

    url = os.environ.get("HAREL_REDIS_URL") or stack.enter_context(RedisServer()).url
    client = _redis(url)
    version = client.info("server")["redis_version"]
    aof = client.config_get("appendonly")["appendonly"]
    client.close()
    print(f"# redis {version} (appendonly {aof})", flush=True)
    return url


def _mongo_server(stack: ExitStack) -> str:
    from harel_ref.testing.servers import MongoServer

    url = os.environ.get("HAREL_MONGO_URL") or stack.enter_context(MongoServer()).url
    with _mongo(url) as client:
        version = client.server_info().get("version")
    print(f"# mongo {version} at {url}" + ("" if os.environ.get("HAREL_MONGO_URL") else " (mongo-java-server 1.47.0, memory backend)"),
          flush=True)
    return url


def _sqs_server(stack: ExitStack) -> str:
    from harel_ref.testing.servers import SqsServer

    url = os.environ.get("HAREL_SQS_URL") or stack.enter_context(SqsServer()).url
    print(f"# sqs at {url}" + ("" if os.environ.get("HAREL_SQS_URL") else " (ElasticMQ 1.7.1, in memory)")
          + f"; at most {SQS_BACKLOG:,} messages per fill", flush=True)
    return url


SERVERS = {"postgres": _postgres_server, "redis": _redis_server, "mongo": _mongo_server, "sqs": _sqs_server}


# --- Postgres peers ----------------------------------------------------------------------------


def _pg(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def harel_ref_postgres(url: str, prefix: str = "bench_ref") -> Peer:
    PostgresTransport(url, prefix=prefix).close()  # creates the tables and functions
    n = PgNames.named(prefix)

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _pg(url) as conn:
            conn.execute(f"TRUNCATE {n.messages}, {n.groups}")
            # blocked groups first in claim order (stamp 0), half leased, half parked
            conn.execute(f"INSERT INTO {n.groups} (group_id, last_claimed_at, locked_by, lock_expiry)"
                         f" SELECT convert_to('b' || i, 'UTF8'), 0,"
                         f" CASE WHEN i %% 2 = 0 THEN convert_to('bench:token' || i, 'UTF8') ELSE convert_to('__parked__', 'UTF8') END,"
                         f" {FAR} FROM generate_series(1, %s) i", (blocked,))
            conn.execute(f"INSERT INTO {n.messages} (group_id, event) SELECT convert_to('b' || i, 'UTF8'),"
                         f" convert_to(%s, 'UTF8') FROM generate_series(1, %s) i", (EVENT, blocked))
            conn.execute(f"UPDATE {n.groups} g SET leased_seq = m.seq FROM {n.messages} m"
                         f" WHERE m.group_id = g.group_id AND g.locked_by <> convert_to('__parked__', 'UTF8')")
            conn.execute(f"INSERT INTO {n.groups} (group_id, last_claimed_at) SELECT convert_to('g' || i, 'UTF8'), 1"
                         f" FROM generate_series(1, %s) i", (groups,))
            conn.execute(f"INSERT INTO {n.messages} (group_id, event) SELECT convert_to('g' || (i %% %s + 1), 'UTF8'),"
                         f" convert_to(%s, 'UTF8') FROM generate_series(1, %s) i", (groups, EVENT, messages))
            conn.execute(f"ANALYZE {n.groups}")
            conn.execute(f"ANALYZE {n.messages}")

    def worker():
        transport = PostgresTransport(url, prefix=prefix)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, transport.close

    def close() -> None:
        with _pg(url) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {n.messages}, {n.groups}, {n.meta}")
            for function in (n.publish, n.claim, n.ack):
                conn.execute(f"DROP FUNCTION IF EXISTS {function}")

    return Peer(fill, worker, close)


def harel_postgres(url: str, prefix: str = "bench_harel") -> Peer:
    from harel.engine.transport.postgres import PostgresTransport as HarelPostgres

    from harel_ref.stateful._harel import to_event

    HarelPostgres(_pg(url), prefix=prefix)  # creates its tables and functions
    event = to_event("bench").model_dump_json()
    messages_table, groups_table = f"{prefix}_transport_messages", f"{prefix}_transport_groups"

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _pg(url) as conn:
            conn.execute(f"TRUNCATE {messages_table}, {groups_table}")
            conn.execute(f"INSERT INTO {groups_table} (group_id, locked_by, lock_expiry)"
                         f" SELECT 'b' || i, 'bench:token' || i, {FAR} FROM generate_series(1, %s) i", (blocked,))
            conn.execute(f"INSERT INTO {messages_table} (group_id, event) SELECT 'b' || i, %s"
                         f" FROM generate_series(1, %s) i", (event, blocked))
            conn.execute(f"INSERT INTO {groups_table} (group_id, lock_expiry) SELECT 'g' || i, 1"
                         f" FROM generate_series(1, %s) i", (groups,))
            conn.execute(f"INSERT INTO {messages_table} (group_id, event) SELECT 'g' || (i %% %s + 1), %s"
                         f" FROM generate_series(1, %s) i", (groups, event, messages))
            conn.execute(f"ANALYZE {groups_table}")
            conn.execute(f"ANALYZE {messages_table}")

    def worker():
        conn = _pg(url)
        conn.autocommit = False  # harel's transport commits itself
        transport = HarelPostgres(conn, prefix=prefix, create_schema=False)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, conn.close

    def close() -> None:
        with _pg(url) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {messages_table}, {groups_table}")
            conn.execute(f"DROP FUNCTION IF EXISTS {prefix}_claim, {prefix}_ack")

    return Peer(fill, worker, close)


def skip_locked_jobs(url: str, table: str = "bench_jobs") -> Peer:
    with _pg(url) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL,"
                     f" locked_by TEXT, lock_expiry DOUBLE PRECISION)")
    claim_sql = (f"UPDATE {table} SET locked_by = %s, lock_expiry = %s WHERE id = (SELECT id FROM {table}"
                 f" WHERE locked_by IS NULL OR lock_expiry < %s ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
                 f" RETURNING id")

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _pg(url) as conn:
            conn.execute(f"TRUNCATE {table}")
            conn.execute(f"INSERT INTO {table} (payload) SELECT %s FROM generate_series(1, %s)", (EVENT, messages))
            conn.execute(f"ANALYZE {table}")

    def worker():
        conn = _pg(url)
        token = f"bench:{threading.get_ident()}"

        def claim():
            now = time.time()
            row = conn.execute(claim_sql, (token, now + 60.0, now)).fetchone()
            return row and row[0]

        return claim, lambda job: conn.execute(f"DELETE FROM {table} WHERE id = %s AND locked_by = %s", (job, token)), conn.close

    def close() -> None:
        with _pg(url) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")

    return Peer(fill, worker, close)


# --- Redis peers -------------------------------------------------------------------------------


def _redis(url: str):
    import redis

    return redis.Redis.from_url(url)


def harel_ref_redis(url: str, prefix: str = "bench_ref") -> Peer:
    k = key_prefix(prefix)

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        client = _redis(url)
        _delete(client, f"{k}:*")
        pipe = client.pipeline(transaction=False)
        seq = 0
        for i in range(1, blocked + 1):  # first in claim order (stamp 0), half leased, half parked
            seq += 1
            group = f"b{i}"
            pipe.rpush(f"{k}:q:{group}", f"{seq}\n{EVENT}")
            holder = f"bench:token{i}" if i % 2 == 0 else "__parked__"
            pipe.hset(f"{k}:g:{group}", mapping={"priority": 0, "stamp": "0", "arrival": i, "holder": holder,
                                                 "ends": repr(FAR), "leased": seq})
            pipe.zadd(f"{k}:held", {group: FAR})
            if i % 5000 == 0:
                pipe.execute()
        for i in range(1, groups + 1):
            group, arrival = f"g{i}", blocked + i
            pipe.hset(f"{k}:g:{group}", mapping={"priority": 0, "stamp": "1", "arrival": arrival})
            pipe.zadd(f"{k}:free:0", {f"{arrival:020d}{group}": 1})
            if i % 5000 == 0:
                pipe.execute()
        for i in range(messages):
            seq += 1
            pipe.rpush(f"{k}:q:g{i % groups + 1}", f"{seq}\n{EVENT}")
            if i % 5000 == 0:
                pipe.execute()
        pipe.set(f"{k}:seq", seq)
        pipe.set(f"{k}:arrivals", blocked + groups)
        pipe.execute()
        client.close()

    def worker():
        transport = RedisTransport(url, prefix=prefix)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, transport.close

    def close() -> None:
        client = _redis(url)
        _delete(client, f"{k}:*")
        client.close()

    return Peer(fill, worker, close)


def harel_redis(url: str, prefix: str = "bench_harel") -> Peer:
    from harel.engine.transport.redis import RedisTransport as HarelRedis

    from harel_ref.stateful._harel import to_event

    event = to_event("bench")

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        client = _redis(url)
        _delete(client, f"{prefix}:*")
        transport = HarelRedis(client, prefix=prefix)
        for i in range(1, blocked + 1):  # published and claimed with a long lease: blocked
            transport.publish(f"b{i}", event)
        for _ in range(blocked):
            transport.claim("bench", FAR / 1e6)
        for i in range(messages):
            transport.publish(f"g{i % groups + 1}", event)
        client.close()

    def worker():
        client = _redis(url)
        transport = HarelRedis(client, prefix=prefix)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, client.close

    def close() -> None:
        client = _redis(url)
        _delete(client, f"{prefix}:*")
        client.close()

    return Peer(fill, worker, close)


def lmove_queue(url: str, prefix: str = "bench_lmove") -> Peer:
    jobs, processing = f"{prefix}:jobs", f"{prefix}:processing"

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        client = _redis(url)
        client.delete(jobs, processing)
        for start in range(0, messages, 5000):
            client.rpush(jobs, *(f"{i}:{EVENT}" for i in range(start, min(messages, start + 5000))))
        client.close()

    def worker():
        client = _redis(url)
        return (lambda: client.lmove(jobs, processing, "LEFT", "RIGHT")), (lambda job: client.lrem(processing, 1, job)), client.close

    def close() -> None:
        client = _redis(url)
        client.delete(jobs, processing)
        client.close()

    return Peer(fill, worker, close)


def _delete(client: Any, pattern: str) -> None:
    keys = list(client.scan_iter(match=pattern, count=2000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start:start + 1000])


# --- Mongo peers -------------------------------------------------------------------------------

MONGO_DATABASE = "harel_bench"


def _mongo(url: str):
    import pymongo

    return pymongo.MongoClient(url)


def harel_ref_mongo(url: str, prefix: str = "bench_ref") -> Peer:
    from harel_ref.transport import MongoTransport
    from harel_ref.transport._base import PARKED
    from harel_ref.transport.mongo import FREE, SCHEMA_VERSION, MongoNames

    n = MongoNames.named(prefix)

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _mongo(url) as client:
            db = client[MONGO_DATABASE]
            for name in n:
                db.drop_collection(name)
            group_docs, message_docs, seq = [], [], 0
            for i in range(1, blocked + 1):  # first in claim order (stamp 0), half leased, half parked
                seq += 1
                message_docs.append({"_id": seq, "g": f"b{i}", "e": EVENT})
                group_docs.append({"_id": f"b{i}", "priority": 0, "key": None, "stamp": 0, "arrival": seq,
                                   "life": f"b{i}", "queue": [seq], "tail": seq,
                                   "holder": f"bench:token{i}" if i % 2 else PARKED, "ends": FAR,
                                   "leased": seq if i % 2 else None})
            queues: dict[int, list[int]] = {}
            for i in range(messages):
                seq += 1
                message_docs.append({"_id": seq, "g": f"g{i % groups + 1}", "e": EVENT})
                queues.setdefault(i % groups + 1, []).append(seq)
            for i, queue in queues.items():
                group_docs.append({"_id": f"g{i}", "priority": 0, "key": None, "stamp": 1, "arrival": queue[0],
                                   "life": f"g{i}", "queue": queue, "tail": queue[-1], "holder": None, "ends": FREE,
                                   "leased": None})
            for collection, docs in ((n.messages, message_docs), (n.groups, group_docs)):
                for start in range(0, len(docs), 10_000):
                    db[collection].insert_many(docs[start:start + 10_000])
            db[n.counters].insert_many([{"_id": "seq", "value": seq}, {"_id": "schema", "version": SCHEMA_VERSION}])

    def worker():
        transport = MongoTransport(url, prefix=prefix, database=MONGO_DATABASE)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, transport.close

    def close() -> None:
        with _mongo(url) as client:
            for name in n:
                client[MONGO_DATABASE].drop_collection(name)

    return Peer(fill, worker, close)


def harel_mongo(url: str, prefix: str = "bench_harel") -> Peer:
    from harel.engine.schema import Names
    from harel.engine.transport import MongoTransport as HarelMongo

    from harel_ref.stateful._harel import to_event

    names = Names(prefix)
    collections = (names.messages, names.transport_locks, names.transport_counters)
    event = to_event("bench").model_dump_json()

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _mongo(url) as client:
            db = client[MONGO_DATABASE]
            for name in collections:
                db.drop_collection(name)
            HarelMongo(client, MONGO_DATABASE, prefix=prefix)  # creates its claim index
            locks, docs, seq = [], [], 0
            for i in range(1, blocked + 1):
                seq += 1
                docs.append({"_id": seq, "group_id": f"b{i}", "event": event})
                locks.append({"_id": f"b{i}", "available_at": FAR, "token": f"bench:token{i}", "priority": 0})
            for i in range(messages):
                seq += 1
                docs.append({"_id": seq, "group_id": f"g{i % groups + 1}", "event": event})
            locks += [{"_id": f"g{i}", "available_at": 1.0, "token": None, "priority": 0} for i in range(1, groups + 1)]
            for collection, batch in ((names.messages, docs), (names.transport_locks, locks)):
                for start in range(0, len(batch), 10_000):
                    db[collection].insert_many(batch[start:start + 10_000])
            db[names.transport_counters].insert_one({"_id": "seq", "n": seq})

    def worker():
        client = _mongo(url)
        transport = HarelMongo(client, MONGO_DATABASE, prefix=prefix, create_schema=False)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, client.close

    def close() -> None:
        with _mongo(url) as client:
            for name in collections:
                client[MONGO_DATABASE].drop_collection(name)

    return Peer(fill, worker, close)


def find_and_modify_jobs(url: str, collection: str = "bench_jobs") -> Peer:
    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        with _mongo(url) as client:
            db = client[MONGO_DATABASE]
            db.drop_collection(collection)
            for start in range(0, messages, 10_000):
                db[collection].insert_many([{"_id": i, "payload": EVENT, "available_at": 0.0}
                                            for i in range(start, min(messages, start + 10_000))])

    def worker():
        client = _mongo(url)
        jobs = client[MONGO_DATABASE][collection]

        def claim():
            now = time.time()
            job = jobs.find_one_and_update({"available_at": {"$lte": now}}, {"$set": {"available_at": now + 60.0}},
                                           sort=[("_id", 1)])
            return job and job["_id"]

        return claim, lambda job: jobs.delete_one({"_id": job}), client.close

    def close() -> None:
        with _mongo(url) as client:
            client[MONGO_DATABASE].drop_collection(collection)

    return Peer(fill, worker, close)


# --- SQS peers ---------------------------------------------------------------------------------

SQS_BACKLOG = 4_000
"""The most messages an SQS fill sends (400 batches of ten): SQS takes ten per request, and a
fill of the full backlog for every run would take minutes."""


def _sqs_queue(url: str, name: str) -> tuple[Any, str]:
    """A fresh empty FIFO queue ``name`` (deleted first if it is there) and a client."""
    from harel_ref.stateful.backends.sqs import QUEUE_ATTRIBUTES, client, queue_name

    sqs = client(url)
    try:
        sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=queue_name(name))["QueueUrl"])
    except sqs.exceptions.QueueDoesNotExist:
        pass
    return sqs, sqs.create_queue(QueueName=queue_name(name), Attributes=QUEUE_ATTRIBUTES)["QueueUrl"]


def _sqs_peer(url: str, name: str, body: str, open_worker: Callable[[str], tuple]) -> Peer:
    """A peer on the FIFO queue ``name``: filled with ``body`` in every group, each worker
    ``open_worker(queue_url) -> (claim, ack, close)``."""
    import uuid

    queue_url = [""]

    def fill(messages: int, groups: int, blocked: int = 0) -> None:
        sqs, queue_url[0] = _sqs_queue(url, name)
        try:
            entries = [{"Id": str(i), "MessageBody": body, "MessageGroupId": f"g{i % groups + 1}"}
                       for i in range(min(messages, SQS_BACKLOG))]
            for start in range(0, len(entries), 10):
                batch = [{**entry, "MessageDeduplicationId": uuid.uuid4().hex} for entry in entries[start:start + 10]]
                sqs.send_message_batch(QueueUrl=queue_url[0], Entries=batch)
        finally:
            sqs.close()

    def close() -> None:
        sqs, _ = _sqs_queue(url, name)
        try:
            sqs.delete_queue(QueueUrl=queue_url[0] or sqs.get_queue_url(QueueName=f"{name}.fifo")["QueueUrl"])
        finally:
            sqs.close()

    return Peer(fill, lambda: open_worker(queue_url[0]), close)


def harel_ref_sqs(url: str, name: str = "bench_ref") -> Peer:
    from harel_ref.stateful.backends.sqs import credentials
    from harel_ref.transport import SqsTransport
    from harel_ref.transport.sqs import encode

    def worker(queue_url: str):
        transport = SqsTransport(url, prefix=name, client_options=credentials())
        return (lambda: transport.claim("bench", 60.0)), transport.ack, transport.close

    return _sqs_peer(url, name, encode(EVENT), worker)


def harel_sqs(url: str, name: str = "bench_harel") -> Peer:
    from harel.engine.transport.sqs import SqsTransport as HarelSqs

    from harel_ref.stateful._harel import to_event
    from harel_ref.stateful.backends.sqs import client

    def worker(queue_url: str):
        sqs = client(url)
        transport = HarelSqs(sqs, queue_url, wait_seconds=0)
        return (lambda: transport.claim("bench", 60.0)), transport.ack, sqs.close

    return _sqs_peer(url, name, to_event("bench").model_dump_json(), worker)


def plain_sqs_requests(url: str, name: str = "bench_plain") -> Peer:
    from harel_ref.stateful.backends.sqs import client

    def worker(queue_url: str):
        sqs = client(url)

        def claim():
            found = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1, VisibilityTimeout=60).get("Messages")
            return found[0]["ReceiptHandle"] if found else None

        return claim, lambda handle: sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=handle), sqs.close

    return _sqs_peer(url, name, EVENT, worker)


# --- Throughput --------------------------------------------------------------------------------


WORKERS = (1, 4, 16)


def run_workers(peer: Peer, workers: int, seconds: float, backlog: int) -> float | None:
    """Claim+ack per second with ``workers`` threads, over ``seconds`` or until nine tenths of
    the ``backlog`` are done, whichever comes first (a fast peer on a small backlog is measured
    over a shorter time, never on an empty queue); None if a claim found nothing before that."""
    pairs = [peer.worker() for _ in range(workers)]
    done = [0] * workers
    enough = backlog * 9 // 10
    ran_out = threading.Event()
    start_line = threading.Barrier(workers + 1)
    deadline = [0.0]

    def work(index: int) -> None:
        claim, ack, _ = pairs[index]
        start_line.wait()
        while time.perf_counter() < deadline[0] and sum(done) < enough:
            lease = claim()
            if lease is None:
                ran_out.set()
                return
            ack(lease)
            done[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    start_line.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    for _, _, close in pairs:
        close()
    return None if ran_out.is_set() else sum(done) / elapsed


THROUGHPUT_PEERS = {
    "postgres": ("Postgres", {"harel-ref PostgresTransport": harel_ref_postgres,
                              "harel 0.9.0 PostgresTransport": harel_postgres,
                              "plain SKIP LOCKED job table (no groups)": skip_locked_jobs}),
    "redis": ("Redis", {"harel-ref RedisTransport": harel_ref_redis,
                        "harel 0.9.0 RedisTransport": harel_redis,
                        "plain LMOVE reliable queue (no groups)": lmove_queue}),
    "mongo": ("Mongo", {"harel-ref MongoTransport": harel_ref_mongo,
                        "harel 0.9.0 MongoTransport": harel_mongo,
                        "plain find_one_and_update job collection (no groups)": find_and_modify_jobs}),
    "sqs": ("SQS", {"harel-ref SqsTransport": harel_ref_sqs,
                    "harel 0.9.0 SqsTransport": harel_sqs,
                    "plain ReceiveMessage + DeleteMessage on the same FIFO queue": plain_sqs_requests}),
}
"""SQS has no latency scenarios: a receive is one request whatever the backlog, and a backlog
of 100,000 messages would take minutes to send; its 1-worker column is its latency."""
LATENCY_PEERS = {
    "postgres": {"harel-ref postgres": harel_ref_postgres, "harel 0.9.0 postgres": harel_postgres},
    "redis": {"harel-ref redis": harel_ref_redis, "harel 0.9.0 redis": harel_redis},
    "mongo": {"harel-ref mongo": harel_ref_mongo, "harel 0.9.0 mongo": harel_mongo},
    "sqs": {},
}


def throughput_table(urls: dict[str, str], args: argparse.Namespace) -> None:
    families = {THROUGHPUT_PEERS[kind][0]: {name: make(url) for name, make in THROUGHPUT_PEERS[kind][1].items()}
                for kind, url in urls.items()}
    try:
        for family, peers in families.items():
            backlog = min(args.messages, SQS_BACKLOG) if family == "SQS" else args.messages
            print(f"\n# {family} throughput: claim+ack per second over {args.seconds:g} s (or until nine tenths of"
                  f" the messages are done), {backlog:,} messages in {args.groups:,} groups at the start;"
                  f" {args.rounds} rounds", flush=True)
            runs = {(name, workers): peer for name, peer in peers.items() for workers in WORKERS}

            def measure(key, peer):
                peer.fill(args.messages, args.groups)
                return run_workers(peer, key[1], args.seconds, backlog)

            results = rounds(runs, args.rounds, measure)
            first = next(iter(peers))
            print(f"\n| {family}: claim+ack/s, median (range) | " + " | ".join(f"{w} worker{'s' * (w > 1)}" for w in WORKERS) + " |")
            print("|---|" + "---|" * len(WORKERS))
            for name in peers:
                cells = []
                for workers in WORKERS:
                    values = results.get((name, workers))
                    if not values:
                        cells.append("ran out of messages")
                        continue
                    ratio = statistics.median(values) / statistics.median(results[(first, workers)]) if results.get((first, workers)) else float("nan")
                    cells.append(f"{spread(values, '{:,.0f}')}, **{ratio:.2f}×**")
                print(f"| {name} | " + " | ".join(cells) + " |")
            print(f"\n(ratios: against {first} at the same number of workers)")
    finally:
        for peers in families.values():
            for peer in peers.values():
                peer.close()


# --- Latency -----------------------------------------------------------------------------------


def claim_latency(peer: Peer, samples: int) -> float:
    claim, ack, close = peer.worker()
    try:
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            lease = claim()
            times.append(time.perf_counter() - started)
            if lease is None:
                raise RuntimeError("the scenario ran out of messages")
            ack(lease)
        return statistics.median(times) * 1e6
    finally:
        close()


def latency_table(urls: dict[str, str], args: argparse.Namespace) -> None:
    small = max(10, int(1_000 * args.scale))
    big, blocked = max(20, int(80_000 * args.scale)), max(10, int(20_000 * args.scale))
    scenarios = {"(a)": (small, small, 0), "(c)": (big, big, blocked)}  # messages, groups, blocked
    peers = {name: make(url) for kind, url in urls.items() for name, make in LATENCY_PEERS[kind].items()}
    print(f"\n# claim latency: median of {args.samples} claims (each followed by an untimed ack), {args.rounds} rounds;"
          f" (a) {small:,} groups; (c) {big + blocked:,} groups of which {blocked:,} blocked", flush=True)
    try:
        results = {}
        for label, (messages, groups, blocked_groups) in scenarios.items():
            print(f"# scenario {label}", flush=True)

            def measure(name, peer, sizes=(messages, groups, blocked_groups)):
                peer.fill(*sizes)
                return claim_latency(peer, args.samples)

            for name, values in rounds(peers, args.rounds, measure).items():
                results[(name, label)] = values
        print("\n| claim latency, µs, median (range) | " + " | ".join(peers) + " |")
        print("|---|" + "---|" * len(peers))
        for label in scenarios:
            cells = []
            for name in peers:
                values = results[(name, label)]
                cell = spread(values, "{:,.0f}")
                if label != "(a)":
                    cell += f", **{statistics.median(values) / statistics.median(results[(name, '(a)')]):.2f}×** (a)"
                cells.append(cell)
            print(f"| {label} | " + " | ".join(cells) + " |")
    finally:
        for peer in peers.values():
            peer.close()


if __name__ == "__main__":
    main()
