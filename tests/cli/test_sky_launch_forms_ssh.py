"""`airflow-sky launch -c C 'echo hi'` on an ssh pool of real OpenSSH servers (the real CLI, a real DAG run):
a command as the task, as `sky launch` takes it; `--ports` there is recorded and said to open nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ssh.conftest import POOL, sshd_pool  # noqa: F401 - the module's pool of sshd hosts
from tests.ssh.sshd import SshdPool

POOL_SIZE = 2
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


@pytest.fixture(scope="module")
def cli_env(sshd_pool: SshdPool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # noqa: F811
    env = dict(os.environ)  # the pool's ssh config, known_hosts and pool file (set by sshd_pool)
    env.pop("AIRFLOW_HOME", None)
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("forms-ssh-airflow"))
    home = tmp_path_factory.mktemp("forms-ssh-home")
    env["AIRFLOW_SKY_HOME"] = str(home)
    return env


def test_launch_runs_a_command_on_an_ssh_pool_and_says_the_ports_open_nothing(
    sshd_pool: SshdPool,  # noqa: F811
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    flags = ["--infra", f"ssh/{POOL}", "-y", "--down", "--ports", "8080", "--num-nodes", "2"]
    result = subprocess.run(
        [*CLI, "launch", "-c", "sshcmd", *flags, 'echo "hi from rank $SKYPILOT_NODE_RANK as $(whoami)"'],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank, host in enumerate(sshd_pool.hosts[:2]):
        assert f"hi from rank {rank} as {host.user}" in result.stdout, result.stdout
    assert "resources.ports 8080: listed by `status --endpoints`; on ssh/test-pool nothing is opened" in (
        result.stderr
    )
    assert sshd_pool.locked_hosts() == []  # --down released the hosts
    assert sshd_pool.leftover_processes() == []
