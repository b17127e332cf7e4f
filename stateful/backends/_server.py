"""A database server for the bundled backends: the user's, or a throwaway one of this process.

``ServerFromEnv("HAREL_POSTGRES_URL", PostgresServer)`` answers ``url()`` with the variable's
value when it is set (a server of the user's), else with the URL of a throwaway server it starts
on first use (deleted when the process exits).  The processes this one spawns (the certifier's
branch processes) inherit that URL through a variable of their own, so they use the same server
instead of starting theirs.  ``records_cleanup()`` says whether this process should remove, at
exit, what it made on the user's server: the spawned processes open the same namespaces and
exit first, so they must not.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ServerFromEnv", "prefix_for"]


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
        self.opened: set[str] = set()  # prefixes made on the user's server, to remove at exit

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
        """True in the process that should remove what it made on the user's server."""
        return bool(self.users()) and multiprocessing.parent_process() is None

    def open(self, namespace: str, check: Callable[[str], Any]) -> tuple[str, str]:
        """The server's URL and the namespace's prefix (:func:`prefix_for`), remembered in
        :attr:`opened` when :meth:`records_cleanup` says so."""
        url, prefix = self.url(), prefix_for(namespace, check)
        if self.records_cleanup():
            self.opened.add(prefix)
        return url, prefix
