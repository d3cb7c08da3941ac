"""Fixtures for the ssh infra: a pool of real OpenSSH servers per test module (see sshd.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_sky.infra.home import KNOWN_HOSTS_ENV, SSH_CONFIG_ENV
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.envs import patched_environ
from tests.ssh.sshd import SshdPool

POOL = "test-pool"


@pytest.fixture(scope="module")
def sshd_pool(request: pytest.FixtureRequest) -> Iterator[SshdPool]:
    """The module's hosts (POOL_SIZE, default 4), defined as pool `test-pool` in a pool file.

    The user's ssh config, known_hosts and pool file point into the pool's temp dir while the module runs.
    """
    size = getattr(request.module, "POOL_SIZE", 4)
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:6]
    pool = SshdPool(size, prefix, getattr(request.module, "SUBNET", 0)).start()
    pool_file = pool.root / "ssh_node_pools.yaml"
    pool_file.write_text(pool.pool_yaml(POOL))
    env = {
        SSH_CONFIG_ENV: str(pool.ssh_config),
        KNOWN_HOSTS_ENV: str(pool.known_hosts),
        POOL_FILE_ENV: str(pool_file),
    }
    try:
        with patched_environ(env):
            yield pool
    finally:
        leftovers = pool.leftover_processes()
        pool.stop()
    assert leftovers == [], f"processes left on the pool's hosts: {leftovers}"
