"""Fault injection for the three-node rqlite cluster of ``compose.yaml``.

Start the cluster first (``bash .ci/cluster up``), then::

    from harel_ref.testing.cluster import Cluster

    cluster = Cluster()                 # finds the containers by their compose labels
    leader = cluster.wait_for_leader()  # e.g. "rqlite1"
    cluster.kill(leader)                # SIGKILL the leader's container
    new = cluster.wait_for_leader()     # the two survivors elect a new leader
    cluster.start(leader)               # the old leader rejoins as a follower
    cluster.disconnect("rqlite3")       # cut rqlite3 off the cluster network
    cluster.reconnect("rqlite3")
    cluster.heal()                      # start, unpause and reconnect every node
    cluster.wait_ready()                # all three reachable, one agreed leader

Nodes are named by their compose service: ``rqlite1``, ``rqlite2``, ``rqlite3``
(also their rqlite node ids). Their HTTP APIs are published on the host at
``127.0.0.1:4001``, ``:4011`` and ``:4021`` (:data:`DEFAULT_PORTS`).

What each fault means for rqlite:

- :meth:`Cluster.stop` / :meth:`Cluster.kill`: the process ends (SIGTERM, or
  SIGKILL); its data volume survives, and :meth:`Cluster.start` brings it back
  with its Raft state.
- :meth:`Cluster.pause`: the process is frozen (cgroup freezer); its peers see
  a silent node and HTTP calls to it hang until the timeout.
- :meth:`Cluster.disconnect`: the container leaves the compose network: it can
  neither reach nor be reached by its peers, and its published port stops
  answering too (the port mapping lives on that network). A disconnected leader
  keeps believing it leads until its leader lease runs out; the other two elect
  a new one.

Containers are found by the labels compose puts on them
(``com.docker.compose.project`` and ``com.docker.compose.service``). The
project defaults to ``$COMPOSE_PROJECT_NAME`` or ``harel-ref`` (what
``.ci/cluster`` uses); when no container has that project but exactly one
project has the three services, that project is used.

Needs the ``docker`` package: ``pip install 'harel-ref[docker]'``. The HTTP
calls to rqlite use only the standard library.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

try:
    import docker
    import docker.errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "harel_ref.testing.cluster needs the 'docker' package: pip install 'harel-ref[docker]'"
    ) from exc

__all__ = [
    "DEFAULT_NODES",
    "DEFAULT_PORTS",
    "DEFAULT_PROJECT",
    "Cluster",
    "ClusterError",
    "wait_for_cluster",
]

DEFAULT_PROJECT = "harel-ref"
"""Compose project used by ``.ci/cluster`` (overridden by ``$COMPOSE_PROJECT_NAME``)."""

DEFAULT_NODES = ("rqlite1", "rqlite2", "rqlite3")
"""Compose service names, which are also the rqlite node ids."""

DEFAULT_PORTS: Mapping[str, int] = {"rqlite1": 4001, "rqlite2": 4011, "rqlite3": 4021}
"""Host ports (on 127.0.0.1) where each node's HTTP API is published."""

_PROJECT_LABEL = "com.docker.compose.project"
_SERVICE_LABEL = "com.docker.compose.service"


class ClusterError(RuntimeError):
    """The cluster is not there, not in the expected state, or did not get there in time."""


class Cluster:
    """Handle on the running compose cluster: find, break and heal its nodes.

    :param project: compose project name; default ``$COMPOSE_PROJECT_NAME`` or
        ``"harel-ref"`` (see the module docstring for the fallback).
    :param ports: service name -> host port of its HTTP API; default
        :data:`DEFAULT_PORTS`. Its keys are the nodes this handle manages.
    :param host: host the ports are published on (default ``127.0.0.1``).
    :param client: a ``docker.DockerClient``; default ``docker.from_env()``.
    :param http_timeout: seconds for each HTTP call to a node (a paused node
        makes calls hang until this timeout).
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        ports: Mapping[str, int] | None = None,
        host: str = "127.0.0.1",
        client: Any = None,
        http_timeout: float = 2.0,
    ) -> None:
        self.ports: dict[str, int] = dict(DEFAULT_PORTS if ports is None else ports)
        if not self.ports:
            raise ValueError("ports must name at least one node, e.g. {'rqlite1': 4001}")
        self.host = host
        self.http_timeout = float(http_timeout)
        try:
            self.client = client if client is not None else docker.from_env()
            self.client.ping()
        except docker.errors.DockerException as exc:
            raise ClusterError(
                f"cannot talk to the Docker engine ({exc}); start it with `bash .ci/cluster up`"
            ) from exc
        self.project = self._find_project(project)
        # aliases a node had on the cluster network, remembered by disconnect()
        self._aliases: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ lookup

    @property
    def nodes(self) -> list[str]:
        """The managed node names, e.g. ``["rqlite1", "rqlite2", "rqlite3"]``."""
        return list(self.ports)

    def _find_project(self, project: str | None) -> str:
        wanted = project or os.environ.get("COMPOSE_PROJECT_NAME") or DEFAULT_PROJECT
        if self._containers_of(wanted):
            return wanted
        if project is None:
            found: dict[str, set[str]] = {}
            for c in self.client.containers.list(all=True, filters={"label": _PROJECT_LABEL}):
                svc = c.labels.get(_SERVICE_LABEL)
                if svc in self.ports:
                    found.setdefault(c.labels[_PROJECT_LABEL], set()).add(svc)
            complete = [p for p, svcs in found.items() if svcs == set(self.ports)]
            if len(complete) == 1:
                return complete[0]
            if len(complete) > 1:
                raise ClusterError(
                    f"several compose projects run {sorted(self.ports)}: {sorted(complete)}; "
                    "pass Cluster(project=...)"
                )
        raise ClusterError(
            f"no containers of compose project {wanted!r} with services {sorted(self.ports)}; "
            "start the cluster with `bash .ci/cluster up`"
        )

    def _containers_of(self, project: str) -> list[Any]:
        return self.client.containers.list(
            all=True, filters={"label": f"{_PROJECT_LABEL}={project}"}
        )

    def _check(self, node: str) -> str:
        if node not in self.ports:
            raise ValueError(f"unknown node {node!r}; expected one of {self.nodes}")
        return node

    def container(self, node: str) -> Any:
        """The ``docker`` Container object of ``node`` (fresh state each call)."""
        self._check(node)
        found = self.client.containers.list(
            all=True,
            filters={"label": [f"{_PROJECT_LABEL}={self.project}", f"{_SERVICE_LABEL}={node}"]},
        )
        if not found:
            raise ClusterError(
                f"no container for service {node!r} in project {self.project!r}; "
                "was the cluster taken down? (`bash .ci/cluster up`)"
            )
        if len(found) > 1:
            raise ClusterError(f"{len(found)} containers for service {node!r}; expected one")
        return found[0]

    def network(self) -> Any:
        """The compose network the nodes share (``<project>_default``)."""
        nets = self.client.networks.list(filters={"label": f"{_PROJECT_LABEL}={self.project}"})
        if len(nets) == 1:
            return nets[0]
        try:
            return self.client.networks.get(f"{self.project}_default")
        except docker.errors.NotFound as exc:
            raise ClusterError(f"cannot find the network of compose project {self.project!r}") from exc

    def url(self, node: str) -> str:
        """Base URL of ``node``'s HTTP API on the host, e.g. ``http://127.0.0.1:4001``."""
        return f"http://{self.host}:{self.ports[self._check(node)]}"

    def urls(self) -> list[str]:
        """Base URLs of every node, in node order (what a transport's ``hosts`` takes)."""
        return [self.url(n) for n in self.nodes]

    def state(self, node: str) -> str:
        """Docker's view of ``node``: ``"running"``, ``"paused"``, ``"exited"``, ... plus
        ``"disconnected"`` when it runs but is off the cluster network."""
        c = self.container(node)
        status = c.status
        if status == "running" and not self._is_connected(c):
            return "disconnected"
        return status

    def _is_connected(self, c: Any) -> bool:
        nets = c.attrs.get("NetworkSettings", {}).get("Networks") or {}
        return self.network().name in nets

    # ------------------------------------------------------------------ faults

    def stop(self, node: str, timeout: int = 10) -> None:
        """Stop ``node`` gracefully (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        self.container(node).stop(timeout=timeout)

    def kill(self, node: str, signal: str | int = "SIGKILL") -> None:
        """Send ``signal`` (default SIGKILL: a crash) to ``node``'s rqlited."""
        self.container(node).kill(signal=signal)

    def start(self, node: str) -> None:
        """Start a stopped or killed ``node`` again (no-op if it is running)."""
        c = self.container(node)
        if c.status != "running" and c.status != "paused":
            c.start()

    def restart(self, node: str, timeout: int = 10) -> None:
        """Stop (gracefully, up to ``timeout`` seconds) and start ``node``."""
        self.container(node).restart(timeout=timeout)

    def pause(self, node: str) -> None:
        """Freeze every process of ``node`` (it stays a member but stops answering)."""
        self.container(node).pause()

    def unpause(self, node: str) -> None:
        """Thaw a paused ``node``."""
        self.container(node).unpause()

    def disconnect(self, node: str) -> None:
        """Take ``node`` off the cluster network: a full partition of that node.

        Its peers can no longer reach it and it cannot reach them; its published
        HTTP port stops answering as well. Undo with :meth:`reconnect`.
        """
        c = self.container(node)
        net = self.network()
        endpoint = (c.attrs.get("NetworkSettings", {}).get("Networks") or {}).get(net.name)
        if endpoint is None:
            return  # already off the network
        self._aliases[node] = [a for a in (endpoint.get("Aliases") or []) if a]
        net.disconnect(c)

    def reconnect(self, node: str) -> None:
        """Put ``node`` back on the cluster network, with its DNS name (the service name)."""
        c = self.container(node)
        if self._is_connected(c):
            return
        aliases = self._aliases.pop(node, None) or [node]
        if node not in aliases:
            aliases.append(node)
        self.network().connect(c, aliases=aliases)

    connect = reconnect

    def heal(self) -> None:
        """Undo every fault: start stopped nodes, unpause paused ones, reconnect all."""
        for node in self.nodes:
            c = self.container(node)
            if c.status == "paused":
                c.unpause()
            elif c.status != "running":
                c.start()
            c.reload()
            if not self._is_connected(c):
                self.reconnect(node)

    # ------------------------------------------------------------------ rqlite HTTP

    def _get_json(self, node: str, path: str, timeout: float | None = None) -> Any:
        req = urllib.request.Request(self.url(node) + path, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout or self.http_timeout) as resp:
            return json.load(resp)

    def status(self, node: str) -> dict[str, Any]:
        """``node``'s ``GET /status`` document (raises ``OSError`` if unreachable)."""
        return self._get_json(node, "/status")

    def cluster_nodes(self, node: str) -> list[dict[str, Any]]:
        """``GET /nodes?nonvoters&ver=2`` as seen by ``node``: id, api_addr, reachable, leader..."""
        return self._get_json(node, "/nodes?nonvoters&ver=2")["nodes"]

    def is_reachable(self, node: str) -> bool:
        """True if ``node`` answers ``GET /readyz`` with 200 (up, and it knows a leader)."""
        try:
            req = urllib.request.Request(self.url(node) + "/readyz")
            with urllib.request.urlopen(req, timeout=self.http_timeout) as resp:
                return resp.status == 200
        except (OSError, ValueError):
            return False

    def leader_seen_by(self, node: str) -> str | None:
        """The leader's node id according to ``node``, or None (no leader / unreachable)."""
        try:
            leader = self.status(node)["store"]["leader"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return leader.get("node_id") or None

    def leader(self, nodes: Iterable[str] | None = None) -> str | None:
        """The leader that the given nodes (default: the live ones) agree on, else None.

        Returns None while they disagree, while any of them sees no leader, or
        if none of them answers.
        """
        candidates = list(self.live_nodes() if nodes is None else nodes)
        seen = {self.leader_seen_by(self._check(n)) for n in candidates}
        if len(seen) == 1:
            (only,) = seen
            return only
        return None

    def followers(self, nodes: Iterable[str] | None = None) -> list[str]:
        """The live nodes (or the given ones) other than the current leader."""
        lead = self.leader(nodes)
        return [n for n in (self.live_nodes() if nodes is None else nodes) if n != lead]

    def live_nodes(self) -> list[str]:
        """Nodes whose container runs, is not paused and is on the cluster network."""
        return [n for n in self.nodes if self.state(n) == "running"]

    # ------------------------------------------------------------------ waiting

    def wait_for_leader(
        self,
        timeout: float = 60.0,
        nodes: Iterable[str] | None = None,
        *,
        exclude: Iterable[str] = (),
        interval: float = 0.25,
    ) -> str:
        """Wait until ``nodes`` are reachable and agree on one leader; return its id.

        ``nodes`` defaults to the live nodes (running, not paused, on the
        network) at each poll, minus ``exclude``. Pass ``exclude=[old]`` after
        disconnecting or freezing ``old`` to wait for a leader other than it.
        Raises :class:`ClusterError` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        fixed = None if nodes is None else [self._check(n) for n in nodes]
        excluded = {self._check(n) for n in exclude}
        last = "no poll yet"
        while True:
            group = [n for n in (fixed if fixed is not None else self.live_nodes()) if n not in excluded]
            if group:
                reachable = [n for n in group if self.is_reachable(n)]
                seen = {n: self.leader_seen_by(n) for n in reachable}
                leaders = set(seen.values())
                if len(reachable) == len(group) and len(leaders) == 1 and None not in leaders:
                    (lead,) = leaders
                    if lead not in excluded:
                        return lead
                last = f"nodes {group}: reachable {reachable}, leaders seen {seen}"
            else:
                last = "no live node to ask"
            if time.monotonic() >= deadline:
                raise ClusterError(f"no agreed leader within {timeout}s ({last})")
            time.sleep(interval)

    def wait_ready(self, timeout: float = 120.0) -> str:
        """Wait until every managed node is reachable and all agree on a leader; return it."""
        return self.wait_for_leader(timeout, nodes=self.nodes)

    def __repr__(self) -> str:
        return f"Cluster(project={self.project!r}, ports={self.ports!r})"


def wait_for_cluster(timeout: float = 120.0, **kwargs: Any) -> str:
    """Wait until the compose cluster has a leader and all its nodes answer.

    ``kwargs`` go to :class:`Cluster`. Returns the leader's node id.
    """
    return Cluster(**kwargs).wait_ready(timeout)
