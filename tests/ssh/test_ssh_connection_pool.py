"""A pool kept in an Airflow connection (type sky_ssh_pool): `airflow dags test` with no pool file anywhere.

Celery and Kubernetes workers have no ~/.sky on disk: the hosts, the key (a secret) and the pinned host keys
come from the connection, here given as an AIRFLOW_CONN_ environment variable as a secrets backend would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from airflow_sky.infra.home import KNOWN_HOSTS_ENV, SSH_CONFIG_ENV
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
from tests.dags.conftest import DagRunResult
from tests.ssh.sshd import PORT, SshdPool

POOL_SIZE = 2
SUBNET = 2


def test_a_connection_pool_runs_a_job_with_no_pool_file_on_the_worker(
    sshd_pool: SshdPool, run_dag: Callable[..., DagRunResult], tmp_path: Path
) -> None:
    connection = {
        "conn_type": "sky_ssh_pool",
        "port": PORT,
        "extra": {
            "hosts": [{"ip": h.address, "user": h.user} for h in sshd_pool.hosts],
            "private_key": sshd_pool.client_key.read_text(),
            "known_hosts": sshd_pool.known_hosts.read_text(),
            "state": sshd_pool.state_connection_field(),
        },
    }
    empty = tmp_path / "empty"
    empty.write_text("")
    env = {
        "AIRFLOW_CONN_GPU_BOXES": json.dumps(connection),
        POOL_FILE_ENV: str(tmp_path / "no-such-pool-file.yaml"),
        KNOWN_HOSTS_ENV: str(empty),  # every host key comes from the connection
        SSH_CONFIG_ENV: str(empty),
    }
    result = run_dag(
        "conn_pool",
        """
        from airflow.sdk import DAG
        from airflow_sky import Task, sky_job

        task = Task(name="conn", num_nodes=2, run='echo "rank $SKYPILOT_NODE_RANK on $(whoami) of $SKYPILOT_NUM_NODES"')
        with DAG("conn_pool", schedule=None) as dag:
            sky_job(task, cluster_name="conn", infra="ssh/boxes", conn_id="gpu_boxes", down=True)
        """,
        env=env,
    )
    assert result.returncode == 0, result.digest
    for rank, host in enumerate(sshd_pool.hosts):
        assert f"rank {rank} on {host.user} of 2" in result.output
    assert "BEGIN OPENSSH PRIVATE KEY" not in result.output  # the key never reaches a log
    assert sshd_pool.locked_hosts() == []
