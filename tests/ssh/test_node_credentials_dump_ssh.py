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

import shlex
from collections.abc import Iterator

import pytest

from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.node import buckets
from airflow_sky.node.client import NodeClient
from airflow_sky.task.storage import COPY, MOUNT, BucketMount
from tests.envs import patched_environ
from tests.local.test_node_credentials_dump import DUMP, NODE_DATA_SECRET, PROVISIONING_SECRET, _conn
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
    mounts = [
        BucketMount("~/ckpt", "s3", DATA, "", MOUNT),
        BucketMount("~/sky_workdir", "s3", JOBS, "uploads/run-7/workdir", COPY),  # a managed job's upload
    ]
    env = {
        "AIRFLOW_CONN_AWS_DEFAULT": _conn(s3, PROVISIONING_SECRET),
        "AIRFLOW_CONN_SKY_NODES_AWS": _conn(s3, NODE_DATA_SECRET),
    }
    try:
        with patched_environ(env):
            record = buckets.bucket_record(mounts, None, None, frozenset(), infra=f"ssh/{POOL}")
            plan = buckets.plan_from_record(record)
        assert plan is not None
        token = plan.served["s3"].options["session_token"]
        lines: list[str] = []
        with NodeClient(node, cloud.key_file_for("dump", node)) as client:
            buckets.attach_buckets(client, plan, lines.append)
            rc, out, err = client.exec(
                f"cat ~/sky_workdir/train.py && echo x > ~/ckpt/written && ls ~/ckpt && bash -c {shlex.quote(DUMP)}",
                stdin=f"{PROVISIONING_SECRET}\n{NODE_DATA_SECRET}\n{token}\n".encode(),
                timeout=600,  # every file of the user's home and /tmp, on a machine that may be busy
            )
            assert rc == 0, err.decode()
            found = out.decode()
            buckets.detach_buckets(client, lines.append)
    finally:
        cloud.terminate("dump")
    assert "print('hi')" in found and "written" in found  # the jobs-bucket COPY and the MOUNT both work
    assert found.rstrip().endswith("done")
    assert f"FOUND {token[:12]}" in found and "creds/" in found  # the dump sees the node's files
    assert f"FOUND {PROVISIONING_SECRET[:12]}" not in found, found
    assert f"FOUND {NODE_DATA_SECRET[:12]}" not in found, found
