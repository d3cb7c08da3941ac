"""The `ssh` infra: a static pool of existing machines (`infra: ssh/<pool>`).

Nothing is created or destroyed: provisioning hands out `num_nodes` free hosts in pool order (rank =
position among them) and locks each one for the cluster; teardown stops the cluster's jobs, removes their
records and the lock, and leaves the machine. Where the truth lives:

- who holds a host: its lock file (`~/.airflow_sky/host.lock`, see hosts.py), so two Airflow deployments
  or two clusters never share one;
- which hosts make up a cluster, with their ranks: the `nodes` record in the cluster's StateStore on the
  pool's state host (state_store.py) — so a member that stopped answering is still known, as UNREACHABLE.

Node status: RUNNING when the host answers and still holds the allocation's lock, TERMINATED when its lock
is gone or another cluster's, UNREACHABLE when it does not answer (a failure, not a preemption: recovery
puts a spare host in its place, or fails naming it when the pool has none).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import paramiko

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra import gpus as gpu_rules
from airflow_sky.infra.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.home import user_known_hosts
from airflow_sky.infra.ssh import hosts
from airflow_sky.infra.ssh.pools import Pool, PoolHost, is_ip, load_pool
from airflow_sky.infra.ssh.state_store import SshStateStore, list_clusters
from airflow_sky.infra.state_store import StateStore
from airflow_sky.node.client import NodeClient

log = logging.getLogger(__name__)

NODES_KEY = "nodes"  # the cluster's membership record in its StateStore
MAX_PARALLEL = 32  # hosts talked to at once (an sshd's MaxStartups drops bursts beyond ~10-30)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Member:
    """One entry of a cluster's membership record."""

    rank: int
    host: str  # PoolHost.label
    token: str
    gpus: int
    ip: str  # the internal IP the other nodes reach it at (SKYPILOT_NODE_IPS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HostStatus:
    """One host as `airflow-sky ssh check` shows it."""

    host: PoolHost
    reachable: bool
    error: str | None = None
    facts: hosts.HostFacts | None = None


class SshCloud(Cloud):
    """Cloud driver for an ssh node pool. `infra` is `ssh/<pool>`; `conn_id` selects a connection pool."""

    name = "ssh"

    def __init__(
        self, pool: str | None = None, conn_id: str | None = None, pool_obj: Pool | None = None
    ) -> None:
        if not pool and pool_obj is None:
            raise ClusterError("infra: the ssh infra needs a pool: ssh/<pool> (e.g. --infra ssh/my-box)")
        self.pool_name = pool_obj.name if pool_obj else str(pool)
        self.conn_id = conn_id
        self._pool = pool_obj
        self._clients: dict[str, NodeClient] = {}
        self._clients_lock = threading.Lock()
        self._host_keys: paramiko.HostKeys | None = None

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            if self.conn_id:
                from airflow_sky.infra.ssh.connection import load_connection_pool

                self._pool = load_connection_pool(self.pool_name, self.conn_id)
            else:
                self._pool = load_pool(self.pool_name)
        return self._pool

    # ---- Cloud interface -------------------------------------------------------------------------------

    def check_config(self) -> None:
        _ = self.pool  # parsed and validated: the file, the pool, each host's key

    def provision(self, request: ProvisionRequest) -> list[Node]:
        cluster = request.cluster_name
        accelerators = _accelerators(request)
        store = self._store(cluster)
        record = store.get(NODES_KEY)
        members = _members(record.data if record else None)
        current = {n.rank: n for n in self._nodes_of(members)}
        missing = [
            r
            for r in range(request.num_nodes)
            if r not in current or current[r].status is not NodeStatus.RUNNING
        ]
        if not missing:
            return [current[r] for r in sorted(current)]
        taken = {m.host for m in members.values()}
        acquired: list[tuple[PoolHost, Member]] = []
        try:
            for member in self._allocate(cluster, missing, taken, accelerators, request.num_nodes):
                acquired.append((self._host(member.host), member))
            self._write_members(store, cluster, {m.rank: m for _, m in acquired})
        except BaseException:
            for host, member in acquired:
                self._release_quietly(host, member.token)
            raise
        # Hosts whose rank moved to a new host (they stopped answering, or lost their lock) are let go.
        for rank in missing:
            old = members.get(rank)
            if old is not None and old.host in {h.label for h in self.pool.hosts}:
                self._release_quietly(self._host(old.host), old.token)
        return self.nodes(cluster)

    def nodes(self, cluster_name: str) -> list[Node]:
        record = self.state_store(cluster_name).get(NODES_KEY)
        return self._nodes_of(_members(record.data if record else None))

    def replace(self, cluster_name: str, rank: int) -> Node:
        store = self._store(cluster_name)
        record = store.get(NODES_KEY)
        members = _members(record.data if record else None)
        old = members.get(rank)
        if old is None:
            raise ClusterError(f"cluster {cluster_name!r} has no node of rank {rank} on ssh/{self.pool_name}")
        new = next(
            iter(
                self._allocate(
                    cluster_name, [rank], {m.host for m in members.values()}, None, 1, replacing=old.host
                )
            )
        )
        try:
            self._write_members(store, cluster_name, {rank: new})
        except BaseException:
            self._release_quietly(self._host(new.host), new.token)
            raise
        self._release_quietly(self._host(old.host), old.token)
        return next(n for n in self.nodes(cluster_name) if n.rank == rank)

    def terminate(self, cluster_name: str) -> None:
        """Stop the cluster's jobs and free its hosts (every pool host whose lock names it), then its records."""
        statuses = self._map(self.pool.hosts, self._try_read_lock)
        for host, (lock, error) in zip(self.pool.hosts, statuses, strict=True):
            if (
                error is None
                and lock is not None
                and lock.cluster == cluster_name
                and lock.pool == self.pool_name
            ):
                client = self._client(host)
                hosts.clean(client)
                hosts.release(client, lock.token)
        record = self.state_store(cluster_name).get(NODES_KEY)
        unreachable = [
            m.host
            for m in _members(record.data if record else None).values()
            if statuses[self._index(m.host)][1] is not None
        ]
        if unreachable:
            log.warning(
                "ssh/%s: hosts %s of cluster %s did not answer; their locks stay until they are back "
                "(`airflow-sky ssh unlock %s` breaks them)",
                self.pool_name,
                ", ".join(unreachable),
                cluster_name,
                self.pool_name,
            )
        self._store(cluster_name).remove_all()

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        return ClusterInfo(cluster_name=cluster_name, cloud="ssh", region=self.pool_name, zone=None)

    def ssh_private_key(self, cluster_name: str) -> str:
        return str(self.pool.hosts[0].identity_file)

    def key_file_for(self, cluster_name: str, node: Node) -> str:
        return str(self._host(_host_label(node.instance_id)).identity_file)

    def state_store(self, cluster_name: str) -> StateStore:
        return self._store(cluster_name)

    def clusters(self) -> list[str]:
        try:
            return list_clusters(self._client(self.pool.hosts[0]), self.pool_name)
        except RemoteError as e:
            raise ClusterError(
                f"ssh/{self.pool_name}: the state host {self.pool.hosts[0].label} does not answer: {e}"
            ) from e

    # ---- pool-only operations ----------------------------------------------------------------------------

    def check(self) -> list[HostStatus]:
        """Every host of the pool: reachable, key accepted, tools present, GPUs, free or held."""

        def one(host: PoolHost) -> HostStatus:
            try:
                return HostStatus(host, True, facts=hosts.probe(self._client(host)))
            except (RemoteError, ClusterError) as e:
                return HostStatus(host, False, error=str(e))

        return self._map(self.pool.hosts, one)

    def unlock(
        self, only_hosts: Sequence[str] = (), force: bool = False
    ) -> list[tuple[PoolHost, hosts.HostLock]]:
        """Free hosts held by stale locks (their cluster has no record of the host any more): stop what that
        cluster left running there, remove its job records and the lock. `force` frees live hosts too."""
        broken = []
        known: dict[str, dict[int, Member]] = {}
        for host in self.pool.hosts:
            if only_hosts and host.name not in only_hosts and host.label not in only_hosts:
                continue
            lock, error = self._try_read_lock(host)
            if error is not None or lock is None:
                continue
            if lock.cluster not in known:
                record = self._store(lock.cluster).get(NODES_KEY) if lock.pool == self.pool_name else None
                known[lock.cluster] = _members(record.data if record else None)
            member = known[lock.cluster].get(lock.rank)
            live = member is not None and member.host == host.label and member.token == lock.token
            if live and not force:
                continue
            # The host goes back as teardown would have left it: the gone cluster's jobs stopped, their
            # records removed (it was off when its cluster was torn down), then the lock.
            client = self._client(host)
            hosts.clean(client)
            if hosts.release(client, lock.token):
                broken.append((host, lock))
        return broken

    # ---- internals -------------------------------------------------------------------------------------

    def _store(self, cluster_name: str) -> SshStateStore:
        head = self.pool.hosts[0]
        return SshStateStore(lambda: self._client(head), self.pool_name, cluster_name, head.label)

    def _allocate(
        self,
        cluster: str,
        ranks: Sequence[int],
        taken: set[str],
        accelerators: dict[str, float] | None,
        num_nodes: int,
        replacing: str | None = None,
    ) -> Iterable[Member]:
        """Lock one free, suitable host per rank, in pool order; all or nothing."""
        candidates = [h for h in self.pool.hosts if h.label not in taken]
        probes = self._map(candidates, self._try_probe)
        held: list[str] = []
        unsuitable: list[tuple[str, gpu_rules.Gpus]] = []
        down: list[str] = []
        chosen: list[Member] = []
        pending = list(ranks)
        try:
            for host, (facts, error) in zip(candidates, probes, strict=True):
                if not pending:
                    break
                if error is not None or facts is None:
                    down.append(f"{host.label} ({error})")
                    continue
                if facts.lock is not None or facts.lock_unreadable:
                    held.append(f"{host.label}: {facts.lock.describe() if facts.lock else 'locked'}")
                    continue
                if gpu_rules.satisfies(facts.gpus, accelerators) is None:
                    unsuitable.append((host.label, facts.gpus))
                    continue
                rank = pending[0]
                token = secrets.token_hex(8)
                holder = hosts.acquire(
                    self._client(host), hosts.new_lock(cluster, rank, self.pool_name, token)
                )
                if holder is not None:  # another cluster got there between the probe and the lock
                    held.append(f"{host.label}: {holder.describe()}")
                    continue
                ip = hosts.internal_ip(_resolved(host.address), facts.addresses)
                chosen.append(Member(rank, host.label, token, self._gpu_count(facts.gpus, accelerators), ip))
                pending.pop(0)
        except BaseException:
            for member in chosen:
                self._release_quietly(self._host(member.host), member.token)
            raise
        if pending:
            for member in chosen:
                self._release_quietly(self._host(member.host), member.token)
            raise ClusterError(
                self._no_host_message(
                    cluster, pending, num_nodes, held, unsuitable, down, accelerators, replacing
                )
            )
        return chosen

    def _no_host_message(
        self,
        cluster: str,
        pending: Sequence[int],
        num_nodes: int,
        held: list[str],
        unsuitable: list[tuple[str, gpu_rules.Gpus]],
        down: list[str],
        accelerators: dict[str, float] | None,
        replacing: str | None,
    ) -> str:
        if replacing is not None:
            head = (
                f"ssh/{self.pool_name}: host {replacing} (rank {pending[0]} of cluster {cluster!r}) is lost "
                "and the pool has no free host to replace it"
            )
        else:
            head = (
                f"ssh/{self.pool_name}: not enough free hosts for cluster {cluster!r} "
                f"({len(pending)} more needed of {num_nodes})"
            )
        parts = [head]
        if (
            unsuitable
            and all(gpu_rules.satisfies(g, accelerators) is None for _, g in unsuitable)
            and not held
        ):
            parts.append(
                f"no host has {gpu_rules.requested_summary(accelerators)} "
                f"({gpu_rules.describe_hosts(unsuitable)})"
            )
        elif unsuitable:
            parts.append(
                f"without {gpu_rules.requested_summary(accelerators)}: {gpu_rules.describe_hosts(unsuitable)}"
            )
        if held:
            parts.append("held: " + "; ".join(held))
        if down:
            parts.append("cannot be used: " + "; ".join(down))
        return ". ".join(parts)

    @staticmethod
    def _gpu_count(gpus: gpu_rules.Gpus, accelerators: dict[str, float] | None) -> int:
        chosen = gpu_rules.satisfies(gpus, accelerators)
        return gpu_rules.matching_count(gpus, chosen) if chosen else gpus.count

    def _write_members(self, store: SshStateStore, cluster: str, changes: dict[int, Member]) -> None:
        """Merge `changes` into the membership record (compare-and-swap, re-read on a lost race)."""
        for _ in range(50):
            record = store.get(NODES_KEY)
            members = _members(record.data if record else None)
            members.update(changes)
            data = {"pool": self.pool_name, "nodes": [members[r].to_dict() for r in sorted(members)]}
            if store.put(NODES_KEY, data, record.version if record else None) is not None:
                return
        raise ClusterError(f"cluster {cluster!r}: could not record its nodes (too many concurrent writers)")

    def _nodes_of(self, members: dict[int, Member]) -> list[Node]:
        ordered = [members[r] for r in sorted(members)]
        return self._map(ordered, self._node_status)

    def _node_status(self, member: Member) -> Node:
        host = self.pool.host(member.host)
        if host is None:  # the pool no longer lists the host: it is not ours to reach
            return self._node(member, None, NodeStatus.TERMINATED)
        lock, error = self._try_read_lock(host)
        if error is not None:
            return self._node(member, host, NodeStatus.UNREACHABLE)
        ours = lock is not None and lock.token == member.token
        return self._node(member, host, NodeStatus.RUNNING if ours else NodeStatus.TERMINATED)

    def _node(self, member: Member, host: PoolHost | None, status: NodeStatus) -> Node:
        address = host.address if host else member.host.rpartition("@")[2]
        return Node(
            rank=member.rank,
            internal_ip=member.ip,
            ssh_host=address,
            ssh_port=host.port if host else 22,
            ssh_user=host.user if host else member.host.partition("@")[0],
            instance_id=f"{member.host}#{member.token}",
            status=status,
            gpus=member.gpus,
            host_key=self._known_key(host) if host else None,
        )

    # ---- hosts and connections -------------------------------------------------------------------------

    def _host(self, label: str) -> PoolHost:
        host = self.pool.host(label)
        if host is None:
            raise ClusterError(
                f"ssh/{self.pool_name}: host {label} is no longer in the pool ({self.pool.source})"
            )
        return host

    def _index(self, label: str) -> int:
        host = self.pool.host(label)
        return host.index if host else -1

    def _pinned_key(self, host: PoolHost) -> str:
        """The host's key from the pool's connection or known_hosts; unknown hosts are refused."""
        if self._host_keys is None:
            keys = paramiko.HostKeys()
            path = user_known_hosts()
            if path.is_file():
                with contextlib.suppress(OSError):
                    keys.load(str(path))
            for line in self.pool.known_hosts:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
                if entry is not None and entry.key is not None:
                    for name in entry.hostnames:
                        keys.add(name, entry.key.get_name(), entry.key)
            self._host_keys = keys
        found = self._host_keys.lookup(host.known_hosts_name)
        if not found:
            port = "" if host.port == 22 else f"-p {host.port} "
            raise ClusterError(
                f"ssh/{self.pool_name}: host {host.label} (hosts[{host.index}] in {self.pool.source}) has no "
                f"known host key in {user_known_hosts()}; airflow-sky never trusts a key on first use. Check the "
                f"host's fingerprint, then add it: ssh-keyscan {port}{host.address} >> {user_known_hosts()}"
                " (or put the line in the pool connection's extra `known_hosts`)"
            )
        preferred = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "ssh-rsa")
        key_type = next((t for t in preferred if t in found), next(iter(found.keys())))
        key = found[key_type]
        return f"{key.get_name()} {key.get_base64()}"

    def _known_key(self, host: PoolHost) -> str | None:
        try:
            return self._pinned_key(host)
        except ClusterError:
            return None

    def _client(self, host: PoolHost) -> NodeClient:
        """This driver's connection to `host` (kept open: nodes() is polled), opened on first use."""
        with self._clients_lock:
            client = self._clients.get(host.label)
            if client is None:
                node = Node(
                    rank=host.index,
                    internal_ip=host.address,
                    ssh_host=host.address,
                    ssh_port=host.port,
                    ssh_user=host.user,
                    instance_id=host.label,
                    host_key=self._pinned_key(host),
                )
                client = self._clients[host.label] = NodeClient(
                    node, str(host.identity_file), conn_retry_attempts=1
                )
            return client

    def _try_read_lock(self, host: PoolHost) -> tuple[hosts.HostLock | None, str | None]:
        try:
            return hosts.read_lock(self._client(host)), None
        except (RemoteError, OSError, paramiko.SSHException) as e:  # a transport that broke mid-request
            return None, hosts.unusable_reason(e)

    def _try_probe(self, host: PoolHost) -> tuple[hosts.HostFacts | None, str | None]:
        try:
            return hosts.probe(self._client(host)), None
        except (RemoteError, OSError, paramiko.SSHException) as e:
            return None, hosts.unusable_reason(e)

    def _release_quietly(self, host: PoolHost, token: str) -> None:
        with contextlib.suppress(RemoteError, ClusterError):
            hosts.release(self._client(host), token)

    @staticmethod
    def _map(items: Sequence[Any], fn: Callable[[Any], _T]) -> list[_T]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(min(MAX_PARALLEL, len(items))) as pool:
            return list(pool.map(fn, items))


def _members(data: dict[str, Any] | None) -> dict[int, Member]:
    if not data:
        return {}
    return {
        int(m["rank"]): Member(
            int(m["rank"]), str(m["host"]), str(m["token"]), int(m.get("gpus") or 0), str(m["ip"])
        )
        for m in data.get("nodes", [])
    }


def _host_label(instance_id: str) -> str:
    return instance_id.rpartition("#")[0] or instance_id


def _resolved(address: str) -> str:
    """An ssh-config HostName that is a DNS name, as an IP (what SKYPILOT_NODE_IPS carries)."""
    if is_ip(address):
        return address
    with contextlib.suppress(OSError):
        return socket.gethostbyname(address)
    return address


def _accelerators(request: ProvisionRequest) -> dict[str, float] | None:
    resources = request.resources
    if resources is None:
        return None
    merged: dict[str, float] = {}
    for candidate in resources.candidates():
        for name, count in (candidate.accelerators or {}).items():
            merged.setdefault(name, float(count))
    return merged or None
