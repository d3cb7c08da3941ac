"""`jobs launch` with a jobs bucket (client.jobs_bucket): the local workdir and file_mounts uploaded from this
machine to a real S3 API (moto's server on loopback), the task rewritten to copy them, and what a node's
rclone then makes of those objects (the node's own bucket shell, run in a local bash with the real rclone).
The Airflow API is a recording stand-in: what reaches it is the point, not its answers."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import ApiConfig, ApiError
from airflow_sky.client.cli.managed_jobs import UploadProgressBar
from airflow_sky.client.jobs_bucket import jobs_bucket_config
from airflow_sky.errors import SkyError, SpecError
from airflow_sky.node import rclone
from airflow_sky.operators.job_spec import JobSpec, secret_owner, secret_variable_key
from airflow_sky.task import Task
from airflow_sky.task.storage import bucket_mounts
from tests.s3server import S3Server

BUCKET = "sky-jobs"


class RecordingApi:
    """Stands in for AirflowApi: records every request; `refuse` makes the DAG-run POST fail."""

    def __init__(self, refuse: bool = False) -> None:
        self.config = ApiConfig("http://airflow.invalid")
        self.requests: list[tuple[str, str, Any]] = []
        self.refuse = refuse

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append((method, path, kwargs.get("json")))
        if self.refuse and path.endswith("/dagRuns"):
            raise ApiError(f"{method} {path}: 403 Forbidden", 403)
        return None

    def get(self, path: str, **params: Any) -> Any:
        if path == "/dags/airflow_sky_jobs":  # launch's check that the DAG is there and unpaused
            return {"dag_id": "airflow_sky_jobs", "is_paused": False, "is_stale": False}
        if path == "/dags/airflow_sky_jobs/dagRuns":  # the newest job id: none yet
            return {"dag_runs": []}
        raise AssertionError(f"unexpected GET {path}")

    @property
    def conf(self) -> dict[str, Any]:
        (body,) = [json for method, path, json in self.requests if path.endswith("/dagRuns")]
        return dict(body["conf"])


class Recorder:
    """An UploadProgress that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def started(self, uri: str, files: int, size: int) -> None:
        self.events.append(("started", (uri, files, size)))

    def advanced(self, files: int, size: int) -> None:
        self.events.append(("advanced", (files, size)))

    def finished(self, seconds: float) -> None:
        self.events.append(("finished", seconds))


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket=BUCKET)
        server.client.create_bucket(Bucket="inputs")
        yield server


@pytest.fixture
def jobs_env(monkeypatch, tmp_path, s3):
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_SKY_JOBS_BUCKET", f"s3://{BUCKET}/uploads/")
    monkeypatch.setenv("AIRFLOW_SKY_JOBS_ENDPOINT_URL", s3.endpoint)
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


def _project(root: Path) -> Path:
    """A workdir with an ignored file, a single file to mount and a directory to mount."""
    code = root / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('training')\n")
    (code / "pkg" / "model.py").write_text("WEIGHTS = 3\n")
    (code / ".gitignore").write_text("*.log\n")
    (code / "debug.log").write_text("not uploaded\n")
    (root / "settings.json").write_text('{"lr": 0.1}\n')
    (root / "shards").mkdir()
    for n in range(3):
        (root / "shards" / f"{n}.bin").write_bytes(bytes([n]) * 100)
    (code / "task.yaml").write_text(
        """
name: train
workdir: .
secrets: {TOKEN: from-the-yaml}
file_mounts:
  ~/conf/settings.json: ../settings.json
  ~/shards: ../shards
  ~/inputs: s3://inputs/data
run: python train.py
"""
    )
    return code


def _keys(s3: S3Server, prefix: str) -> list[str]:
    return [k for k in s3.keys(BUCKET) if k.startswith(prefix)]


def test_launch_uploads_the_local_files_and_submits_a_task_that_copies_them(s3, jobs_env, tmp_path):
    code = _project(tmp_path)
    api, progress = RecordingApi(), Recorder()
    job_id = managed_jobs.launch(
        code / "task.yaml", secrets={"TOKEN": "t0k3n-value"}, api=api, upload_progress=progress
    )  # type: ignore[arg-type]
    assert job_id == 1
    (posted,) = [json for _, path, json in api.requests if path.endswith("/dagRuns")]
    assert posted["logical_date"] == "1970-01-01T00:00:01Z"  # the id: see client.managed_ids
    job_id = posted["dag_run_id"]  # the uploads and the secrets are the run's

    run_uri = f"s3://{BUCKET}/uploads/{job_id}"
    root = f"uploads/{job_id}/"
    assert _keys(s3, root) == [
        f"{root}mounts/0",  # the single file: one object at the mount's own key
        f"{root}mounts/1/0.bin",
        f"{root}mounts/1/1.bin",
        f"{root}mounts/1/2.bin",
        f"{root}workdir/.gitignore",
        f"{root}workdir/pkg/model.py",
        f"{root}workdir/task.yaml",
        f"{root}workdir/train.py",  # debug.log stays home: the workdir's .gitignore, as a sync
    ]
    conf = api.conf
    assert conf["uploads"] == run_uri
    assert "workdir" not in conf["task"] and conf["secrets"] == ["TOKEN"]
    assert conf["task"]["file_mounts"] == {
        "~/sky_workdir": {"source": f"{run_uri}/workdir", "mode": "COPY"},
        "~/conf/settings.json": {"source": f"{run_uri}/mounts/0", "mode": "COPY"},
        "~/shards": {"source": f"{run_uri}/mounts/1", "mode": "COPY"},
        "~/inputs": "s3://inputs/data",
    }
    assert "t0k3n-value" not in str(conf)
    sizes = sum(p.stat().st_size for p in code.rglob("*") if p.is_file() and p.suffix != ".log")
    sizes += (tmp_path / "settings.json").stat().st_size + 300
    assert progress.events[0] == ("started", (run_uri, 8, sizes))
    assert sum(e[1][0] for e in progress.events if e[0] == "advanced") == 8
    assert sum(e[1][1] for e in progress.events if e[0] == "advanced") == sizes
    assert progress.events[-1][0] == "finished"
    # The secret's Variable first, then the run.
    assert [path for _, path, _ in api.requests] == ["/variables", "/dags/airflow_sky_jobs/dagRuns"]

    # What each node's rclone does with the submitted task's mounts: files land where the task said.
    deployed = JobSpec.from_conf(conf, owner=secret_owner("airflow_sky_jobs", job_id)).load_task(
        {"TOKEN": "t0k3n-value"}
    )  # as the spec task
    home = _attach(s3, deployed, tmp_path / "node-home")
    assert (home / "sky_workdir" / "train.py").read_text() == "print('training')\n"
    assert (home / "sky_workdir" / "pkg" / "model.py").read_text() == "WEIGHTS = 3\n"
    assert not (home / "sky_workdir" / "debug.log").exists()
    assert (home / "conf" / "settings.json").is_file()  # a file at the destination, not a directory
    assert (home / "conf" / "settings.json").read_text() == '{"lr": 0.1}\n'
    assert sorted(p.name for p in (home / "shards").iterdir()) == ["0.bin", "1.bin", "2.bin"]


def _attach(s3: S3Server, task: Task, home: Path) -> Path:
    """Run the node's attach script for the task's COPY mounts in a local bash, with the real rclone."""
    home.mkdir()
    mounts = [m for m in bucket_mounts(task, "s3") if m.bucket == BUCKET]
    config = rclone.config_text(
        {
            "sky-s3": {
                "type": "s3",
                "provider": "Other",
                "endpoint": s3.endpoint,
                "force_path_style": "true",
                "access_key_id": "testing",
                "secret_access_key": "testing",
                "region": "us-east-1",
            }
        }
    ).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("rclone.conf")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config))
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        ["bash", "-c", rclone.attach_script(mounts, rank=0, plain_http=True)],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    copied = [line.split()[1] for line in done.stdout.decode().splitlines() if line.startswith("copied")]
    assert sorted(copied) == sorted(m.destination for m in mounts)
    return home


def test_a_refused_run_leaves_no_uploaded_file_behind(s3, jobs_env, tmp_path):
    code = _project(tmp_path)
    api, progress = RecordingApi(refuse=True), Recorder()
    with pytest.raises(ApiError, match="403"):
        managed_jobs.launch(code / "task.yaml", secrets={"TOKEN": "x"}, api=api, upload_progress=progress)  # type: ignore[arg-type]
    (job_id,) = [json["dag_run_id"] for _, path, json in api.requests if path.endswith("/dagRuns")]
    assert progress.events[-1][0] == "finished"  # uploaded before the run was refused, then removed
    assert _keys(s3, f"uploads/{job_id}/") == []
    key = secret_variable_key(secret_owner("airflow_sky_jobs", job_id), "TOKEN")
    assert api.requests[-1][:2] == ("DELETE", f"/variables/{key}")


def test_declining_the_confirmation_uploads_and_submits_nothing(s3, jobs_env, tmp_path):
    code = _project(tmp_path)
    api = RecordingApi()
    before = s3.keys(BUCKET)
    asked: list[str] = []

    def decline(name: str) -> bool:
        asked.append(name)
        return False

    with pytest.raises(managed_jobs.LaunchAborted):
        managed_jobs.launch(code / "task.yaml", secrets={"TOKEN": "x"}, api=api, confirm=decline)  # type: ignore[arg-type]
    assert asked == ["train"] and api.requests == [] and s3.keys(BUCKET) == before


def test_a_missing_jobs_bucket_or_local_path_is_refused_before_any_request(
    s3, jobs_env, tmp_path, monkeypatch
):
    code = _project(tmp_path)
    monkeypatch.setenv("AIRFLOW_SKY_JOBS_BUCKET", "s3://no-such-jobs-bucket/x")
    api = RecordingApi()
    with pytest.raises(
        SkyError, match=r"AIRFLOW_SKY_JOBS_BUCKET: bucket s3://no-such-jobs-bucket does not exist"
    ):
        managed_jobs.launch(code / "task.yaml", secrets={"TOKEN": "x"}, api=api)  # type: ignore[arg-type]
    monkeypatch.setenv("AIRFLOW_SKY_JOBS_BUCKET", f"s3://{BUCKET}")
    shutil.rmtree(tmp_path / "shards")
    with pytest.raises(SpecError, match=r"file_mounts.~/shards: local path .*shards does not exist"):
        managed_jobs.launch(code / "task.yaml", secrets={"TOKEN": "x"}, api=api)  # type: ignore[arg-type]
    assert api.requests == []


def test_bucket_file_mounts_need_no_jobs_bucket(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    task = Task(
        run="ls /data ~/ckpt",
        file_mounts={
            "/data": "s3://my-bucket/data",
            "/models": {"source": "gs://models-bucket/v1", "mode": "COPY"},
            "~/ckpt": {"name": "ckpt-bucket", "store": "s3"},
        },
    )
    api = RecordingApi()
    managed_jobs.launch(task, api=api)  # type: ignore[arg-type]
    conf = api.conf
    assert conf["task"]["file_mounts"] == task.to_dict()["file_mounts"] and "uploads" not in conf


def test_the_jobs_bucket_comes_from_the_environment_then_the_config_file(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_ENDPOINT_URL", raising=False)
    assert jobs_bucket_config() is None
    (tmp_path / "config.yaml").write_text("api: {url: http://x}\njobs:\n  bucket: gs://team-jobs/managed\n")
    found = jobs_bucket_config()
    assert found is not None and (found.bucket.uri, found.endpoint_url) == ("gs://team-jobs/managed", None)
    assert found.source.endswith("config.yaml: jobs.bucket")
    (tmp_path / "config.yaml").write_text(
        "jobs:\n  bucket: s3://b-bucket\n  endpoint_url: http://minio:9000\n"
    )
    found = jobs_bucket_config()
    assert found is not None and found.endpoint_url == "http://minio:9000"
    monkeypatch.setenv("AIRFLOW_SKY_JOBS_BUCKET", "s3://env-bucket/p")
    found = jobs_bucket_config()
    assert found is not None and (found.bucket.uri, found.source) == (
        "s3://env-bucket/p",
        "AIRFLOW_SKY_JOBS_BUCKET",
    )
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET")
    (tmp_path / "config.yaml").write_text("jobs:\n  bukket: s3://b-bucket\n")
    with pytest.raises(
        SkyError, match=r"config.yaml: jobs: unknown field\(s\) bukket \(allowed: bucket, endpoint_url\)"
    ):
        jobs_bucket_config()
    (tmp_path / "config.yaml").write_text("jobs:\n  bucket: b-bucket\n")
    with pytest.raises(SpecError, match=r"config.yaml: jobs.bucket: 'b-bucket' is not a bucket URI"):
        jobs_bucket_config()


def test_the_upload_progress_prints_one_summary_line_off_a_terminal():
    from rich.console import Console

    output = io.StringIO()
    bar = UploadProgressBar(Console(file=output, width=200))
    bar.started("s3://b-bucket/run", 3, 2_500_000)
    bar.advanced(1, 1_000_000)
    bar.advanced(2, 1_500_000)
    bar.finished(1.25)
    assert output.getvalue() == (
        "Uploaded 3 local file(s) (2.5 MB) to s3://b-bucket/run in 1.2s (removed when the job ends)\n"
    )


def test_jobs_launch_asks_as_sky_does_only_on_a_terminal_and_not_with_yes(monkeypatch):
    from airflow_sky.client.cli import build_parser
    from airflow_sky.client.cli.managed_jobs import _confirm_launch

    args = build_parser().parse_args(["jobs", "launch", "task.yaml"])
    assert args.yes is False and build_parser().parse_args(["jobs", "launch", "-y", "t.yaml"]).yes is True
    questions: list[str] = []
    answers = iter(["", "y", "n", "no"])

    def answer(question: str) -> str:
        questions.append(question)
        return next(answers)

    monkeypatch.setattr("builtins.input", answer)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    assert [_confirm_launch(args, "train") for _ in range(4)] == [True, True, False, False]
    assert questions[0] == "Launching a managed job 'train'. Proceed? [Y/n] "
    args.yes = True
    assert _confirm_launch(args, "train") and len(questions) == 4  # -y: never asked
    args.yes = False
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert _confirm_launch(args, "train") and len(questions) == 4  # not a terminal: never asked
