"""The ssh infra's pool as one driver sees it: the pool (from its file or connection), each host's pinned
key (never trusted on first use), one kept-open connection per host, and the host reads that may fail."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import paramiko

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra.base import Endpoint, NodeStatus
from airflow_sky.infra.home import user_known_hosts
from airflow_sky.infra.ssh import hosts
from airflow_sky.infra.ssh.pools import Pool, PoolHost, load_pool
from airflow_sky.node.client import NodeClient

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
                endpoint = Endpoint(host.address, host.port, host.user, host.address)
                node = endpoint.node(host.index, host.label, NodeStatus.RUNNING, 0, self._pinned_key(host))
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
