"""The provisioning key's secret is nowhere a job can read on an ssh pool host.

A real OpenSSH host of a pool (its own Unix user), a real S3 API (moto's server on loopback) and the real
rclone on the host: a bucket MOUNT and a managed job's jobs-bucket upload (a COPY of
`<jobs bucket>/<prefix>/<run>/workdir`) are attached with the plan the worker builds from the job's bucket
record. Then the pool user reads every readable file under its home and /tmp and every /proc/*/environ it
can open, looking for the secrets of the provisioning connection (aws_default) and of the node-data
connection the ssh nodes' credentials are minted from. The scoped session the node did get is found, which
shows the dump sees the files.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.node.client import NodeClient
from tests.local.test_node_credentials_dump import attach_and_dump
from tests.s3server import S3Server
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 1
SUBNET = 1
JOBS = "ssh-dump-jobs"  # moto keeps buckets per process: names of this file's own
DATA = "ssh-dump-data"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket=JOBS)
        server.client.create_bucket(Bucket=DATA)
        server.client.put_object(Bucket=JOBS, Key="uploads/run-7/workdir/train.py", Body=b"print('hi')\n")
        yield server


def test_no_file_env_or_process_on_a_pool_host_holds_the_provisioning_secret(
    sshd_pool: SshdPool, s3: S3Server
) -> None:
    cloud = SshCloud(POOL)
    (node,) = cloud.provision(ProvisionRequest("dump", 1))
    try:
        with NodeClient(node, cloud.key_file_for("dump", node)) as client:
            attach_and_dump(client, s3, f"ssh/{POOL}", JOBS, DATA)
    finally:
        cloud.terminate("dump")
