"""Managed job ids as sky's (1, 2, 3... claimed atomically at launch), the commands that take them (`jobs
logs` with no id: the latest; `jobs cancel -a`; `jobs queue -s`), and a failed run's cause: refused by the
deployment (FAILED_PRECHECKS, its error) or failed before it started (FAILED_CONTROLLER, what Airflow
recorded), with its uploads removed either way.

The Airflow API is a stateful stand-in on loopback (tests/cli/managed_stand_in.py: real sockets, real
httpx, the real CLI as a subprocess); the jobs bucket is moto's S3 server.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import AirflowApi, ApiConfig
from airflow_sky.task import Task
from tests.cli.managed_stand_in import Airflow, Handler
from tests.cli.stand_in import serve
from tests.s3server import S3Server

CLI = [sys.executable, "-m", "airflow_sky.client.cli", "jobs"]
BUCKET = "sky-jobs"


@pytest.fixture
def airflow(tmp_path, monkeypatch) -> Iterator[tuple[Airflow, str]]:
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    state = Airflow()
    with serve(Handler, airflow=state) as url:
        yield state, url


def _cli(url: str, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Any:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_SKY_API", "AIRFLOW_SKY_JOBS"))}
    base.update({"AIRFLOW_SKY_API_URL": url, "AIRFLOW_SKY_API_TOKEN": "t", "COLUMNS": "200", **(env or {})})
    return subprocess.run([*CLI, *args], env=base, input=stdin, capture_output=True, text=True, timeout=120)


def test_concurrent_launches_get_distinct_consecutive_ids_and_hand_made_runs_none(airflow):
    state, url = airflow
    api = AirflowApi(ApiConfig(url, token="t"))

    def launch(n: int) -> int:
        return managed_jobs.launch(Task(f"t{n}", run="true"), api=AirflowApi(ApiConfig(url, token="t")))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(launch, range(8)))
    assert sorted(ids) == list(range(1, 9))  # none shared, none skipped
    assert len(state.runs) == 8
    assert sorted(r["logical_date"] for r in state.runs) == [f"1970-01-01T00:00:0{n}Z" for n in range(1, 9)]
    # Runs triggered by hand (a logical date of now, or none) take no id and leave the ids alone.
    state.add_run("manual__2026-12-03T10:00:00+00:00", "success", logical_date="2026-12-03T10:00:00Z")
    state.add_run("by-hand", "success")
    assert managed_jobs.launch(Task("next", run="true"), api=api) == 9
    assert [job.job_id for job in managed_jobs.queue(api=api)][:3] == [9, None, None]


def test_every_jobs_command_takes_the_integer_id_or_the_run_id(airflow):
    state, url = airflow
    api = AirflowApi(ApiConfig(url, token="t"))
    for name in ("first", "second", "third"):
        managed_jobs.launch(Task(name, run="true"), api=api)
    for run in state.runs[:2]:
        run["state"] = "success"
    second = state.runs[1]["dag_run_id"]

    queue = _cli(url, "queue")
    assert queue.returncode == 0, queue.stderr
    rows = {line.split()[0]: line.split() for line in queue.stdout.splitlines()[1:]}
    assert rows["2"][1:3] == ["second", second] and rows["3"][-1] == "PENDING"
    running_only = _cli(url, "queue", "-s")
    assert [line.split()[0] for line in running_only.stdout.splitlines()[1:]] == ["3"], running_only.stdout

    for given in ("2", second):
        logs = _cli(url, "logs", given, "--no-follow")
        assert logs.returncode == 0, logs.stderr
        assert f"Managed job {given}: SUCCEEDED" in logs.stderr
    latest = _cli(url, "logs", "--no-follow")  # no id: the latest job
    assert latest.returncode == 0 and "Managed job 3: PENDING" in latest.stderr, latest.stderr
    unknown = _cli(url, "logs", "99", "--no-follow")
    assert unknown.returncode == 2, unknown.stderr
    (line,) = unknown.stderr.strip().splitlines()
    assert "job id 99: no such managed job" in line, line

    cancelled = _cli(url, "cancel", "3", "-y")
    assert cancelled.returncode == 0, cancelled.stderr
    assert state.runs[2]["state"] == "failed" and state.runs[1]["state"] == "success"


def test_jobs_cancel_all_asks_then_cancels_every_unfinished_job_and_nothing_without_an_answer(airflow):
    state, url = airflow
    api = AirflowApi(ApiConfig(url, token="t"))
    for name in ("done", "a", "b"):
        managed_jobs.launch(Task(name, run="true"), api=api)
    state.runs[0]["state"] = "success"
    state.runs[1]["state"] = "running"

    neither = _cli(url, "cancel")
    assert neither.returncode == 2 and "-a/--all" in neither.stderr, neither.stderr
    both = _cli(url, "cancel", "2", "-a")
    assert both.returncode == 2, both.stderr

    unanswered = _cli(url, "cancel", "-a")  # stdin closed: no, as sky's prompt
    assert unanswered.returncode == 1 and "Aborted." in unanswered.stdout, unanswered.stdout
    assert "Cancelling all managed jobs (2: 3, 2). Proceed?" in unanswered.stdout
    assert not any(r.startswith("PATCH") for r in state.requests)
    declined = _cli(url, "cancel", "--all", stdin="n\n")
    assert declined.returncode == 1 and not any(r.startswith("PATCH") for r in state.requests)

    accepted = _cli(url, "cancel", "-a", stdin="\n")  # Enter: yes
    assert accepted.returncode == 0, accepted.stderr
    assert [r["state"] for r in state.runs] == ["success", "failed", "failed"]
    assert _cli(url, "cancel", "-a", "-y").stdout.strip() == "No managed jobs to cancel."


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket=BUCKET)
        yield server


def _bucket_env(s3: S3Server) -> dict[str, str]:
    return {
        "AIRFLOW_SKY_JOBS_BUCKET": f"s3://{BUCKET}/uploads",
        "AIRFLOW_SKY_JOBS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _failed_run(state: Airflow, s3: S3Server, job_id: int, run_id: str, spec: dict[str, Any]) -> None:
    """A failed run with uploaded files whose spec task failed as `spec` says, and whose remove_uploads
    teardown failed too (it ran nowhere)."""
    uri = f"s3://{BUCKET}/uploads/{run_id}"
    state.add_run(
        run_id,
        "failed",
        {"task": {"name": "train", "num_nodes": 2}, "infra": "local", "secrets": [], "uploads": uri},
        logical_date=f"1970-01-01T00:00:0{job_id}Z",
    )
    never = {"hostname": "", "pid": None, "try_number": 1, "state": "failed"}
    state.tis[run_id] = [
        {"task_id": "begin", "map_index": -1, "state": "success", "hostname": "w", "pid": 1},
        {"task_id": "spec", "map_index": -1, **spec},
        {"task_id": "remove_uploads", "map_index": -1, **never},
    ]
    for key in ("workdir/train.py", "mounts/0"):
        s3.client.put_object(Bucket=BUCKET, Key=f"uploads/{run_id}/{key}", Body=b"x")


def _keys(s3: S3Server, run_id: str) -> list[str]:
    return [k for k in s3.keys(BUCKET) if k.startswith(f"uploads/{run_id}/")]


def test_a_job_that_never_started_is_failed_controller_saying_so_and_its_uploads_are_removed(airflow, s3):
    state, url = airflow
    run_id = "sky-job-0a0b0c0d0e"
    _failed_run(state, s3, 1, run_id, {"hostname": "", "pid": None, "try_number": 1, "state": "failed"})
    mismatch = (
        "Executor LocalExecutor(parallelism=32) reported that the task instance <TaskInstance: "
        "airflow_sky_jobs.spec sky-job-0a0b0c0d0e [queued]> finished with state failed, but the task "
        "instance's state attribute is queued."
    )
    state.event_logs[run_id] = [{"event": "state mismatch", "task_id": "spec", "extra": mismatch}]
    assert len(_keys(s3, run_id)) == 2

    queue = _cli(url, "queue", env=_bucket_env(s3))
    assert queue.returncode == 0, queue.stderr
    assert queue.stdout.splitlines()[1].split()[-1] == "FAILED_CONTROLLER", queue.stdout
    assert _keys(s3, run_id) == []  # the CLI removed what the deployment could not

    logs = _cli(url, "logs", "1", "--no-follow", env=_bucket_env(s3))
    assert logs.returncode == 0, logs.stderr
    (line,) = [x for x in logs.stdout.splitlines() if x.startswith("spec ")]
    assert line.startswith("spec never ran: Airflow failed the job before it started"), line
    assert "execution_api_server_url" in line and f"Airflow says: {mismatch}" in line, line
    assert "refused" not in logs.stdout and "Managed job 1: FAILED_CONTROLLER" in logs.stderr


def test_a_refused_job_is_failed_prechecks_with_the_deployments_reason_and_its_uploads_are_removed(
    airflow, s3
):
    state, url = airflow
    run_id = "sky-job-0e0f0a0b0c"
    refusal = "the run conf: infra: aws/us-east-1 is not allowed here; allowed: local"
    log = [{"event": "Task failed", "error_detail": [{"exc_type": "SpecError", "exc_value": refusal}]}]
    _failed_run(
        state,
        s3,
        2,
        run_id,
        {"hostname": "worker-1", "pid": 42, "try_number": 1, "state": "failed", "log": log},
    )

    logs = _cli(url, "logs", "2", "--no-follow", env=_bucket_env(s3))
    assert logs.returncode == 0, logs.stderr
    assert f"spec failed: {refusal}" in logs.stdout, logs.stdout
    assert "Managed job 2: FAILED_PRECHECKS" in logs.stderr
    assert "Removed the job's 2 uploaded file(s)" in logs.stdout and _keys(s3, run_id) == []
    assert not any("/eventLogs" in r for r in state.requests)  # it ran: no audit log to ask


def test_a_run_whose_teardown_removed_its_uploads_is_not_touched_again(airflow, s3):
    state, url = airflow
    run_id = "sky-job-0c0d0e0f0a"
    _failed_run(state, s3, 3, run_id, {"hostname": "", "pid": None, "try_number": 1, "state": "failed"})
    state.tis[run_id][-1].update(state="success", hostname="w", pid=2)  # the deployment's own removal ran
    assert _cli(url, "queue", env=_bucket_env(s3)).returncode == 0
    assert len(_keys(s3, run_id)) == 2  # (left here by the test: the teardown said it removed them)


def test_jobs_cancel_by_name_cancels_that_names_unfinished_jobs_only(airflow):
    state, url = airflow
    api = AirflowApi(ApiConfig(url, token="t"))
    for name in ("train", "eval", "train", "train"):
        managed_jobs.launch(Task(name, run="true"), api=api)
    state.runs[0]["state"] = "success"  # an ended job of that name stays as it ended

    cancelled = _cli(url, "cancel", "-n", "train", "-y")
    assert cancelled.returncode == 0, cancelled.stderr
    assert [r["state"] for r in state.runs] == ["success", "queued", "failed", "failed"]
    assert "Cancelling managed job 4" in cancelled.stdout and "Cancelling managed job 3" in cancelled.stdout
    nobody = _cli(url, "cancel", "--name", "nobody")
    assert nobody.returncode == 1 and "No managed job named 'nobody' to cancel" in nobody.stdout
    both = _cli(url, "cancel", "2", "-n", "eval")
    assert both.returncode == 2 and "one of them" in both.stderr, both.stderr


def test_jobs_launch_takes_a_command_as_the_task_as_sky_jobs_launch_does(airflow):
    state, url = airflow
    launched = _cli(url, "launch", "echo", "hi", "from", "a", "command", "-n", "cmd-job", "-y", "-d")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "Command to run: echo hi from a command" in launched.stdout
    (run,) = state.runs
    assert run["conf"]["task"]["run"] == "echo hi from a command"
    assert run["conf"]["task"]["name"] == "cmd-job"
