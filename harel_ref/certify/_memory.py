"""A certification's memory, bounded (SPEC.md C11).

A transport may keep what it is given for ever, or a search may hold more than it should: a
certification reported by a user grew to 6 GB while it shrank a failure, until the machine
had no memory left for anything else.  So while a certification runs, a thread watches the
resident memory of its process and of every process it started (search processes, branch
processes; not those that were there before it, such as a server a test suite started),
every :data:`POLL` seconds.  When they hold more than ``limit`` bytes beyond what
they held as the certification began, the run is stopped as a signal stops it
(:func:`harel_ref.certify._signals.stop_from_thread`): the exception is
:class:`MemoryLimitReached`, the report so far is written, the processes are ended, and the
command exits 3 (unknown) or 1 (a property failed before it).

Counted beyond the start, so that a certification inside a long-lived process (a pytest worker
that already holds a gigabyte) gets the same room as one of its own.  The resident memory is
read from ``/proc``, so the limit holds on Linux; elsewhere it is not watched.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Set
from pathlib import Path

from harel_ref.stateful._forking import fork_server

from ._signals import signals_deferred, stop_from_thread, stopping

__all__ = ["DEFAULT_MEMORY_LIMIT", "MemoryLimitReached", "descendants", "memory_limit", "parse_size",
           "resident_bytes"]

POLL = 0.25
"""Seconds between two readings of the memory: a transport that takes a gigabyte a second is
stopped a quarter of a gigabyte past its limit.  A reading follows the processes' ``children``
files from this one, about 0.2 ms of CPU for a certification's dozen processes."""

_PROC = Path("/proc")


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


DEFAULT_MEMORY_LIMIT = min(4 << 30, (_physical_memory() or 8 << 30) // 2)
"""4 GiB, or half the machine's memory if that is less: a standard certification of the bundled
SQLite transport takes a few hundred megabytes with its processes."""


class MemoryLimitReached(KeyboardInterrupt):
    """The certification's processes took more memory than its limit allows.  A
    KeyboardInterrupt, so that Hypothesis and the certifier stop on it as on a signal."""

    exit_status = 3  # EXIT_CODES["unknown"]: the run did not reach its verdicts

    def __init__(self, used: int, limit: int) -> None:
        self.used, self.limit = used, limit
        self.why = (f"its memory limit: its processes took {_size(used)} more than as it began, over the "
                    f"limit of {_size(limit)} (--memory-limit)")
        super().__init__(self.why)


def _size(count: int) -> str:
    return f"{count / (1 << 20):,.0f} MiB"


def parse_size(text: str) -> int | None:
    """``--memory-limit``: bytes, or a number with ``K``, ``M`` or ``G`` (binary: ``2G`` is
    2 GiB; ``2GiB`` and ``2GB`` say the same), or ``none``."""
    if text.strip().lower() == "none":
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMG]?)(?:I?B)?\s*", text, re.IGNORECASE)
    size = int(float(found[1]) * _UNITS[found[2].upper()]) if found else 0
    if size < 1:
        raise ValueError(f"expected a size such as 2G, 500M or 'none', got {text!r}")
    return size


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def descendants(root: int, leaving: Set[int] = frozenset()) -> set[int]:
    """The processes under process ``root``: its children, theirs, and so on; but not those in
    ``leaving``, nor any process under them."""
    children = _children if os.path.exists(f"/proc/{root}/task/{root}/children") else _children_of_all()
    found, pending = set(), children(root)
    while pending:
        if (pid := pending.pop()) not in leaving:
            found.add(pid)
            pending += children(pid)
    return found


def _children(pid: int) -> list[int]:
    """The children of process ``pid``, from the ``children`` file of each of its threads
    (Linux 3.5 and later): a few reads, where scanning every process's ``stat`` took about
    7 ms a reading with 95 processes on the machine, four times a second, in the GIL."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found  # it ended meanwhile
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as listed:
                found += map(int, listed.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return found


def _children_of_all() -> Callable[[int], list[int]]:
    """:func:`_children` where the kernel has no ``children`` files: every process's parent,
    read from its ``stat``."""
    children: dict[int, list[int]] = {}
    for stat in _PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # the name, in brackets, may hold spaces
        except (OSError, IndexError):
            continue  # it ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return lambda pid: list(children.get(pid, []))


def resident_bytes(root: int, leaving: Set[int] = frozenset()) -> int | None:
    """The resident memory of process ``root`` and its descendants but those in ``leaving`` and
    under them, in bytes (None where ``/proc`` does not tell)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in [root, *descendants(root, leaving)]:
        try:
            total += int((_PROC / str(pid) / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            if pid == root:
                return None  # no /proc: nothing to read
    return total


@contextlib.contextmanager
def memory_limit(limit: int | None) -> Iterator[Callable[[], None]]:
    """While inside, stop the run under way (see the module docstring) when its processes hold
    ``limit`` bytes more than as it began.  Nothing is watched with no limit, outside a run that
    takes signals (``_signals.stop_on_signals``, in the main thread), or without ``/proc``.
    Gives a function that ends the watch before the block does (once the verdicts are in)."""
    root = os.getpid()
    if limit is None or threading.current_thread() is not threading.main_thread() or not (_PROC / str(root)).exists():
        yield lambda: None
        return
    # Not the certification's: a server a test suite started, say.  But the workers a fork
    # server that ran before forks from now on are (harel_ref/stateful/_forking.py).
    before = descendants(root) - {fork_server()}
    baseline = resident_bytes(root, before) or 0
    done = threading.Event()

    def watch() -> None:  # in its own thread
        while not done.wait(POLL):
            used = resident_bytes(root, before)
            if used is not None and used - baseline > limit and not stopping():
                stop_from_thread(MemoryLimitReached(used - baseline, limit))
                return

    def end() -> None:
        with signals_deferred():  # a limit crossed as the watch ends is raised at the next checkpoint
            done.set()
            watcher.join()

    watcher = threading.Thread(target=watch, name="harel-ref-memory", daemon=True)
    watcher.start()
    try:
        yield end
    finally:
        end()
