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
    cluster.add_latency("rqlite2", 0.2, 0.05)  # 150-250 ms on every packet it sends
    cluster.remove_latency("rqlite2")
    cluster.heal()                      # start, unpause, reconnect and undelay every node
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
- :meth:`Cluster.add_latency`: every packet the node sends (Raft to its peers,
  HTTP answers to clients) leaves ``delay`` +- ``jitter`` seconds late. Done
  from the host inside the container's network namespace (the image has no
  ``tc``), with ``tc qdisc ... netem`` when the kernel has netem, else by
  holding the packets in an NFQUEUE (an ``iptables`` rule in the container's
  namespace) and releasing them from a thread of this process, in order. Only
  the second works on a kernel built without ``CONFIG_NET_SCH_NETEM`` (as the
  Firecracker VM kernel this was written on); it needs the ``iptables``
  command (Debian's ``docker.io`` depends on it), ``nsenter`` (``util-linux``)
  and ``CONFIG_NETFILTER_NETLINK_QUEUE``; netem needs ``tc`` (``iproute2``).
  Both need root.

Containers are found by the labels compose puts on them
(``com.docker.compose.project`` and ``com.docker.compose.service``). The
project defaults to ``$COMPOSE_PROJECT_NAME`` or ``harel-ref`` (what
``.ci/cluster`` uses); when no container has that project but exactly one
project has the three services, that project is used.

Needs the ``docker`` package: ``pip install 'harel-ref[docker]'``. The HTTP
calls to rqlite and the NFQUEUE use only the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import heapq
import json
import os
import random
import select
import shutil
import socket
import struct
import subprocess
import threading
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
        # node -> the latency added to it: "netem" (a qdisc) or the NFQUEUE thread holding packets
        self._latency: dict[str, _Delay | str] = {}

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

    def pid(self, node: str) -> int:
        """The host pid of ``node``'s rqlited (its network namespace is ``/proc/<pid>/ns/net``);
        raises :class:`ClusterError` if the container does not run."""
        pid = int(self.container(node).attrs.get("State", {}).get("Pid") or 0)
        if pid <= 0:
            raise ClusterError(f"{node} does not run (no process to find its network namespace by)")
        return pid

    def add_latency(self, node: str, delay: float = 0.2, jitter: float = 0.05, *,
                    method: str = "auto") -> str:
        """Delay every packet ``node`` sends on the cluster network by ``delay`` +- ``jitter``
        seconds (uniformly), until :meth:`remove_latency` or :meth:`heal`.

        ``method``: ``"netem"`` (``tc qdisc add dev <if> root netem delay ...`` in the
        container's namespace, via ``nsenter``), ``"nfqueue"`` (an ``iptables -j NFQUEUE`` rule
        there, the packets released by a thread of this process, in the order they were sent),
        or ``"auto"``: netem if the kernel and host have it, else nfqueue. Returns the method
        used. The NFQUEUE rule has ``--queue-bypass``: if this process dies, packets flow again
        undelayed (the rule stays until :meth:`heal`). Needs root.
        """
        if not (delay >= 0 and jitter >= 0 and delay - jitter >= 0):
            raise ValueError(f"need 0 <= jitter <= delay, got delay={delay}, jitter={jitter}")
        if method not in ("auto", "netem", "nfqueue"):
            raise ValueError(f"method must be 'auto', 'netem' or 'nfqueue', got {method!r}")
        self.remove_latency(node)
        pid = self.pid(node)
        if method in ("auto", "netem"):
            problem = _netem_add(pid, delay, jitter)
            if problem is None:
                self._latency[node] = "netem"
                return "netem"
            if method == "netem":
                raise ClusterError(f"cannot add netem latency to {node}: {problem}")
        self._latency[node] = _Delay(pid, delay, jitter)
        return "nfqueue"

    def remove_latency(self, node: str) -> int | None:
        """Take away the latency :meth:`add_latency` added to ``node``, and any left in its
        namespace by an earlier process (a netem qdisc, the NFQUEUE rule).  Returns how many
        packets were delayed when that was done by NFQUEUE, else None."""
        added = self._latency.pop(self._check(node), None)
        if isinstance(added, _Delay):
            added.stop()  # deletes its rule, then lets the held packets go
        try:
            pid = self.pid(node)
        except ClusterError:
            pid = 0  # no process, no namespace: nothing left to undo
        if pid:
            _netem_remove(pid)
            while _iptables(pid, "-D", *_nfqueue_rule()) is None:
                pass  # one rule per earlier add_latency that was never removed
        return added.held if isinstance(added, _Delay) else None

    def latency(self) -> dict[str, str]:
        """The nodes with added latency, and how it was added (``"netem"`` or ``"nfqueue"``)."""
        return {node: added if isinstance(added, str) else "nfqueue" for node, added in self._latency.items()}

    def heal(self) -> None:
        """Undo every fault: remove added latency, start stopped nodes, unpause paused ones,
        reconnect all."""
        for node in self.nodes:
            self.remove_latency(node)
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

    def wait_settled(self, hold: float = 3.0, timeout: float = 120.0) -> str:
        """Wait until every managed node agrees on one leader and keeps agreeing for ``hold``
        seconds; return it.  Just after a heal a node that rejoins can call an election, so a
        leader agreed on once may be gone a moment later (a test that started then met "leader
        not found")."""
        deadline = time.monotonic() + timeout
        lead = self.wait_ready(timeout)
        since = time.monotonic()
        while time.monotonic() - since < hold:
            time.sleep(0.25)
            now = self.wait_ready(max(0.0, deadline - time.monotonic()))
            if now != lead:
                lead, since = now, time.monotonic()
        return lead

    def __repr__(self) -> str:
        return f"Cluster(project={self.project!r}, ports={self.ports!r})"


# ------------------------------------------------------------------ latency


def _run_in(pid: int, *command: str) -> str | None:
    """Run ``command`` in the network namespace of ``pid``; None if it succeeded, else why not."""
    if shutil.which("nsenter") is None:
        return "no nsenter on this host (Debian package util-linux)"
    if shutil.which(command[0]) is None:
        return f"no {command[0]} on this host"
    done = subprocess.run(["nsenter", "-t", str(pid), "-n", *command], capture_output=True, text=True,
                          timeout=30, check=False)
    if done.returncode == 0:
        return None
    return f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()[:300]}"


def _devices(pid: int) -> list[str]:
    """The network interfaces in the namespace of ``pid``, other than loopback."""
    with open(f"/proc/{pid}/net/dev", encoding="ascii") as table:
        names = [line.split(":", 1)[0].strip() for line in table if ":" in line]
    return [name for name in names if name != "lo"]


def _netem_add(pid: int, delay: float, jitter: float) -> str | None:
    try:
        devices = _devices(pid)
    except OSError as exc:
        return f"cannot list its network interfaces: {exc}"
    if not devices:
        return "the container has no network interface (disconnected?)"
    for i, device in enumerate(devices):
        problem = _run_in(pid, "tc", "qdisc", "add", "dev", device, "root", "netem", "delay",
                          f"{delay * 1000:.0f}ms", f"{jitter * 1000:.0f}ms")
        if problem is not None:
            for done in devices[:i]:
                _run_in(pid, "tc", "qdisc", "del", "dev", done, "root")
            return problem
    return None


def _netem_remove(pid: int) -> None:
    if shutil.which("tc") is None or shutil.which("nsenter") is None:
        return  # then no netem qdisc was added from this host
    try:
        for device in _devices(pid):
            shown = subprocess.run(["nsenter", "-t", str(pid), "-n", "tc", "qdisc", "show", "dev", device],
                                   capture_output=True, text=True, timeout=30, check=False)
            if " netem " in shown.stdout:
                _run_in(pid, "tc", "qdisc", "del", "dev", device, "root")
    except OSError:
        return  # the process is gone, or this user may not look into its namespace


def _iptables(pid: int, action: str, *rule: str) -> str | None:
    return _run_in(pid, "iptables", "-w", "5", action, *rule)


_NFQUEUE = 4242
"""The queue number the delaying rule sends packets to (queues are per network namespace)."""


def _nfqueue_rule() -> tuple[str, ...]:
    return ("OUTPUT", "!", "-o", "lo", "-m", "comment", "--comment", "harel-ref-latency",
            "-j", "NFQUEUE", "--queue-num", str(_NFQUEUE), "--queue-bypass")


# nfnetlink_queue, as <linux/netfilter/nfnetlink_queue.h> defines it
_NETLINK_NETFILTER = 12
_CLONE_NEWNET = 0x40000000
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET, _NFQNL_MSG_VERDICT, _NFQNL_MSG_CONFIG = 0, 1, 2
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_NLMSG_ERROR = 2
_NFQA_CFG_CMD, _NFQA_CFG_PARAMS, _NFQA_CFG_QUEUE_MAXLEN, _NFQA_CFG_MASK, _NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
_NFQA_PACKET_HDR, _NFQA_VERDICT_HDR = 1, 2
_NFQNL_CFG_CMD_BIND = 1
_NFQNL_COPY_META = 1  # the packet's id and headers only, not its bytes
_NFQA_CFG_F_FAIL_OPEN = 1  # a full queue lets packets through instead of dropping them
_NF_ACCEPT = 1


def _nlattr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _nfq_message(kind: int, attributes: list[bytes], flags: int = _NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, _NFQUEUE) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), (_NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _packet_ids(data: bytes) -> Iterable[int]:
    """The ids of the queued packets announced in one netlink datagram."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        if kind == (_NFNL_SUBSYS_QUEUE << 8) | _NFQNL_MSG_PACKET:
            at, end = offset + 20, offset + length  # after nlmsghdr (16) and nfgenmsg (4)
            while at + 4 <= end:
                size, attribute = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if attribute & 0x3FFF == _NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, at + 4)[0]
                at += (size + 3) & ~3
        offset += (length + 3) & ~3


def _netlink_socket_in(pid: int) -> socket.socket:
    """A netfilter netlink socket in the network namespace of ``pid`` (made by a short-lived
    thread that enters the namespace: setns changes only the calling thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: dict[str, Any] = {}

    def enter_and_open() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
                try:
                    if libc.setns(target, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into the network namespace of pid {pid}")
                    try:
                        made["socket"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
                    finally:
                        if libc.setns(own, _CLONE_NEWNET) != 0:  # the thread ends anyway; be tidy
                            made["error"] = OSError(ctypes.get_errno(), "setns back")
                finally:
                    os.close(target)
            finally:
                os.close(own)
        except BaseException as exc:  # reported to the caller below
            made["error"] = exc

    thread = threading.Thread(target=enter_and_open, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if "error" in made:
        if "socket" in made:
            made["socket"].close()
        raise ClusterError(f"cannot open a netlink socket in the namespace of pid {pid} (root?): {made['error']}")
    return made["socket"]


class _Delay:
    """Hold every packet a container sends for ``delay`` +- ``jitter`` seconds.

    An ``iptables ... -j NFQUEUE`` rule in the container's namespace hands each outgoing packet
    to the kernel queue; this object's thread reads the packets' ids from a netlink socket bound
    to that queue and accepts each when its time comes, never before an earlier one (no
    reordering, as netem with a rate).  The packets themselves stay in the kernel.
    """

    def __init__(self, pid: int, delay: float, jitter: float) -> None:
        self.pid, self.delay, self.jitter = pid, delay, jitter
        self.held = 0  # packets delayed so far
        self._random = random.Random()
        self._stop = threading.Event()
        self._socket = _netlink_socket_in(pid)
        try:
            self._socket.bind((0, 0))
            try:
                self._socket.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root)
            except OSError:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self._configure()
            problem = _iptables(pid, "-I", *_nfqueue_rule())
            if problem is not None:
                raise ClusterError(f"cannot add the NFQUEUE rule in the namespace of pid {pid}: {problem}")
        except BaseException:
            self._socket.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"latency-{pid}", daemon=True)
        self._thread.start()

    def _configure(self) -> None:
        bind = _nlattr(_NFQA_CFG_CMD, struct.pack("!BBH", _NFQNL_CFG_CMD_BIND, 0, 0))
        params = [
            _nlattr(_NFQA_CFG_PARAMS, struct.pack("!IB", 0, _NFQNL_COPY_META)),
            _nlattr(_NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)),
            _nlattr(_NFQA_CFG_MASK, struct.pack("!I", _NFQA_CFG_F_FAIL_OPEN)),
            _nlattr(_NFQA_CFG_FLAGS, struct.pack("!I", _NFQA_CFG_F_FAIL_OPEN)),
        ]
        for seq, attributes in enumerate(([bind], params), start=1):
            self._socket.send(_nfq_message(_NFQNL_MSG_CONFIG, attributes, _NLM_F_REQUEST | _NLM_F_ACK, seq))
            answer = self._socket.recv(65536)
            _, kind = struct.unpack_from("=IH", answer)
            if kind == _NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", answer, 16)
                if code:
                    raise ClusterError(f"nfnetlink_queue refused its configuration: {os.strerror(-code)}"
                                       " (a kernel without CONFIG_NETFILTER_NETLINK_QUEUE?)")

    def _accept(self, packet: int) -> None:
        verdict = _nlattr(_NFQA_VERDICT_HDR, struct.pack("!II", _NF_ACCEPT, packet))
        self._socket.send(_nfq_message(_NFQNL_MSG_VERDICT, [verdict]))

    def _run(self) -> None:
        due: list[tuple[float, int]] = []  # (release time, packet id), a heap
        last = 0.0
        try:
            while not self._stop.is_set():
                wait = min(0.1, max(0.0, due[0][0] - time.monotonic())) if due else 0.1
                readable, _, _ = select.select([self._socket], [], [], wait)
                if readable:
                    try:
                        data = self._socket.recv(65536)
                    except OSError as exc:
                        if exc.errno == errno.ENOBUFS:  # announcements dropped: their packets
                            continue                    # wait in the kernel till the queue closes
                        raise
                    for packet in _packet_ids(data):
                        self.held += 1
                        wanted = time.monotonic() + self._random.uniform(self.delay - self.jitter,
                                                                         self.delay + self.jitter)
                        last = max(last, wanted)
                        heapq.heappush(due, (last, packet))
                now = time.monotonic()
                while due and due[0][0] <= now:
                    self._accept(heapq.heappop(due)[1])
            # Stopping: the rule is gone, so what was queued is all there is; let it go now.
            for _, packet in sorted(due):
                self._accept(packet)
            while select.select([self._socket], [], [], 0.05)[0]:
                for packet in _packet_ids(self._socket.recv(65536)):
                    self._accept(packet)
        except OSError:
            pass  # the namespace is gone (the container stopped): so are its packets

    def stop(self) -> None:
        """Delete the rule, release the held packets, close the queue."""
        _iptables(self.pid, "-D", *_nfqueue_rule())  # new packets are no longer queued
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()  # unbinds the queue (the kernel drops what it still held: nothing)


def wait_for_cluster(timeout: float = 120.0, **kwargs: Any) -> str:
    """Wait until the compose cluster has a leader and all its nodes answer.

    ``kwargs`` go to :class:`Cluster`. Returns the leader's node id.
    """
    return Cluster(**kwargs).wait_ready(timeout)
