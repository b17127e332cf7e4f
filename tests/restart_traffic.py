"""Traffic through a server restart, judged by the history checker.

Used by the Postgres and Redis tests: a publisher and a few workers (threads, each with its own
transport, on the wall clock) publish, claim and ack while the server is stopped and started
again.  Calls that fail meanwhile (``StorageError``: nothing happened; ``OutcomeUnknownError``:
it may have) are recorded as failed and retried later.  When the traffic stops and every lease
has lapsed, a fresh transport drains the queue, and ``harel_ref.stateful.history.check`` judges the
history: two leases on one group at once, a FIFO break, a lost or duplicated message, or an
answer the model does not allow.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harel_ref.transport import OutcomeUnknownError, StorageError
from harel_ref.stateful.history import History, HistoryReport, RecordingTransport, check, drain, load


@dataclass
class Traffic:
    report: HistoryReport
    calls: Counter  # "publish", "claim", "ack": calls answered
    failures: Counter  # error class name -> calls that raised it
    drained: int

    def summary(self) -> str:
        answered = ", ".join(f"{op} {count}" for op, count in sorted(self.calls.items()))
        failed = ", ".join(f"{name} {count}" for name, count in sorted(self.failures.items())) or "none"
        return f"{answered}; failed: {failed}; drained {self.drained}; {self.report}"


def traffic_through_a_restart(open_transport: Callable[[], Any], restart: Callable[[], None], *,
                              workers: int = 3, groups: int = 6, seconds: float = 3.0,
                              visibility: float = 0.5) -> Traffic:
    history = History()
    stop = threading.Event()
    calls: Counter = Counter()
    failures: Counter = Counter()
    lock = threading.Lock()

    def attempt(op: str, call: Callable[[], Any]) -> Any:
        try:
            result = call()
        except (StorageError, OutcomeUnknownError) as exc:
            with lock:
                failures[type(exc).__name__] += 1
            time.sleep(0.05)  # the server is down or coming back: try again a little later
            return None
        with lock:
            calls[op] += 1
        return result

    def publisher(queue: RecordingTransport) -> None:
        sent = 0
        while not stop.is_set():
            attempt("publish", lambda: queue.publish(f"g{sent % groups}", f"e{sent}"))
            sent += 1  # a failed publish may have happened: never reuse its event
            time.sleep(0.003)

    def worker(queue: RecordingTransport, name: str) -> None:
        while not stop.is_set():
            lease = attempt("claim", lambda: queue.claim(name, visibility))
            if lease is None:
                time.sleep(0.005)
                continue
            attempt("ack", lambda: queue.ack(lease))

    transports = [open_transport() for _ in range(workers + 1)]
    threads = [threading.Thread(target=publisher, args=(RecordingTransport(transports[0], history, "publisher"),))]
    threads += [threading.Thread(target=worker, args=(RecordingTransport(t, history, f"w{i}"), f"w{i}"))
                for i, t in enumerate(transports[1:])]
    for thread in threads:
        thread.start()
    try:
        time.sleep(seconds / 3)
        restart()
        time.sleep(seconds * 2 / 3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    for transport in transports:
        transport.close()
    time.sleep(visibility + 0.1)  # every lease has lapsed: the drain sees everything left
    last = open_transport()
    try:
        drained = drain(last)
    finally:
        last.close()
    return Traffic(check(load(history.records), drained), calls, failures, len(drained))
