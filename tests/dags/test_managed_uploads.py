"""A managed job's uploaded files through the managed jobs DAG (real Airflow: `dag.test()`; real local nodes;
real S3 API: moto's server on loopback; real rclone on the nodes): every node copies the run's workdir and
file, and the run's end removes its own prefix of the jobs bucket and nothing else, even when a conf names
another one.

The files are uploaded with the client's own functions (what `jobs launch` does) under the run's id, which
`dag.test(run_after=..., logical_date=...)` makes known in advance (`manual__<run_after>`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_sky.client.jobs_bucket import JobsBucketConfig, S3Store, files_to_upload, upload
from airflow_sky.infra.local import daemon
from airflow_sky.operators.job_spec import JobSpec
from airflow_sky.task import Task
from airflow_sky.task.jobs_bucket import JobsBucket, translate_local_paths
from tests.s3server import S3Server

JOBS_BUCKET = "s3://sky-jobs-dags/uploads"  # this file's own bucket: moto shares a process's buckets
OTHER_RUN = "sky-job-20261203-000000-0ther0"  # another run's files, which must survive every run here
SOURCE = """
import json
import sys
from datetime import datetime

from airflow_sky.dags.managed import managed_jobs_dag

dag = managed_jobs_dag()

if __name__ == "__main__":
    when = datetime.fromisoformat(sys.argv[1])
    run = dag.test(run_after=when, logical_date=when, run_conf=json.loads(sys.argv[2]))
    sys.exit(0 if run.state == "success" else 1)
"""
RUN = """\
cat train.py > "$PROBE/workdir-$SKYPILOT_NODE_RANK"
cat ~/conf/settings.json > "$PROBE/settings-$SKYPILOT_NODE_RANK"
test -e debug.log && echo "debug.log came along" > "$PROBE/ignored-$SKYPILOT_NODE_RANK"
true
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket="sky-jobs-dags")
        server.client.put_object(
            Bucket="sky-jobs-dags", Key=f"uploads/{OTHER_RUN}/workdir/keep.py", Body=b"kept"
        )
        yield server


def _when(minutes: int) -> datetime:
    """A run_after of its own per test (run ids are unique in the session's Airflow database)."""
    return datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=minutes)


def _run(
    airflow_home: dict[str, str], s3: S3Server, when: datetime, conf: dict[str, object]
) -> tuple[int, str]:
    dags = Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"])
    for old in dags.glob("*.py"):
        old.unlink()
    (dags / "airflow_sky_jobs.py").write_text(SOURCE)
    env = {
        **airflow_home,
        "AIRFLOW_CONN_AWS_DEFAULT": s3.connection,
        "AIRFLOW_CONN_SKY_NODES_AWS": s3.connection,  # local nodes' bucket credentials (node.credentials)
        "AIRFLOW__SKY__JOBS_BUCKET": JOBS_BUCKET,
        "AIRFLOW__SKY__MANAGED_INFRAS": "local",  # the deployment opts in to running confs on local nodes
        "AIRFLOW__SKY__MANAGED_CLUSTER_NAMES": "mupl-c, mbad-c",  # and shares these cluster names
    }
    done = subprocess.run(
        [sys.executable, str(dags / "airflow_sky_jobs.py"), when.isoformat(), json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_managed_run_copies_its_uploads_to_every_node_and_removes_only_its_own_prefix(
    airflow_home, s3, tmp_path, monkeypatch
):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('train')\n")
    (code / ".gitignore").write_text("*.log\n")
    (code / "debug.log").write_text("stays home\n")
    (tmp_path / "settings.json").write_text('{"lr": 0.1}\n')
    probe = tmp_path / "probe"
    probe.mkdir()
    task = Task(
        name="uploaded",
        num_nodes=2,
        workdir=str(code),
        envs={"PROBE": str(probe)},
        file_mounts={"~/conf/settings.json": str(tmp_path / "settings.json")},
        run=RUN,
    )
    when = _when(0)
    run_id = f"manual__{when.isoformat()}"
    bucket = JobsBucket.parse(JOBS_BUCKET, "jobs.bucket")
    run_uri = bucket.run_uri(run_id)
    translated, uploads = translate_local_paths(task, run_uri)
    upload(S3Store(JobsBucketConfig(bucket, s3.endpoint)), files_to_upload(bucket, uploads), run_uri)
    assert len(s3.keys("sky-jobs-dags")) == 4  # train.py, .gitignore, settings.json, and the other run's
    conf = JobSpec(
        task=translated.to_dict(), secrets={}, cluster_name="mupl-c", uploads=run_uri
    ).to_run_conf()

    rc, output = _run(airflow_home, s3, when, conf)

    assert rc == 0, output[-6000:]
    for rank in (0, 1):
        assert (probe / f"workdir-{rank}").read_text() == "print('train')\n"
        assert (probe / f"settings-{rank}").read_text() == '{"lr": 0.1}\n'
        assert not (probe / f"ignored-{rank}").exists()
    assert f"removed {run_uri}/ (3 object(s))" in output
    assert s3.keys("sky-jobs-dags") == [f"uploads/{OTHER_RUN}/workdir/keep.py"]
    assert daemon.processes_with_marker("mupl-c") == []


def test_a_conf_naming_another_runs_prefix_fails_before_any_node_and_deletes_nothing(airflow_home, s3):
    task = Task(name="intruder", run="true", file_mounts={"~/x": f"{JOBS_BUCKET}/{OTHER_RUN}/workdir"})
    conf = JobSpec(
        task=task.to_dict(), secrets={}, cluster_name="mbad-c", uploads=f"{JOBS_BUCKET}/{OTHER_RUN}"
    ).to_run_conf()

    rc, output = _run(airflow_home, s3, _when(5), conf)

    assert rc != 0
    assert f"uploads: {JOBS_BUCKET}/{OTHER_RUN} is not this run's prefix" in output, output[-6000:]
    assert "starting task_id=job.provision" not in output
    assert f"uploads/{OTHER_RUN}/workdir/keep.py" in s3.keys("sky-jobs-dags")
