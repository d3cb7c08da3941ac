"""Buckets on the nodes as SkyPilot users expect (real S3 API: moto's server on loopback; real FUSE mounts
with rclone on real local nodes; real Airflow: `airflow dags test`).

A spot job checkpoints to a mounted bucket, loses its head node, and resumes on the replacement from the
last checkpoint; COPY fetches a bucket on every node with no object passing through the Airflow worker;
named buckets are created (and uploaded, and deleted when not persistent); a mount whose uploads cannot
finish fails the job naming the mount. Mounting `/checkpoint` on every node needs the nodes' own mount
namespaces: root, as the README's test command runs (`airflow_sky.infra.local.daemon.isolation`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from tests.s3server import S3Server

# Each rank trains MAX_STEPS steps and checkpoints every 5 to its own file in the mounted bucket; a rank
# that finds a checkpoint starts after it.
TRAIN = """\
python3 - <<'EOF'
import json, os, time
rank, stop = int(os.environ["SKYPILOT_NODE_RANK"]), int(os.environ["MAX_STEPS"])
path = f"/checkpoint/rank{rank}.json"
step = 0
if os.path.exists(path):
    with open(path) as f:
        step = json.load(f)["step"]
    print(f"resumed from step {step}", flush=True)
while step < stop:
    step += 1
    time.sleep(0.2)
    if step % 5 == 0 or step == stop:
        with open(path, "w") as f:
            json.dump({"step": step, "recovery": os.environ["AIRFLOW_SKY_RECOVERY_COUNT"]}, f)
        print(f"checkpoint step {step}", flush=True)
    # Generation 0's head holds at its step-10 checkpoint until it is preempted: on a loaded machine the
    # preemption could otherwise come after it finished, and the replacement would resume at step 60.
    while rank == 0 and step >= 10 and os.environ["AIRFLOW_SKY_RECOVERY_COUNT"] == "0":
        time.sleep(1)
print(f"finished at step {step}", flush=True)
EOF
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


def _env(s3: S3Server, **extra: str) -> dict[str, str]:
    # Local nodes get their bucket credentials from a node-data connection of their own (node.credentials).
    return {"AIRFLOW_CONN_AWS_DEFAULT": s3.connection, "AIRFLOW_CONN_SKY_NODES_AWS": s3.connection, **extra}


def _dag(dag_id: str, cluster: str, task: str, **job: object) -> str:
    options = "".join(f", {k}={v!r}" for k, v in job.items())
    return f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = {task}
with DAG({dag_id!r}, schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}{options})
"""


def _checkpoint_step(s3: S3Server, bucket: str, rank: int) -> int:
    try:
        body = s3.client.get_object(Bucket=bucket, Key=f"rank{rank}.json")["Body"].read()
    except s3.client.exceptions.NoSuchKey:
        return 0
    return int(json.loads(body)["step"])


@pytest.mark.parametrize("mode", ["MOUNT_CACHED", "MOUNT"])
def test_spot_job_resumes_from_its_checkpoint_bucket_after_the_head_is_preempted(run_dag, s3, mode):
    bucket, cluster = f"ckpt-{mode.lower().replace('_', '-')}", f"ckpt-{mode.lower().replace('_', '')}"
    task = (
        f"Task(name='ckpt', num_nodes=2, envs={{'MAX_STEPS': '60'}}, run={TRAIN!r}, "
        f"file_mounts={{'/checkpoint': {{'name': {bucket!r}, 'store': 's3', 'mode': {mode!r}}}}})"
    )
    preempted = threading.Event()

    def preempt_once_checkpointed() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            # The bucket (not the node) holds step 10: what the replacement can resume from.
            if s3.buckets().count(bucket) and _checkpoint_step(s3, bucket, 0) >= 10:
                LocalCloud().preempt(cluster, 0)
                preempted.set()
                return
            time.sleep(0.2)

    threading.Thread(target=preempt_once_checkpointed, daemon=True).start()
    result = run_dag("ckpt", _dag("ckpt", cluster, task), env=_env(s3))
    assert result.returncode == 0, result.digest
    assert preempted.is_set()
    assert "RECOVER: node of rank 0 lost" in result.output
    assert f"mounted s3://{bucket} on /checkpoint on rank 0 ({mode}" in result.output
    resumed = [int(step) for step in re.findall(r"rank=0[^)]*\) resumed from step (\d+)", result.output)]
    assert resumed and resumed[0] >= 10, result.digest  # the replacement head started from the bucket
    final = json.loads(s3.client.get_object(Bucket=bucket, Key="rank0.json")["Body"].read())
    assert final == {"step": 60, "recovery": "1"}
    assert _checkpoint_step(s3, bucket, 1) == 60
    assert daemon.processes_with_marker(cluster) == []  # no node, rclone included, outlives the job


def test_copy_fetches_a_bucket_on_every_node_with_no_object_through_the_worker(run_dag, s3, tmp_path):
    bucket = "copy-2000"
    s3.client.create_bucket(Bucket=bucket)
    for i in range(2000):
        s3.client.put_object(Bucket=bucket, Key=f"shard/{i // 100:02d}/obj-{i:04d}.bin", Body=b"x" * 512)
    s3.counts.reset()
    task = (
        f"Task(name='copy', num_nodes=4, envs={{'PROBE': {str(tmp_path)!r}}}, "
        "file_mounts={'~/data': 's3://copy-2000/shard'}, "
        "run='find ~/data -type f | wc -l > \"$PROBE/rank-$SKYPILOT_NODE_RANK\"')"
    )
    result = run_dag("copy", _dag("copy", "copy-c", task), env=_env(s3))
    assert result.returncode == 0, result.digest
    assert {p.name: p.read_text().strip() for p in tmp_path.iterdir()} == {
        f"rank-{r}": "2000" for r in range(4)
    }
    assert s3.counts.bytes["rclone"] == 4 * 2000 * 512  # every node fetched every object itself
    assert s3.counts.bytes["worker"] == 0 and s3.counts.gets["worker"] == 0, s3.counts.gets
    assert "copied s3://copy-2000/shard -> ~/data on rank 3 (2000 files" in result.output


def test_named_buckets_are_created_uploaded_and_deleted_when_not_persistent(run_dag, s3, tmp_path):
    source = tmp_path / "upload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "hello.txt").write_text("hello from the launcher\n")
    probe = tmp_path / "probe"
    probe.mkdir()
    run = (
        'cat ~/up/sub/hello.txt > "$PROBE/up-$SKYPILOT_NODE_RANK"; '
        'echo "scratch of $SKYPILOT_NODE_RANK" > ~/scratch/from-$SKYPILOT_NODE_RANK.txt; '
        'ls ~/empty | wc -l > "$PROBE/empty-$SKYPILOT_NODE_RANK"'
    )
    mounts = {
        "~/up": {"name": "uploaded-src", "source": str(source), "mode": "COPY"},
        "~/scratch": {"name": "scratch-tmp", "persistent": False},  # store: [sky] default_store
        "~/empty": {"name": "empty-new", "store": "s3", "mode": "MOUNT_CACHED"},
    }
    task = f"Task(name='named', num_nodes=2, envs={{'PROBE': {str(probe)!r}}}, run={run!r}, file_mounts={mounts!r})"
    result = run_dag("named", _dag("named", "named-c", task), env=_env(s3, AIRFLOW__SKY__DEFAULT_STORE="s3"))
    assert result.returncode == 0, result.digest
    assert {p.name: p.read_text() for p in probe.iterdir() if p.name.startswith("up-")} == {
        "up-0": "hello from the launcher\n",
        "up-1": "hello from the launcher\n",
    }
    assert (probe / "empty-0").read_text().strip() == "0"  # a new, empty bucket is fine
    assert s3.keys("uploaded-src") == ["sub/hello.txt"]
    assert "created bucket s3://scratch-tmp" in result.output
    assert "deleted bucket s3://scratch-tmp (persistent: false)" in result.output
    assert "scratch-tmp" not in s3.buckets() and "empty-new" in s3.buckets()


def test_a_mount_whose_uploads_cannot_finish_fails_the_job_naming_the_mount(run_dag, s3):
    # The job writes to its MOUNT_CACHED bucket, then the mount's rclone dies before the write-back: what
    # was written never reaches the bucket, and the job must not count as succeeded.
    run = (
        "echo important > /checkpoint/final.txt; "
        "pkill -KILL -f 'rclone mount sky-s3:lost-writes'; sleep 1; echo script-done"
    )
    mounts = {"/checkpoint": {"name": "lost-writes", "store": "s3", "mode": "MOUNT_CACHED"}}
    task = f"Task(name='lost', num_nodes=1, run={run!r}, file_mounts={mounts!r})"
    result = run_dag("lost", _dag("lost", "lost-c", task), env=_env(s3))
    assert result.returncode != 0
    assert "script-done" in result.output
    assert "file_mounts./checkpoint (s3://lost-writes): the mount's rclone is gone" in result.output
    assert "rank 0 failed with exit code 1" in result.output
    assert s3.keys("lost-writes") == []
    assert daemon.processes_with_marker("lost-c") == []


def test_a_bucket_given_by_uri_that_does_not_exist_fails_before_any_node_starts(run_dag, s3):
    task = "Task(name='nobucket', num_nodes=2, run='true', file_mounts={'/data': 's3://no-such-bucket/x'})"
    result = run_dag("nobucket", _dag("nobucket", "nobucket-c", task), env=_env(s3))
    assert result.returncode != 0
    assert "file_mounts./data: bucket s3://no-such-bucket does not exist" in result.output
    assert daemon.processes_with_marker("nobucket-c") == []
    assert not layout.instances_dir("nobucket-c").is_dir() or not any(
        layout.instances_dir("nobucket-c").iterdir()
    )
