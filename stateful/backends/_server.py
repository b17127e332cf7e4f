"""A database server for the bundled backends: the user's, or a throwaway one of this process.

``ServerFromEnv("HAREL_POSTGRES_URL", PostgresServer)`` answers ``url()`` with the variable's
value when it is set (a server of the user's), else with the URL of a throwaway server it starts
on first use (deleted when the process exits).  The processes this one spawns (the certifier's
branch processes) inherit that URL through a variable of their own, so they use the same server
instead of starting theirs.

On the user's server every process remembers the namespaces it opened, each with how to remove
it (harel-ref's transports and harel's name their tables and keys differently), and
``remove_opened`` removes them all over one connection: the main process at exit
(:meth:`ServerFromEnv.removes_at_exit`), a search process of the certifier as it ends
(:func:`harel_ref.stateful.backends.clean_up`).  A branch process never does: it opens the
namespaces of the search that runs it, which goes on after it.
"""

from __future__ import annotations

import atexit
import hashlib
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any

Remove = Callable[[Any, str], Any]
"""``remove(connection, prefix)``: delete everything one transport made under ``prefix``."""

__all__ = ["ServerFromEnv", "prefix_for", "removed_at_exit"]


def prefix_for(namespace: str, check: Callable[[str], Any]) -> str:
    """The table or key prefix of a namespace: itself when ``check(namespace)`` accepts it
    (the machine's ``ns_<hex>`` are accepted), else ``ns_`` and a digest of it."""
    try:
        check(namespace)
        return namespace
    except (TypeError, ValueError):
        return "ns_" + hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class ServerFromEnv:
    def __init__(self, variable: str, start: Callable[[], Any]) -> None:
        self.variable = variable
        self._inherited = f"HAREL_REF_THROWAWAY_{variable}"
        self._start = start
        self._lock = threading.Lock()
        self.server: Any = None  # the throwaway server, once started here
        self.opened: dict[tuple[str, Remove], None] = {}  # (prefix, how) made on the user's server

    def users(self) -> str:
        """The user's URL, or ''."""
        return os.environ.get(self.variable, "").strip()

    def url(self) -> str:
        url = self.users() or os.environ.get(self._inherited, "")
        if url:
            return url
        with self._lock:
            if self.server is None:
                self.server = self._start()
                os.environ[self._inherited] = self.server.url
            return self.server.url

    def records_cleanup(self) -> bool:
        """True when the server is the user's: what is made there must be removed."""
        return bool(self.users())

    @staticmethod
    def removes_at_exit() -> bool:
        """True in the main process only: a spawned process runs ``atexit`` too, and a branch
        process must not remove what its search still uses."""
        return multiprocessing.parent_process() is None

    def open(self, namespace: str, check: Callable[[str], Any], remove: Remove) -> tuple[str, str]:
        """The server's URL and the namespace's prefix (:func:`prefix_for`), remembered in
        :attr:`opened` with ``remove`` when :meth:`records_cleanup` says so."""
        url, prefix = self.url(), prefix_for(namespace, check)
        if self.records_cleanup():
            with self._lock:  # the lanes of a search open and discard at once (SPEC.md C2a)
                self.opened[prefix, remove] = None
        return url, prefix

    def discard(self, namespace: str, check: Callable[[str], Any], connect: Callable[[str], Any]) -> None:
        """Remove what this process made for ``namespace`` on the user's server now, over
        ``connect(url)`` (a factory's ``discard``): a long search, a failure shrunk over a
        thousand examples, leaves no pile to remove as its process ends."""
        prefix = prefix_for(namespace, check)
        with self._lock:
            removals = [remove for opened, remove in self.opened if opened == prefix]
        if not removals:  # not the user's server, or not opened here
            return
        with connect(self.users()) as connection:
            for remove in removals:
                remove(connection, prefix)
                with self._lock:
                    self.opened.pop((prefix, remove), None)

    def remove_opened(self, connect: Callable[[str], Any]) -> int:
        """Remove what this process made on the user's server, over ``connect(url)`` (a context
        manager), and return how many prefixes.  (A throwaway server goes as a whole.)"""
        if not self.opened:
            return 0
        removed, failed = 0, None
        with self._lock:
            opened = list(self.opened)
        with connect(self.users()) as connection:
            for prefix, remove in opened:
                try:
                    remove(connection, prefix)
                except Exception as exc:  # the others still go; this one stays remembered
                    failed = failed or exc
                    continue
                with self._lock:
                    self.opened.pop((prefix, remove), None)
                removed += 1
        if failed is not None:
            raise failed
        return removed


def removed_at_exit(remove: Callable[[], int]) -> Callable[[], int]:
    """``remove`` (a module's ``drop_opened``), also run when the main process exits (see
    :meth:`ServerFromEnv.removes_at_exit`); a server gone by then is let be."""

    def at_exit() -> None:
        if not ServerFromEnv.removes_at_exit():
            return
        try:
            remove()
        except Exception:  # nothing more can be done from here
            pass

    atexit.register(at_exit)
    return remove
