"""The `ssh` infra: a static pool of existing machines (`infra: ssh/<pool>`).

Nothing is created or destroyed: provisioning hands out `num_nodes` free hosts in pool order (rank =
position among them) and locks each one for the cluster; teardown stops the cluster's jobs, removes their
records and the lock, and leaves the machine. Where the truth lives:

- who holds a host: its lock record on the pool's state host (host_locks.py), so two Airflow deployments
  or two clusters never share one;
- which hosts make up a cluster, with their ranks: the `nodes` record in the cluster's StateStore on the
  pool's state host (state_store.py) — so a member that stopped answering is still known, as UNREACHABLE.

The state host is named by the pool definition (`state:`) and runs no jobs: nothing a job on a pool host
writes decides membership, addresses or host keys. A node's address, user and host key always come from the
pool definition; the record only says which pool host (by label) holds which rank (`checked_host`).

Node status: RUNNING when the host answers and still holds the allocation's lock, TERMINATED when its lock
is gone or another cluster's, UNREACHABLE when it does not answer (a failure, not a preemption: recovery
puts a spare host in its place, or fails naming it when the pool has none).

The pool's hosts, their pinned keys and connections: pool_hosts.py; the rules of handing hosts out (GPUs,
the message when none is free): allocation.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import socket
from collections.abc import Iterable, Sequence

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra import gpus as gpu_rules
from airflow_sky.infra.base import Cloud, ClusterInfo, Endpoint, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.ssh import hosts
from airflow_sky.infra.ssh.allocation import Member, accelerators_of, gpu_count, members_of, no_host_message
from airflow_sky.infra.ssh.pool_hosts import PoolHosts
from airflow_sky.infra.ssh.pools import PoolHost, is_ip, state_host
from airflow_sky.infra.ssh.state_store import SshStateStore, list_clusters
from airflow_sky.infra.state_store import StateStore

log = logging.getLogger(__name__)

NODES_KEY = "nodes"  # the cluster's membership record in its StateStore
PORTS_KEY = "ports"  # the task's resources.ports, for `status --endpoints` (nothing is opened on a pool)


@dataclasses.dataclass(frozen=True)
class HostStatus:
    """One host as `airflow-sky ssh check` shows it."""

    host: PoolHost
    reachable: bool
    error: str | None = None
    facts: hosts.HostFacts | None = None
    lock: hosts.HostLock | None = None  # who holds it (from the state host)
    containers: str = "-"  # its container runtimes (node.container.describe_runtimes' words)


class SshCloud(PoolHosts, Cloud):
    """Cloud driver for an ssh node pool. `infra` is `ssh/<pool>`; `conn_id` selects a connection pool."""

    name = "ssh"

    # ---- Cloud interface -------------------------------------------------------------------------------

    def check_config(self) -> None:
        state_host(self.pool)  # parsed and validated: the file, the pool, each host's key, the state host

    def provision(self, request: ProvisionRequest) -> list[Node]:
        cluster = request.cluster_name
        accelerators = accelerators_of(request)
        store = self._store(cluster)
        record = store.get(NODES_KEY)
        members = members_of(record.data if record else None)
        current = {n.rank: n for n in self._nodes_of(members)}
        missing = [
            r
            for r in range(request.num_nodes)
            if r not in current or current[r].status is not NodeStatus.RUNNING
        ]
        ports = request.resources.ports if request.resources is not None else None
        if not missing:
            self._record_ports(store, cluster, ports)
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
        self._record_ports(store, cluster, ports)
        return self.nodes(cluster)

    def nodes(self, cluster_name: str) -> list[Node]:
        record = self.state_store(cluster_name).get(NODES_KEY)
        return self._nodes_of(members_of(record.data if record else None))

    def replace(self, cluster_name: str, rank: int) -> Node:
        store = self._store(cluster_name)
        record = store.get(NODES_KEY)
        members = members_of(record.data if record else None)
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
        held = self._locks.read_all(self.pool.hosts)
        ours = [
            h
            for h in self.pool.hosts
            if h.label in held
            and (held[h.label].cluster, held[h.label].pool) == (cluster_name, self.pool_name)
        ]
        freed = self._map(ours, lambda host: self._free(host, held[host.label].token))
        unreachable = [host.label for host, done in zip(ours, freed, strict=True) if not done]
        if unreachable:
            log.warning(
                "ssh/%s: hosts %s of cluster %s did not answer or could not be reset (see above); their "
                "locks stay until they are back and clean (`airflow-sky ssh unlock %s` retries)",
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
        """The key of the pool host `node` names, once its address and host key are the pool's (every
        connection to a node asks here first)."""
        return str(self.checked_host(node).identity_file)

    def state_store(self, cluster_name: str) -> StateStore:
        return self._store(cluster_name)

    def opened_ports(self, cluster_name: str) -> tuple[str, ...]:
        record = self._store(cluster_name).get(PORTS_KEY)
        return tuple(record.data.get("ports") or ()) if record else ()

    def clusters(self) -> list[str]:
        state = state_host(self.pool)
        try:
            return list_clusters(self._client(state), self.pool_name)
        except RemoteError as e:
            raise ClusterError(
                f"ssh/{self.pool_name}: the state host {state.label} does not answer: {e}"
            ) from e

    # ---- pool-only operations ----------------------------------------------------------------------------

    def check(self) -> list[HostStatus]:
        """Every host of the pool: reachable, key accepted, tools present, GPUs, container runtimes, free or
        held."""

        held = self._locks.read_all(self.pool.hosts)

        def one(host: PoolHost) -> HostStatus:
            try:
                facts = hosts.probe(self._client(host))
                runtimes = hosts.containers(self._client(host))
                return HostStatus(host, True, facts=facts, lock=held.get(host.label), containers=runtimes)
            except (RemoteError, ClusterError) as e:
                return HostStatus(host, False, error=str(e), lock=held.get(host.label))

        return self._map(self.pool.hosts, one)

    def unlock(
        self, only_hosts: Sequence[str] = (), force: bool = False
    ) -> list[tuple[PoolHost, hosts.HostLock]]:
        """Free hosts held by stale locks (their cluster has no record of the host any more): stop what that
        cluster left running there, remove its job records and the lock. `force` frees live hosts too."""
        broken = []
        known: dict[tuple[str, str], dict[int, Member]] = {}
        locks = self._locks
        held = locks.read_all(self.pool.hosts)
        for host in self.pool.hosts:
            if only_hosts and host.name not in only_hosts and host.label not in only_hosts:
                continue
            lock = held.get(host.label)
            if lock is None or self._try_reach(host) is not None:
                continue
            if (lock.pool, lock.cluster) not in known:  # a pool sharing the host keeps its records here too
                record = self._store(lock.cluster, lock.pool).get(NODES_KEY) if lock.pool else None
                known[lock.pool, lock.cluster] = members_of(record.data if record else None)
            member = known[lock.pool, lock.cluster].get(lock.rank)
            live = member is not None and member.host == host.label and member.token == lock.token
            if live and not force:
                continue
            # The host goes back as teardown would have left it: the gone cluster's jobs stopped, their
            # records removed (it was off when its cluster was torn down), then the lock.
            if self._free(host, lock.token):
                broken.append((host, lock))
        return broken

    # ---- internals -------------------------------------------------------------------------------------

    def _allocate(
        self,
        cluster: str,
        ranks: Sequence[int],
        taken: set[str],
        accelerators: dict[str, float] | None,
        num_nodes: int,
        replacing: str | None = None,
    ) -> list[Member]:
        """Lock one free, suitable host per rank and reset it to its baseline (PoolHosts._prepare); a host
        whose reset fails is let go and another takes its rank. All or nothing."""
        ready: list[Member] = []
        failed: list[str] = []
        pending = list(ranks)
        try:
            while pending:
                want = (accelerators, num_nodes, replacing)
                chosen = self._lock_hosts(cluster, pending, taken, want, failed)
                reasons = self._map(list(chosen), lambda m: self._prepare(self._host(m.host)))
                for member, why in zip(chosen, reasons, strict=True):
                    if why is None:
                        ready.append(member)
                        continue
                    log.warning("ssh/%s: host %s cannot be used: %s", self.pool_name, member.host, why)
                    self._locks.release(self._host(member.host), member.token)
                    failed.append(f"{member.host} ({why})")
                    taken = taken | {member.host}
                pending = [m.rank for m, why in zip(chosen, reasons, strict=True) if why is not None]
        except BaseException:
            for member in ready:
                self._release_quietly(self._host(member.host), member.token)
            raise
        return sorted(ready, key=lambda m: m.rank)

    def _lock_hosts(
        self,
        cluster: str,
        ranks: Sequence[int],
        taken: set[str],
        want: tuple[dict[str, float] | None, int, str | None],
        failed: list[str],
    ) -> Iterable[Member]:
        """Lock one free, suitable host per rank, in pool order; all or nothing. `want`: the accelerators,
        the cluster's node count and the host a rank replaces; `failed`: hosts a reset refused (the message)."""
        accelerators, num_nodes, replacing = want
        candidates = [h for h in self.pool.hosts if h.label not in taken]
        locks = self._locks
        held_now = locks.read_all(candidates)
        probes = self._map(candidates, self._try_probe)
        held: list[str] = []
        unsuitable: list[tuple[str, gpu_rules.Gpus]] = []
        down: list[str] = list(failed)
        chosen: list[Member] = []
        pending = list(ranks)
        try:
            for host, (facts, error) in zip(candidates, probes, strict=True):
                if not pending:
                    break
                if error is not None or facts is None:
                    down.append(f"{host.label} ({error})")
                    continue
                if host.label in held_now:
                    held.append(f"{host.label}: {held_now[host.label].describe()}")
                    continue
                if gpu_rules.satisfies(facts.gpus, accelerators) is None:
                    unsuitable.append((host.label, facts.gpus))
                    continue
                rank = pending[0]
                token = secrets.token_hex(8)
                holder = locks.acquire(host, hosts.new_lock(cluster, rank, self.pool_name, token))
                if holder is not None:  # another cluster got there between the probe and the lock
                    held.append(f"{host.label}: {holder.describe()}")
                    continue
                ip = hosts.internal_ip(_resolved(host.address), facts.addresses)
                chosen.append(Member(rank, host.label, token, gpu_count(facts.gpus, accelerators), ip))
                pending.pop(0)
        except BaseException:
            for member in chosen:
                self._release_quietly(self._host(member.host), member.token)
            raise
        if pending:
            for member in chosen:
                self._release_quietly(self._host(member.host), member.token)
            raise ClusterError(
                no_host_message(
                    self.pool_name,
                    cluster,
                    pending,
                    num_nodes,
                    held,
                    unsuitable,
                    down,
                    accelerators,
                    replacing,
                )
            )
        return chosen

    def _record_ports(self, store: SshStateStore, cluster: str, ports: Sequence[str] | None) -> None:
        if not ports:  # a task without ports keeps what an earlier one recorded (as aws and gcp do)
            return
        for _ in range(50):  # compare-and-swap, as the membership record
            record = store.get(PORTS_KEY)
            if store.put(PORTS_KEY, {"ports": list(ports)}, record.version if record else None) is not None:
                return
        raise ClusterError(f"cluster {cluster!r}: could not record its ports (too many concurrent writers)")

    def _write_members(self, store: SshStateStore, cluster: str, changes: dict[int, Member]) -> None:
        """Merge `changes` into the membership record (compare-and-swap, re-read on a lost race)."""
        for _ in range(50):
            record = store.get(NODES_KEY)
            members = members_of(record.data if record else None)
            members.update(changes)
            data = {"pool": self.pool_name, "nodes": [members[r].to_dict() for r in sorted(members)]}
            if store.put(NODES_KEY, data, record.version if record else None) is not None:
                return
        raise ClusterError(f"cluster {cluster!r}: could not record its nodes (too many concurrent writers)")

    def _nodes_of(self, members: dict[int, Member]) -> list[Node]:
        ordered = [members[r] for r in sorted(members)]
        if not ordered:
            return []
        listed = [h for m in ordered if (h := self.pool.host(m.host)) is not None]
        held = self._locks.read_all(listed)
        return self._map(ordered, lambda member: self._node_status(member, held))

    def _node_status(self, member: Member, held: dict[str, hosts.HostLock]) -> Node:
        host = self.pool.host(member.host)
        if host is None:  # the pool no longer lists the host: it is not ours to reach
            return self._node(member, None, NodeStatus.TERMINATED)
        lock = held.get(host.label)
        if lock is None or lock.token != member.token:
            return self._node(member, host, NodeStatus.TERMINATED)
        if self._try_reach(host) is not None:
            return self._node(member, host, NodeStatus.UNREACHABLE)
        return self._node(member, host, NodeStatus.RUNNING)

    def _node(self, member: Member, host: PoolHost | None, status: NodeStatus) -> Node:
        if host is not None:
            endpoint = Endpoint(host.address, host.port, host.user, member.ip)
        else:  # what the label says: user@address
            endpoint = Endpoint(member.host.rpartition("@")[2], 22, member.host.partition("@")[0], member.ip)
        host_key = self._known_key(host) if host else None
        return endpoint.node(member.rank, f"{member.host}#{member.token}", status, member.gpus, host_key)


def _resolved(address: str) -> str:
    """An ssh-config HostName that is a DNS name, as an IP (what SKYPILOT_NODE_IPS carries)."""
    if is_ip(address):
        return address
    with contextlib.suppress(OSError):
        return socket.gethostbyname(address)
    return address
