"""A pool of warm workers on an ssh node pool of real OpenSSH servers: `jobs pool apply` holds two workers of
two hosts each (set up once), a 3-trial sweep runs on them under `airflow dags test` (each trial on the
hosts of the worker it got, the pool's setup never again), and `jobs pool down` frees every host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_sky.infra.home import KNOWN_HOSTS_ENV, SSH_CONFIG_ENV
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 4
SUBNET = 3
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
WORKERS = "sshwork"

SWEEP_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_sweep

with DAG("ssh_sweep", schedule=None) as dag:
    trial = Task(name="trial", num_nodes=2, run={run!r})
    sky_sweep(trial, params=[{{"LR": "1"}}, {{"LR": "2"}}, {{"LR": "3"}}], pool={pool!r}, infra={infra!r}, max_parallel=2)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=dict(os.environ))


def test_a_sweep_runs_on_ssh_pool_workers_set_up_once_and_down_frees_every_host(
    sshd_pool: SshdPool, run_dag, tmp_path: Path
) -> None:
    (tmp_path / "pool.yaml").write_text(
        f"pool:\n  workers: 2\nnum_nodes: 2\nresources:\n  infra: ssh/{POOL}\n"
        'setup: echo "setup $(whoami)" >> ~/pool-setups\n'
    )
    run = 'echo "$SKYPILOT_JOB_RANK $SKYPILOT_NODE_RANK $(whoami)" >> ~/trials'
    try:
        applied = _cli("jobs", "pool", "apply", "-p", WORKERS, str(tmp_path / "pool.yaml"), "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert len(sshd_pool.locked_hosts()) == 4  # two workers of two hosts, held by the pool
        # The module's pool file, ssh config and known hosts (the DAG test's environment predates them).
        env = {k: os.environ[k] for k in (POOL_FILE_ENV, SSH_CONFIG_ENV, KNOWN_HOSTS_ENV)}
        result = run_dag(
            "ssh_sweep", SWEEP_DAG.format(run=run, pool=WORKERS, infra=f"ssh/{POOL}"), timeout=600, env=env
        )
        assert result.returncode == 0, result.digest
        setups = [h for h in sshd_pool.hosts if (h.home / "pool-setups").exists()]
        assert len(setups) == 4 and all(
            len((h.home / "pool-setups").read_text().splitlines()) == 1 for h in setups
        )
        lines = sorted(
            line.split()
            for h in sshd_pool.hosts
            if (h.home / "trials").exists()
            for line in (h.home / "trials").read_text().splitlines()
        )
        assert sorted((trial, node) for trial, node, _ in lines) == [
            (str(t), str(n)) for t in range(3) for n in range(2)
        ]
        for trial in "012":  # a trial's two ranks ran on two different hosts of its worker
            assert len({user for t, _, user in lines if t == trial}) == 2, lines
        assert len(sshd_pool.locked_hosts()) == 4  # the workers stay up between sweeps
    finally:
        down = _cli("jobs", "pool", "down", WORKERS, "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert sshd_pool.locked_hosts() == []
