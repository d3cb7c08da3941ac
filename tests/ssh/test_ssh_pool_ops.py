"""Sharing a pool, its locks, its errors and `airflow-sky ssh check`, on real OpenSSH servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV, load_pool
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 4
SUBNET = 1
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


@pytest.fixture
def cloud(sshd_pool: SshdPool) -> SshCloud:
    return SshCloud(POOL)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=300, env=env or dict(os.environ)
    )


def test_two_clusters_never_share_a_host_and_the_loser_learns_who_holds_what(
    cloud: SshCloud, sshd_pool: SshdPool
) -> None:
    first = cloud.provision(ProvisionRequest("first", 3))
    try:
        with pytest.raises(ClusterError) as raised:
            SshCloud(POOL).provision(ProvisionRequest("second", 2))
        message = str(raised.value)
        assert "not enough free hosts for cluster 'second' (1 more needed of 2)" in message
        for rank, host in enumerate(sshd_pool.hosts[:3]):
            assert f"{host.user}@{host.address}:2022: cluster 'first' (rank {rank}" in message
        assert "\n" not in message
        # The failed attempt let go of the host it had taken: the next one gets it.
        second = SshCloud(POOL).provision(ProvisionRequest("second", 1))
        assert [n.ssh_user for n in second] == [sshd_pool.hosts[3].user]
        assert {n.ssh_user for n in first}.isdisjoint(n.ssh_user for n in second)
        cloud.terminate("second")
    finally:
        cloud.terminate("first")
    assert sshd_pool.locked_hosts() == []


def test_a_stale_lock_is_broken_by_unlock_and_a_live_one_only_with_force(
    cloud: SshCloud, sshd_pool: SshdPool
) -> None:
    live = cloud.provision(ProvisionRequest("alive", 1))
    gone = cloud.provision(ProvisionRequest("gone", 1))
    cloud.state_store("gone").remove_all()  # the cluster's record is gone, its host's lock is not
    assert cloud.nodes("gone") == []
    with pytest.raises(ClusterError, match="not enough free hosts"):
        cloud.provision(ProvisionRequest("third", 3))  # the stale lock still blocks its host
    result = _cli("ssh", "unlock", POOL)
    assert result.returncode == 0, result.stderr
    assert f"Unlocked {sshd_pool.hosts[1].user}@" in result.stdout
    assert "cluster 'gone'" in result.stdout and "alive" not in result.stdout
    assert cloud.nodes("alive")[0].status is NodeStatus.RUNNING
    result = _cli("ssh", "unlock", POOL, sshd_pool.hosts[0].alias, "--force")
    assert "cluster 'alive'" in result.stdout, result.stdout
    assert cloud.nodes("alive")[0].status is NodeStatus.TERMINATED  # its lock is gone: no longer its host
    cloud.terminate("alive")
    assert live[0].ssh_user == sshd_pool.hosts[0].user and gone[0].ssh_user == sshd_pool.hosts[1].user


def test_ssh_check_shows_every_host_with_its_tools_gpus_and_holder(
    cloud: SshCloud, sshd_pool: SshdPool
) -> None:
    sshd_pool.hosts[2].add_fake_gpus("NVIDIA H100 80GB HBM3", 8)
    cloud.provision(ProvisionRequest("held", 1))
    try:
        result = _cli("ssh", "check", POOL)
    finally:
        cloud.terminate("held")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = result.stdout.splitlines()
    for host in sshd_pool.hosts:  # one row each, its host whole
        assert any(row.startswith(f"{host.index} ") and host.alias in row for row in rows), result.stdout
    assert "8x H100 80GB HBM3" in result.stdout
    assert "held (rank" in result.stdout and result.stdout.count("free") == 3
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


@pytest.fixture
def bad_pool_file(sshd_pool: SshdPool, tmp_path: Path) -> Path:
    wrong_key = tmp_path / "wrong_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(wrong_key))
    stranger = tmp_path / "ssh_config"
    stranger.write_text(sshd_pool.ssh_config.read_text())
    path = tmp_path / "pools.yaml"
    state = f"  state: {{host: {sshd_pool.state.alias}, identity_file: {sshd_pool.client_key}}}\n"
    path.write_text(
        f"wrongkey:\n  identity_file: {wrong_key}\n{state}  hosts: [{sshd_pool.hosts[0].alias}]\n"
        f"unknown:\n  identity_file: {sshd_pool.client_key}\n{state}  hosts:\n    - ip: 127.0.0.1\n"
        "      user: nobody\n"
    )
    return path


TASK = "name: t\nrun: echo hi\n"


def test_a_wrong_key_an_unknown_host_key_and_a_missing_pool_each_give_one_line(
    bad_pool_file: Path, tmp_path: Path, sshd_pool: SshdPool
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    env = dict(os.environ, **{POOL_FILE_ENV: str(bad_pool_file)})

    missing = _cli("launch", "--infra", "ssh/nope", str(task), "-y", env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0, missing.stderr
    assert (
        "ssh pool 'nope' is not defined in" in missing.stderr
        and "pools defined: unknown, wrongkey" in missing.stderr
    )

    # Through a whole launch: the provision step fails, and the CLI's last line is the driver's message.
    wrong = _cli("launch", "-c", "wk", "--infra", "ssh/wrongkey", str(task), "-y", env=env)
    assert wrong.returncode == 1
    failed = [line for line in wrong.stdout.splitlines() if line.startswith("✗ Job on wk FAILED")]
    assert failed and "the host refused the key (identity_file) for this user" in failed[0], wrong.stdout
    assert "Traceback" not in wrong.stdout + wrong.stderr

    # The same path, at the driver (what that launch's provision step raises), for an unknown host key.
    with pytest.raises(ClusterError) as raised:
        SshCloud(pool_obj=load_pool("unknown", [bad_pool_file])).provision(ProvisionRequest("uk", 1))
    message = str(raised.value)
    assert (
        "has no known host key in" in message
        and "ssh-keyscan 127.0.0.1 >>" in message
        and "\n" not in message
    )
    assert sshd_pool.locked_hosts() == []
