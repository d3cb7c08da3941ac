"""Whole jobs on an ssh pool of real OpenSSH servers, through `airflow-sky launch` (a real DAG run).

Five hosts, each its own sshd on its own loopback address and its own Unix user and home. The CI machine
has no GPU: a fake `nvidia-smi` on the last host's PATH stands in for two L4s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.task import Resources
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 5
SUBNET = 0
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]

ENV_DUMP = """python3 -c 'import json, os; json.dump({k: v for k, v in os.environ.items() if k.startswith("SKYPILOT") or k in ("PYTHONUNBUFFERED", "GREETING", "HOME")} | {"cwd": os.getcwd()}, open(os.path.expanduser("~/%s.json"), "w"))'"""


@pytest.fixture(scope="module")
def pool(sshd_pool: SshdPool, tmp_path_factory: pytest.TempPathFactory) -> SshdPool:
    """The module's hosts; the last one has two (fake) L4 GPUs; pool `three` holds the first three only."""
    sshd_pool.hosts[-1].add_fake_gpus("NVIDIA L4", 2)
    pool_file = Path(os.environ["AIRFLOW_SKY_SSH_NODE_POOLS"])
    pool_file.write_text(sshd_pool.pool_yaml(POOL) + sshd_pool.pool_yaml("three", sshd_pool.hosts[:3]))
    os.environ["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("ssh-cli-airflow"))
    return sshd_pool


@pytest.fixture(autouse=True)
def _no_lock_outlives_a_test(pool: SshdPool) -> Iterator[None]:
    """Each test asserts its own clean-up; a lock one left behind is freed here so that the next test
    does not fail for it too."""
    yield
    if pool.locked_hosts():
        for name in (POOL, "three"):
            SshCloud(name).unlock(force=True)


def _launch(
    task_file: Path, cluster: str, *extra: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "launch", "-c", cluster, str(task_file), "-y", "--down", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


def _teardown_warnings(result: subprocess.CompletedProcess[str] | None) -> str:
    """The launch log's warnings about hosts its teardown could not free (why a host stayed locked)."""
    if result is None or "Airflow log of this launch: " not in result.stdout:
        return ""
    path = Path(result.stdout.rpartition("Airflow log of this launch: ")[2].split()[0])
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(line for line in lines if "stays held" in line or "did not answer" in line)


def _assert_hosts_clean(pool: SshdPool, result: subprocess.CompletedProcess[str] | None = None) -> None:
    assert pool.locked_hosts() == [], _teardown_warnings(result)
    for host in pool.hosts:
        assert not (host.home / ".airflow_sky" / "jobs").exists(), f"{host.alias} kept job dirs"
    assert pool.leftover_processes() == []


def test_a_three_node_job_gets_every_skypilot_variable(pool: SshdPool, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "data.txt").write_text("synced\n")
    task = tmp_path / "task.yaml"
    task.write_text(
        f"""\
name: envcheck
num_nodes: 3
workdir: {workdir}
envs:
  GREETING: hello pool
setup: |
  {ENV_DUMP % "setup_env"}
run: |
  {ENV_DUMP % "run_env"}
  echo "rank $SKYPILOT_NODE_RANK says $(cat data.txt) as $(whoami)"
"""
    )
    result = _launch(task, "envs", "--infra", f"ssh/{POOL}")
    assert result.returncode == 0, result.stdout + result.stderr
    hosts = pool.hosts[:3]
    ips = [h.address for h in hosts]
    for rank, host in enumerate(hosts):
        run = json.loads((host.home / "run_env.json").read_text())
        setup = json.loads((host.home / "setup_env.json").read_text())
        assert run["SKYPILOT_NODE_RANK"] == str(rank)
        assert run["SKYPILOT_NODE_IPS"] == "\n".join(ips)
        assert run["SKYPILOT_NUM_NODES"] == "3"
        assert run["SKYPILOT_NUM_GPUS_PER_NODE"] == "0"
        assert run["SKYPILOT_TASK_ID"].startswith("sky-") and run["SKYPILOT_TASK_ID"].endswith("_envs_1")
        assert json.loads(run["SKYPILOT_CLUSTER_INFO"]) == {
            "cluster_name": "envs",
            "cloud": "ssh",
            "region": POOL,
            "zone": None,
        }
        assert run["GREETING"] == "hello pool" and run["PYTHONUNBUFFERED"] == "1"
        assert run["HOME"] == str(host.home) and run["cwd"] == str(host.home / "sky_workdir")
        assert setup["SKYPILOT_SETUP_NODE_RANK"] == str(rank)
        assert setup["SKYPILOT_SETUP_NODE_IPS"] == "\n".join(ips)
        assert setup["SKYPILOT_SETUP_NUM_GPUS_PER_NODE"] == "0"
        assert setup["SKYPILOT_TASK_ID"] == run["SKYPILOT_TASK_ID"]
        prefix = "(head, rank=0" if rank == 0 else f"(worker{rank}, rank={rank}"
        assert f"rank {rank} says synced as {host.user}" in result.stdout
        assert any(line.startswith(prefix) and "says synced" in line for line in result.stdout.splitlines())
    _assert_hosts_clean(pool, result)


def test_fail_fast_kills_the_other_hosts_and_names_the_failing_rank(pool: SshdPool, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        """\
name: failfast
num_nodes: 3
run: |
  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then sleep 2; exit 7; fi
  sleep 300
"""
    )
    started = time.monotonic()
    result = _launch(task, "ff", "--infra", f"ssh/{POOL}")
    assert result.returncode != 0
    assert "rank 1 failed with exit code 7; killed the processes on the other nodes" in result.stdout, (
        result.stdout
    )
    assert "run exit codes: rank 0: 137, rank 1: 7, rank 2: 137" in result.stdout, result.stdout
    assert time.monotonic() - started < 200  # the sleeping ranks were killed, not waited for
    _assert_hosts_clean(pool, result)


def _kill_when_started(host_marker: Path, kill: object) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 120
        while not host_marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        kill()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


RECOVERING = """\
name: recovering
num_nodes: 3
run: |
  echo "generation $AIRFLOW_SKY_RECOVERY_COUNT rank $SKYPILOT_NODE_RANK on $(whoami)"
  touch ~/started
  sleep 6
  echo "done rank $SKYPILOT_NODE_RANK"
"""


def test_a_killed_host_is_replaced_by_a_free_one_and_the_job_succeeds(pool: SshdPool, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(RECOVERING)
    lost, spare = pool.hosts[1], pool.hosts[3]
    killer = _kill_when_started(lost.home / "started", lost.kill)
    try:
        result = _launch(task, "rec", "--infra", f"ssh/{POOL}")
    finally:
        killer.join(timeout=5)
        lost.start()  # the machine comes back; it still holds the lock of the cluster that is gone
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"generation 1 rank 1 on {spare.user}" in result.stdout, result.stdout
    assert "done rank 1" in result.stdout
    assert [lock["cluster"] for lock in pool.locks()] == ["rec"]  # the lost host's, kept
    unlock = subprocess.run(
        [*CLI, "ssh", "unlock", POOL], capture_output=True, text=True, env=dict(os.environ)
    )
    assert unlock.returncode == 0 and f"Unlocked {lost.user}@" in unlock.stdout, unlock.stdout + unlock.stderr
    assert pool.locked_hosts() == []
    assert pool.leftover_processes() == []


def test_without_a_free_host_the_job_fails_naming_the_lost_one(pool: SshdPool, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(RECOVERING)
    lost = pool.hosts[2]
    (lost.home / "started").unlink(missing_ok=True)
    killer = _kill_when_started(lost.home / "started", lost.kill)
    try:
        result = _launch(task, "norec", "--infra", "ssh/three")
    finally:
        killer.join(timeout=5)
        lost.start()
    assert result.returncode != 0
    assert (
        f"host {lost.user}@{lost.address}:2022 (rank 2 of cluster 'norec') is lost and the pool has no free "
        "host to replace it" in result.stdout
    ), result.stdout
    assert pool.leftover_processes() == []
    subprocess.run(
        [*CLI, "ssh", "unlock", "three"], capture_output=True, text=True, env=dict(os.environ), check=True
    )


def test_a_gpu_task_lands_on_the_host_with_the_gpus(pool: SshdPool, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        """\
name: gpu
resources:
  accelerators: L4:2
run: echo "gpus=$SKYPILOT_NUM_GPUS_PER_NODE on $(whoami)"
"""
    )
    result = _launch(task, "gpu", "--infra", f"ssh/{POOL}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"gpus=2 on {pool.hosts[-1].user}" in result.stdout

    # The launch's provision step fails with the driver's message (the CLI prints it as the job's end).
    with pytest.raises(ClusterError) as raised:
        SshCloud(POOL).provision(ProvisionRequest("nogpu", 1, Resources(accelerators="A100:1")))
    message = str(raised.value)
    assert "no host has A100:1" in message and "2x NVIDIA L4" in message and "\n" not in message
    _assert_hosts_clean(pool)
