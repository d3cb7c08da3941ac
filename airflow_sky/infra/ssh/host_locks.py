"""Who holds each host of an ssh pool: one record per host on the pool's state host, never on the host.

A lock kept in the host's own login home (as before) is a file any job running there can delete or forge:
the host then looks free while that job still runs on it, and the next cluster's env file, secrets and
tokens land beside it. The state host runs no jobs, so only workers write these records, by the state
store's compare-and-swap: exactly one cluster wins a host, and a release removes only its own allocation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from airflow_sky.errors import ClusterError
from airflow_sky.infra.ssh.hosts import HostLock
from airflow_sky.infra.ssh.pools import PoolHost
from airflow_sky.infra.ssh.state_store import SshStateStore

_ATTEMPTS = 50  # compare-and-swap rounds before giving up (concurrent writers of one host's record)


class HostLocks:
    """The host records in `~/.airflow_sky/host-locks/` on the state host: one per `user@address:port`,
    shared by every pool kept there (pools that list the same machine must name the same state host)."""

    def __init__(self, store: SshStateStore) -> None:
        self._store = store

    @staticmethod
    def key(host: PoolHost) -> str:
        """The record's key: a digest of `user@address:port` (labels hold characters a key may not)."""
        return hashlib.sha256(host.label.encode()).hexdigest()[:40]

    def read(self, host: PoolHost) -> HostLock | None:
        """The lock on `host`, or None when it is free."""
        record = self._store.get(self.key(host))
        return HostLock.from_dict(record.data) if record is not None else None

    def read_all(self, hosts: Sequence[PoolHost]) -> dict[str, HostLock]:
        """Label -> lock of every held host among `hosts` (one connection, one read each)."""
        found = {}
        for host in hosts:
            lock = self.read(host)
            if lock is not None:
                found[host.label] = lock
        return found

    def acquire(self, host: PoolHost, lock: HostLock) -> HostLock | None:
        """Take `host` for `lock`; None on success, else the current holder."""
        for _ in range(_ATTEMPTS):
            record = self._store.get(self.key(host))
            holder = HostLock.from_dict(record.data) if record is not None else None
            if holder is not None:
                return holder
            data = {**lock.to_dict(), "host": host.label}
            if self._store.put(self.key(host), data, record.version if record else None) is not None:
                return None
        raise ClusterError(f"host {host.label}: could not take its lock (too many concurrent writers)")

    def release(self, host: PoolHost, token: str) -> bool:
        """Free `host` if it is still held by allocation `token` (never another cluster's); True if freed."""
        for _ in range(_ATTEMPTS):
            record = self._store.get(self.key(host))
            holder = HostLock.from_dict(record.data) if record is not None else None
            if record is None or holder is None or holder.token != token:
                return False
            if self._store.put(self.key(host), {}, record.version) is not None:
                return True
        raise ClusterError(f"host {host.label}: could not release its lock (too many concurrent writers)")
