"""The provisioning key's secret is nowhere a job can read on a node.

Real local nodes (SSH servers in their own PID and mount namespaces as root), a real S3 API (moto's server
on loopback, which accepts STS sessions without checking them), the real rclone on the node: a bucket
MOUNT and a managed job's jobs-bucket upload (a COPY of `<jobs bucket>/<prefix>/<run>/workdir`) are
attached with the plan the worker builds from the job's bucket record. Then a process on the node reads
every readable file under its home and /tmp and every /proc/*/environ it can open, looking for the
secrets: the provisioning connection's (aws_default) and the local nodes' node-data connection's. The
credential the node did get (a scoped session token) is found, which shows the dump sees the files.
"""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Iterator

import pytest

from airflow_sky.node import buckets
from airflow_sky.node.client import NodeClient
from airflow_sky.task.storage import COPY, MOUNT, BucketMount
from tests.envs import patched_environ
from tests.s3server import S3Server

JOBS = "dump-jobs"  # moto keeps buckets per process: names of this file's own
DATA = "dump-data"
PROVISIONING_SECRET = f"provisioning-{uuid.uuid4().hex}"
NODE_DATA_SECRET = f"node-data-{uuid.uuid4().hex}"

# Reads the secrets from stdin (never a command line), prints where each one is found.
DUMP = r"""
while read -r secret; do
  [ -n "$secret" ] || continue
  find "$HOME" /tmp -xdev -type f -readable -print0 2>/dev/null \
    | xargs -0 -r grep -lsaF -- "$secret" | sed "s|^|FOUND ${secret:0:12} |"
  grep -lsaF -- "$secret" /proc/[0-9]*/environ | sed "s|^|FOUND ${secret:0:12} |"
done
echo done
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket=JOBS)
        server.client.create_bucket(Bucket=DATA)
        server.client.put_object(Bucket=JOBS, Key="uploads/run-7/workdir/train.py", Body=b"print('hi')\n")
        yield server


def _conn(s3: S3Server, secret: str) -> str:
    conn = json.loads(s3.connection)
    conn.update(login=f"AKIA{uuid.uuid4().hex[:16].upper()}", password=secret)
    return json.dumps(conn)


def attach_and_dump(client: NodeClient, s3: S3Server, infra: str, jobs: str, data: str) -> None:
    """Attach a MOUNT of `data` and a jobs-bucket COPY of `jobs` with the plan the worker builds for `infra`,
    dump what the node's user can read, and check that no connection's secret is there (the scoped
    session is, which shows the dump sees the files)."""
    mounts = [
        BucketMount("~/ckpt", "s3", data, "", MOUNT),
        BucketMount("~/sky_workdir", "s3", jobs, "uploads/run-7/workdir", COPY),  # a managed job's upload
    ]
    env = {
        "AIRFLOW_CONN_AWS_DEFAULT": _conn(s3, PROVISIONING_SECRET),
        "AIRFLOW_CONN_SKY_NODES_AWS": _conn(s3, NODE_DATA_SECRET),
    }
    with patched_environ(env):
        record = buckets.bucket_record(mounts, None, None, frozenset(), infra=infra)
        plan = buckets.plan_from_record(record)
    assert plan is not None
    token = plan.served["s3"].options["session_token"]
    lines: list[str] = []
    buckets.attach_buckets(client, plan, lines.append)
    rc, out, err = client.exec(
        f"cat ~/sky_workdir/train.py && echo x > ~/ckpt/written && ls ~/ckpt && bash -c {shlex.quote(DUMP)}",
        stdin=f"{PROVISIONING_SECRET}\n{NODE_DATA_SECRET}\n{token}\n".encode(),
        timeout=600,  # every file of the node's home and /tmp, on a machine that may be busy
    )
    assert rc == 0, err.decode()
    found = out.decode()
    buckets.detach_buckets(client, lines.append)
    assert "print('hi')" in found and "written" in found  # the jobs-bucket COPY and the MOUNT both work
    assert found.rstrip().endswith("done")
    assert f"FOUND {token[:12]}" in found and "creds/" in found  # the dump sees the node's files
    assert f"FOUND {PROVISIONING_SECRET[:12]}" not in found, found
    assert f"FOUND {NODE_DATA_SECRET[:12]}" not in found, found


@pytest.mark.parametrize("infra", ["local", "aws/us-east-1"])
def test_no_file_env_or_process_on_a_node_holds_the_provisioning_secret(local_cluster, s3, infra) -> None:
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        attach_and_dump(client, s3, infra, JOBS, DATA)
