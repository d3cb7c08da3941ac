"""The ssh infra's pool as one driver sees it: the pool (from its file or connection), each host's pinned
key (never trusted on first use), one kept-open connection per host, and the host reads that may fail.

Trust line: a node's address, user and host key come from the pool definition (its file or connection,
the worker's known_hosts), never from a record. Nodes handed back by the job state or XCom are checked
against it before any connection (`checked_host`), and who holds a host is read from the pool's state host
(host_locks.py), which runs no jobs: nothing a job on a pool host writes is believed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import paramiko

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra.base import Endpoint, Node, NodeStatus
from airflow_sky.infra.home import user_known_hosts
from airflow_sky.infra.ssh import hosts
from airflow_sky.infra.ssh.host_locks import HostLocks
from airflow_sky.infra.ssh.login_baseline import BASELINES_ROOT, HostBaselines, reset
from airflow_sky.infra.ssh.pools import Pool, PoolHost, is_ip, load_pool, state_host
from airflow_sky.infra.ssh.state_store import HOST_LOCKS_ROOT, SshStateStore
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container import instance_container_name

log = logging.getLogger(__name__)

MAX_PARALLEL = 32  # hosts talked to at once (an sshd's MaxStartups drops bursts beyond ~10-30)
_T = TypeVar("_T")


class PoolHosts:
    """The hosts of pool `ssh/<pool>`; `conn_id` selects a connection pool, `pool_obj` a parsed one."""

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

    def _host(self, label: str) -> PoolHost:
        host = self.pool.host(label)
        if host is None:
            raise ClusterError(
                f"ssh/{self.pool_name}: host {label} is no longer in the pool ({self.pool.source})"
            )
        return host

    # ---- the state host ----------------------------------------------------------------------------------

    def _store(self, cluster_name: str, pool: str | None = None) -> SshStateStore:
        """Cluster `cluster_name`'s records (of this pool, or `pool` kept on the same state host); a pool
        that names no state host is refused."""
        state = state_host(self.pool)
        return SshStateStore(lambda: self._client(state), pool or self.pool_name, cluster_name, state.label)

    @property
    def _locks(self) -> HostLocks:
        """Who holds which host, on the state host."""
        state = state_host(self.pool)
        return HostLocks(
            SshStateStore(lambda: self._client(state), "", "", state.label, root=HOST_LOCKS_ROOT)
        )

    @property
    def _baselines(self) -> HostBaselines:
        """Each host's login files as they were at its first allocation (login_baseline.py), on the state host."""
        state = state_host(self.pool)
        return HostBaselines(
            SshStateStore(lambda: self._client(state), "", "", state.label, root=BASELINES_ROOT)
        )

    # ---- host keys and addresses: from the pool definition -----------------------------------------------

    def checked_host(self, node: Node) -> PoolHost:
        """The pool host `node` names, refusing a node whose address, user or host key the pool does not give.

        Nodes come back from records (the job state, XCom, trigger kwargs): every connection to a node of
        this infra asks for its key file here first (Cluster.client, key_files), so a record that points a
        rank elsewhere is refused, never used.
        """
        label = node.instance_id.rpartition("#")[0] or node.instance_id
        host = self.pool.host(label)
        if host is None:
            raise ClusterError(
                f"ssh/{self.pool_name}: rank {node.rank} names host {label!r}, which is not in the pool "
                f"({self.pool.source}); refusing to connect"
            )
        wrong = []
        if (node.ssh_host, node.ssh_port, node.ssh_user) != (host.address, host.port, host.user):
            wrong.append(f"address {node.ssh_user}@{node.ssh_host}:{node.ssh_port}")
        if node.host_key is None or _key_text(node.host_key) not in self._pinned_keys(host):
            wrong.append("host key")
        if is_ip(host.address) and _private(host.address) and node.internal_ip != host.address:
            wrong.append(f"internal IP {node.internal_ip}")
        if wrong:
            raise ClusterError(
                f"ssh/{self.pool_name}: the record of rank {node.rank} gives {' and '.join(wrong)} for "
                f"{host.label} ({host.field} in {self.pool.source}), which the pool definition does not; "
                "refusing to connect (a record was changed: check the pool's state host)"
            )
        return host

    def _pinned_keys(self, host: PoolHost) -> set[str]:
        """Every key the pool definition pins for `host` (`<type> <base64>`)."""
        if host.host_key:
            return {host.host_key}
        found = self._known_hosts().lookup(host.known_hosts_name)
        return {f"{key.get_name()} {key.get_base64()}" for key in found.values()} if found else set()

    def _known_hosts(self) -> paramiko.HostKeys:
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
        return self._host_keys

    def _pinned_key(self, host: PoolHost) -> str:
        """The host's key from the pool definition (`host_key`, the connection's or the worker's known_hosts);
        unknown hosts are refused."""
        if host.host_key:
            return host.host_key
        found = self._known_hosts().lookup(host.known_hosts_name)
        if not found:
            port = "" if host.port == 22 else f"-p {host.port} "
            raise ClusterError(
                f"ssh/{self.pool_name}: host {host.label} ({host.field} in {self.pool.source}) has no "
                f"known host key in {user_known_hosts()}; airflow-sky never trusts a key on first use. Check the "
                f"host's fingerprint, then add it: ssh-keyscan {port}{host.address} >> {user_known_hosts()}"
                " (or set the host's `host_key` in the pool, or put the line in the pool connection's extra "
                "`known_hosts`)"
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
                endpoint = Endpoint(host.address, host.port, host.user, host.address)
                node = endpoint.node(host.index, host.label, NodeStatus.RUNNING, 0, self._pinned_key(host))
                client = self._clients[host.label] = NodeClient(
                    node, str(host.identity_file), conn_retry_attempts=1
                )
            return client

    def _try_reach(self, host: PoolHost) -> str | None:
        """None when the host answers (one SFTP request on the kept connection), else why it cannot be used.
        The request lists `/`, which no job can make long (a job owns its home)."""
        try:
            self._client(host).listdir("/")
            return None
        except (RemoteError, OSError, paramiko.SSHException) as e:  # a transport that broke mid-request
            return hosts.unusable_reason(e)

    def _try_probe(self, host: PoolHost) -> tuple[hosts.HostFacts | None, str | None]:
        try:
            return hosts.probe(self._client(host)), None
        except (RemoteError, OSError, paramiko.SSHException) as e:
            return None, hosts.unusable_reason(e)

    def _free(self, host: PoolHost, token: str) -> bool:
        """Free `host` of allocation `token`: its login files go back to the baseline and its jobs are stopped
        first (login_baseline.reset), so nothing of a cluster that is gone meets the next one. A host that
        does not answer, or whose reset fails, keeps its lock (`airflow-sky ssh unlock` frees it once it is
        back, or after its user's leftovers are dealt with). True when freed."""
        locks = self._locks
        lock = locks.read(host)
        if lock is None or lock.token != token or self._try_reach(host) is not None:
            return False
        client = self._client(host)
        baseline = self._baselines.get(locks.key(host))
        # The node's container (image_id: docker:), named from its instance id as the worker named it.
        containers = [instance_container_name(f"{host.label}#{token}")]
        if baseline is None:  # taken by an older version, before baselines: its next allocation takes one
            hosts.clean(client, containers)
        elif (why := reset(client, baseline, host.label, taking=False, containers=containers)) is not None:
            log.warning("ssh/%s: host %s stays held by its cluster: %s", self.pool_name, host.label, why)
            return False
        return locks.release(host, token)

    def _prepare(self, host: PoolHost) -> str | None:
        """A host just locked for a cluster, before its first command: the baseline taken if it has none,
        then reset to it, names the baseline lacks at the top of the home removed. None when ready."""
        client = self._client(host)
        try:
            baseline = self._baselines.get_or_take(HostLocks.key(host), client, host.label)
        except (RemoteError, ClusterError) as e:
            return str(e)
        return reset(client, baseline, host.label, taking=True)

    def _release_quietly(self, host: PoolHost, token: str) -> None:
        with contextlib.suppress(RemoteError, ClusterError):
            self._free(host, token)

    @staticmethod
    def _map(items: Sequence[Any], fn: Callable[[Any], _T]) -> list[_T]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(min(MAX_PARALLEL, len(items))) as pool:
            return list(pool.map(fn, items))


def _key_text(host_key: str) -> str:
    return " ".join(host_key.split()[:2])


def _private(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_private or ip.is_loopback
