"""XCom handoff: the head's return.json and the run's artifacts reach a downstream task (moto S3, local dir)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

RUN = """\
echo "weights of rank $SKYPILOT_NODE_RANK" > model.bin
printf '{"final_loss": 0.%s, "rank": %s}' "$SKYPILOT_NODE_RANK" "$SKYPILOT_NODE_RANK" > "$AIRFLOW_SKY_XCOM_DIR/return.json"
"""


def _serve(argv: list[str], port: int) -> Iterator[str]:
    """Run an emulator on 127.0.0.1:port until the fixture ends; yields its endpoint."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    """A real S3 API (moto in server mode) on a free loopback port."""
    port = _free_port()
    yield from _serve(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port
    )


def _s3(endpoint: str) -> object:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def _dag(cluster: str, probe: Path, artifacts_to: str, artifacts_from: str = "head") -> str:
    return f"""
from airflow.sdk import DAG, task
from airflow_sky import Task, job_result, sky_job

sky_task = Task(name="art", num_nodes=2, run={RUN!r})
with DAG("artifacts", schedule=None) as dag:
    group = sky_job(
        sky_task,
        cluster_name={cluster!r},
        artifacts=["~/sky_workdir/model.bin"],
        artifacts_to={artifacts_to!r},
        artifacts_from={artifacts_from!r},
    )

    @task
    def evaluate(result, ti=None):
        uploaded = ti.xcom_pull(task_ids="art.collect", key="artifacts")
        ranks = ti.xcom_pull(task_ids="art.collect", key="ranks")
        open({str(probe)!r}, "w").write(__import__("json").dumps({{"result": result, "artifacts": uploaded, "ranks": ranks}}))

    evaluate(job_result(group))
"""


def test_evaluate_gets_head_result_and_s3_artifact_uri(run_dag, moto_s3, tmp_path):
    _s3(moto_s3).create_bucket(Bucket="runs")  # type: ignore[attr-defined]
    connection = json.dumps(
        {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"endpoint_url": moto_s3, "region_name": "us-east-1"},
        }
    )
    probe = tmp_path / "evaluated.json"
    result = run_dag(
        "artifacts",
        _dag("art-s3", probe, "s3://runs/{{ dag.dag_id }}/{{ ds }}/"),
        env={"AIRFLOW_CONN_AWS_DEFAULT": connection},
    )
    assert result.returncode == 0, result.digest
    seen = json.loads(probe.read_text())
    assert seen["result"] == {"final_loss": 0.0, "rank": 0}
    assert [r["rank"] for r in seen["ranks"]] == [0, 1]
    uri = seen["artifacts"]["~/sky_workdir/model.bin"]
    assert uri.startswith("s3://runs/artifacts/") and uri.endswith("/model.bin")
    key = uri.removeprefix("s3://runs/")
    body = _s3(moto_s3).get_object(Bucket="runs", Key=key)["Body"].read()  # type: ignore[attr-defined]
    assert body == b"weights of rank 0\n"


def test_artifacts_from_every_rank_land_in_a_local_directory(run_dag, tmp_path):
    probe = tmp_path / "evaluated.json"
    out = tmp_path / "out"
    result = run_dag("artifacts", _dag("art-local", probe, str(out), artifacts_from="all"))
    assert result.returncode == 0, result.digest
    assert (out / "rank-0" / "model.bin").read_text() == "weights of rank 0\n"
    assert (out / "rank-1" / "model.bin").read_text() == "weights of rank 1\n"
    seen = json.loads(probe.read_text())
    assert seen["artifacts"] == {
        "rank0:~/sky_workdir/model.bin": str(out / "rank-0" / "model.bin"),
        "rank1:~/sky_workdir/model.bin": str(out / "rank-1" / "model.bin"),
    }


def test_s3_file_mount_is_on_every_node_before_setup(run_dag, moto_s3, tmp_path):
    s3 = _s3(moto_s3)
    s3.create_bucket(Bucket="inputs")  # type: ignore[attr-defined]
    s3.put_object(Bucket="inputs", Key="ds/train.txt", Body=b"training data\n")  # type: ignore[attr-defined]
    s3.put_object(Bucket="inputs", Key="ds/sub/labels.txt", Body=b"labels\n")  # type: ignore[attr-defined]
    connection = json.dumps(
        {"conn_type": "aws", "login": "testing", "password": "testing", "extra": {"endpoint_url": moto_s3}}
    )
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name="mounted",
    num_nodes=2,
    file_mounts={{"~/data": "s3://inputs/ds/", "~/one.txt": {{"source": "s3://inputs/ds/train.txt", "mode": "COPY"}}}},
    envs={{"PROBE": {str(tmp_path)!r}}},
    setup='cat ~/data/train.txt ~/data/sub/labels.txt ~/one.txt > "$PROBE/setup-$SKYPILOT_SETUP_NODE_RANK"',
    run="true",
)
with DAG("mounted", schedule=None) as dag:
    sky_job(task, cluster_name="mounted-c")
"""
    # Local nodes get their bucket credentials from a node-data connection of their own (node.credentials).
    env = {"AIRFLOW_CONN_AWS_DEFAULT": connection, "AIRFLOW_CONN_SKY_NODES_AWS": connection}
    result = run_dag("mounted", source, env=env)
    assert result.returncode == 0, result.digest
    for rank in (0, 1):
        assert (tmp_path / f"setup-{rank}").read_text() == "training data\nlabels\ntraining data\n"


@pytest.fixture(scope="module")
def gcs_emulator() -> Iterator[str]:
    """A real GCS JSON API (gcp-storage-emulator, in memory) on a free loopback port."""
    port = _free_port()
    binary = str(Path(sys.executable).parent / "gcp-storage-emulator")
    yield from _serve([binary, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"], port)


def test_gcs_file_mount_and_artifacts_through_object_storage(run_dag, gcs_emulator, tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    client = storage.Client(credentials=AnonymousCredentials(), project="test")
    client.create_bucket("gdata")
    client.bucket("gdata").blob("in/input.txt").upload_from_string(b"from gcs\n")
    probe = tmp_path / "evaluated.json"
    source = f"""
from airflow.sdk import DAG, task
from airflow_sky import Task, job_result, sky_job

sky_task = Task(
    name="gart",
    num_nodes=2,
    envs={{"PROBE": {str(tmp_path)!r}}},
    file_mounts={{"~/in": "gs://gdata/in/"}},
    setup='cp ~/in/input.txt "$PROBE/seen-$SKYPILOT_SETUP_NODE_RANK"',
    run={RUN!r},
)
with DAG("gcs_artifacts", schedule=None) as dag:
    group = sky_job(sky_task, cluster_name="gart-c", artifacts=["~/sky_workdir/model.bin"], artifacts_to="gs://gdata/runs/{{{{ ds }}}}/")

    @task
    def evaluate(result, ti=None):
        uploaded = ti.xcom_pull(task_ids="gart.collect", key="artifacts")
        open({str(probe)!r}, "w").write(__import__("json").dumps({{"result": result, "artifacts": uploaded}}))

    evaluate(job_result(group))
"""
    connection = json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "test"}}
    )
    result = run_dag(
        "gcs_artifacts",
        source,
        env={
            "STORAGE_EMULATOR_HOST": gcs_emulator,
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": connection,
            "AIRFLOW_CONN_SKY_NODES_GCP": connection,  # local nodes' bucket credentials: never the default's
            # The emulator has no gRPC storage-control API: gcsfs would wait 60 s per bucket to learn that.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        },
    )
    assert result.returncode == 0, result.digest
    for rank in (0, 1):
        assert (tmp_path / f"seen-{rank}").read_text() == "from gcs\n"
    seen = json.loads(probe.read_text())
    uri = seen["artifacts"]["~/sky_workdir/model.bin"]
    assert uri.startswith("gs://gdata/runs/") and seen["result"]["rank"] == 0
    blob = client.bucket("gdata").blob(uri.removeprefix("gs://gdata/"))
    assert blob.download_as_bytes() == b"weights of rank 0\n"
