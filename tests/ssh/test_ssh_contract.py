"""The Cloud contract run against the ssh infra, on real OpenSSH servers."""

from __future__ import annotations

import pytest

from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.infra.ssh.pools import parse_pool
from airflow_sky.infra.ssh.state_store import STATE_ROOT
from tests.infra.contract import CloudContract
from tests.ssh.conftest import POOL
from tests.ssh.sshd import PORT, SshdPool

POOL_SIZE = 4


class TestSshCloud(CloudContract):
    @pytest.fixture(autouse=True)
    def _pool(self, sshd_pool: SshdPool) -> None:
        self.sshd = sshd_pool

    @pytest.fixture
    def cloud(self) -> SshCloud:
        return SshCloud(POOL)

    @pytest.fixture
    def failing_cloud(self, sshd_pool: SshdPool) -> SshCloud:
        """Two answering hosts and a third whose machine is off: provisioning 3 nodes fails after locking two."""
        dead = "127.0.0.254"
        with open(sshd_pool.known_hosts, "a") as f:
            f.write(f"[{dead}]:{PORT} {sshd_pool.hosts[0].public_host_key()}\n")
        raw = {
            "identity_file": str(sshd_pool.client_key),
            "hosts": [sshd_pool.hosts[0].alias, sshd_pool.hosts[1].alias, {"ip": dead}],
            "state": {"host": sshd_pool.state.alias},
        }
        return SshCloud(pool_obj=parse_pool(POOL, raw, "test", default_port=PORT))

    def leftovers(self, cluster_name: str) -> list[object]:
        found: list[object] = []
        found.extend(lock for lock in self.sshd.locks() if lock["cluster"] == cluster_name)
        for host in self.sshd.hosts:
            jobs = host.home / ".airflow_sky" / "jobs"
            if jobs.exists():
                found.append(jobs)
        state = self.sshd.state.home / STATE_ROOT / POOL / cluster_name
        if state.exists():
            found.append(state)
        return found
