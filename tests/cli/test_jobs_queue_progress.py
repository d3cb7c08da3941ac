"""`airflow-sky jobs queue` shows each managed job's progress from the deployment's airflow-sky plugin (its
JSON API, GET /airflow-sky/api/v1/progress/{dag_id}/{run_id}?history=0, asked with the REST API's login),
and goes on without it: a deployment without the plugin (its API server answers the UI's HTML page for
the path), or a plugin that answers 404, shows `-` and no error.

The Airflow API here is a stand-in HTTP server on loopback (real sockets, real httpx, the real CLI as a
subprocess) answering canned runs and the plugin's contract: a real Airflow with the plugin takes minutes
to start (tests/scheduler/test_managed_jobs.py runs one).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import AirflowApi, ApiConfig
from airflow_sky.client.managed_ids import logical_date_of
from tests.cli.stand_in import answer_json, jobs_queue, serve

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
TRAINING = "sky-job-20261203-100000-a1b2c3"
SILENT = "sky-job-20261203-090000-d4e5f6"
WAITING = "sky-job-20261203-110000-0a0b0c"


def _run(run_id: str, state: str, job_id: int) -> dict[str, Any]:
    return {
        "dag_run_id": run_id,
        "logical_date": logical_date_of(job_id),
        "state": state,
        "queued_at": "2026-12-03T10:00:00Z",
        "start_date": "2026-12-03T10:00:01Z",
        "end_date": None if state == "running" else "2026-12-03T10:30:00Z",
        "conf": {"task": {"name": run_id.rsplit("-", 1)[1], "num_nodes": 2}, "infra": "local"},
    }


RUNS = [_run(WAITING, "queued", 3), _run(TRAINING, "running", 2), _run(SILENT, "success", 1)]
FOLLOW = {"task_id": "job.run_follow", "map_index": 0, "try_number": 1}
TASK_INSTANCES = {
    TRAINING: [{**FOLLOW, "state": "running"}],
    SILENT: [{**FOLLOW, "state": "success"}],
    WAITING: [],
}
# The plugin's answer for TRAINING: a live progress document (the parts a queue reads).
DOCUMENT = {"step": 1200, "total": 3000, "percent": 40.0, "rate": 0.5, "eta_s": 3720.0, "ranks": []}
PLUGIN = {
    TRAINING: {
        "dag_id": "airflow_sky_jobs",
        "run_id": TRAINING,
        "jobs": [
            {
                "group": "job",
                "cluster": "c",
                "infra": "local",
                "job_id": 1,
                "source": "live",
                "progress": DOCUMENT,
            }
        ],
    },
    SILENT: {
        "dag_id": "airflow_sky_jobs",
        "run_id": SILENT,
        "jobs": [
            {
                "group": "job",
                "cluster": "c",
                "infra": "local",
                "job_id": 1,
                "source": "none",
                "progress": None,
            }
        ],
    },
}


class StandIn(BaseHTTPRequestHandler):
    requests: list[tuple[str, str | None]]
    plugin: str  # "installed", "absent" (the UI's page answers), "404"

    def do_GET(self) -> None:
        self.requests.append((self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        if path == "/auth/token":
            return self._json({"access_token": "t"})
        if path == "/api/v2/dags/airflow_sky_jobs/dagRuns":
            return self._json({"dag_runs": RUNS, "total_entries": len(RUNS)})
        for run_id, tis in TASK_INSTANCES.items():
            if path.endswith(f"/dagRuns/{run_id}/taskInstances"):
                return self._json({"task_instances": tis, "total_entries": len(tis)})
        if path.startswith("/airflow-sky/api/v1/progress/airflow_sky_jobs/") and self.plugin == "installed":
            answer = PLUGIN.get(path.rsplit("/", 1)[1])
            return self._json(answer) if answer else self.send_error(404)
        if path.startswith("/airflow-sky/") and self.plugin == "absent":
            body = b"<!doctype html><html><body>Airflow</body></html>"  # the UI's catch-all page
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        self.send_error(404)
        return None

    def _json(self, body: Any) -> None:
        answer_json(self, body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=["installed", "absent", "404"])
def stand_in(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, list[tuple[str, str | None]]]]:
    requests: list[tuple[str, str | None]] = []
    with serve(StandIn, requests=requests, plugin=request.param) as url:
        yield url, request.param, requests


def _queue_lines(url: str) -> list[str]:
    done = jobs_queue(url)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    return done.stdout.splitlines()


def test_jobs_queue_shows_the_plugins_progress_and_a_dash_without_it(stand_in):
    url, plugin, requests = stand_in
    header, *rows = _queue_lines(url)
    by_id = {row.split()[2]: row for row in rows}  # by RUN ID
    asked = [(path, auth) for path, auth in requests if path.startswith("/airflow-sky/")]
    # Only runs that got to their run are asked about, each once, with the REST API's login.
    assert sorted(path for path, _ in asked) == [
        f"/airflow-sky/api/v1/progress/airflow_sky_jobs/{run_id}?history=0"
        for run_id in sorted((SILENT, TRAINING))
    ]
    assert {auth for _, auth in asked} == {"Bearer t"}
    if plugin == "installed":
        wide = "ID NAME RUN ID NODES INFRA SUBMITTED DURATION PROGRESS ETA #RECOVERIES STATUS"
        assert " ".join(header.split()) == wide, header
        # (the statuses are of_run's, from task instances this stand-in leaves out: not the point here)
        assert by_id[TRAINING].split()[-5:-2] == ["1200/3000", "40%", "1h02m"], by_id
        assert by_id[SILENT].split()[-4:] == ["-", "-", "0", "SUCCEEDED"], by_id  # reported nothing
        assert by_id[WAITING].split()[-4:-2] == ["-", "-"], by_id
    else:  # no job's progress to show: the columns are left out, and nothing failed
        assert "PROGRESS" not in header and "ETA" not in header.split(), header
        assert by_id[TRAINING].split()[-2] == "0" and "1200" not in by_id[TRAINING], by_id


def test_the_sdk_jobs_queue_carries_the_progress_fields(stand_in):
    url, plugin, _ = stand_in
    with AirflowApi(ApiConfig(url, token="t")) as api:
        jobs = {job.run_id: job for job in managed_jobs.queue(api=api)}
    assert [job.job_id for job in jobs.values()] == [3, 2, 1]  # from the runs' logical dates
    expected = (
        {"step": 1200, "total": 3000, "percent": 40.0, "rate": 0.5, "eta_s": 3720.0}
        if plugin == "installed"
        else None
    )
    assert jobs[TRAINING].progress == expected
    assert jobs[SILENT].progress is None and jobs[WAITING].progress is None


def test_progress_cells_read_as_a_queue_shows_them():
    from airflow_sky.client.cli.progress_cells import eta_cell, progress_cell
    from airflow_sky.gang.queue_progress import queue_progress

    running = queue_progress(DOCUMENT)
    assert (progress_cell(running), eta_cell(running)) == ("1200/3000 40%", "1h02m")
    # A final XCom's small form: percent worked out, no ETA; 99.9% is not done yet.
    assert progress_cell(queue_progress({"step": 2997, "total": 3000})) == "2997/3000 99%"
    assert eta_cell(queue_progress({"step": 2997, "total": 3000})) == "-"
    assert progress_cell(queue_progress({"step": 40, "total": None, "eta_s": None})) == "40"
    assert [eta_cell({"eta_s": s}) for s in (0.2, 59, 61, 3600, 90000)] == [
        "1s",
        "59s",
        "1m01s",
        "1h00m",
        "1d01h",
    ]
    # Nothing reported, or a document of no known shape (read over HTTP): no progress, never an error.
    for doc in (
        None,
        {},
        {"step": None},
        {"step": "12"},
        {"step": True},
        {"step": -1},
        ["step"],
        {"step": float("nan")},
    ):
        assert queue_progress(doc) is None, doc
        assert progress_cell(queue_progress(doc)) == "-"
    assert queue_progress({"step": 5, "total": "x", "rate": "fast", "eta_s": float("inf")}) == {
        "step": 5,
        "total": None,
        "percent": None,
        "rate": None,
        "eta_s": None,
    }


def test_jobs_queue_with_progress_still_fits_80_columns_keeping_progress_over_the_times():
    import io
    from datetime import UTC, datetime, timedelta

    from rich.console import Console

    from airflow_sky.client.cli.managed_jobs import queue_table

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    job = managed_jobs.ManagedJob(
        job_id=2,
        run_id=TRAINING,
        name="managed-training-run-of-the-nightly-model",
        status="RUNNING",
        recoveries=1,
        num_nodes=16,
        submitted=now - timedelta(seconds=302),
        duration_s=290,
        infra="aws/us-east-1",
        progress={"step": 1200, "total": 3000, "percent": 40.0, "rate": 0.5, "eta_s": 3720.0},
    )
    console = Console(width=80, file=io.StringIO(), highlight=False)
    console.print(queue_table([job], now, 80))
    header, row = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert max(len(header), len(row)) <= 80, (header, row)
    assert header.split() == ["ID", "NAME", "SUBMITTED", "PROGRESS", "#REC", "STATUS"], header
    assert row.split()[0] == "2" and row.split()[-4:] == ["1200/3000", "40%", "1", "RUNNING"], row
