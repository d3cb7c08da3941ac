"""`airflow-sky jobs queue` on an 80-column terminal, and `jobs launch` against a managed jobs DAG that is paused
or missing (refused in one line naming the fix, before anything is created).

The Airflow API here is a stand-in HTTP server on loopback (real sockets, real httpx, the real CLI entry
point) that answers the DAG's state and records every request; a real Airflow with a paused DAG is
tests/scheduler/test_managed_jobs.py.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from airflow_sky.client.cli import main
from airflow_sky.client.cli.cluster_jobs import failure_of
from airflow_sky.client.cli.managed_jobs import queue_table
from airflow_sky.client.managed_jobs import ManagedJob
from airflow_sky.task.conf_policy import SETTINGS

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _job(
    job_id: int | None, run_id: str, name: str, status: str, ago_s: float, took_s: float, recoveries: int = 0
) -> ManagedJob:
    return ManagedJob(
        job_id=job_id,
        run_id=run_id,
        name=name,
        status=status,
        recoveries=recoveries,
        num_nodes=16,
        submitted=NOW - timedelta(seconds=ago_s),
        duration_s=took_s,
        infra="aws/us-east-1",
    )


JOBS = [
    _job(12, "sky-job-a1b2c3d4e5", "managed-training-run-of-the-nightly-model", "RUNNING", 302, 290, 1),
    _job(11, "sky-job-d4e5f6a7b8", "train", "SUCCEEDED", 3600, 125),
    _job(9, "sky-job-0a0b0c0d0e", "prep", "CANCELLED", 2 * 86400 + 3 * 3600, 90000),
]


def _render(jobs: list[ManagedJob], width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), highlight=False)
    console.print(queue_table(jobs, NOW, width))
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_jobs_queue_fits_80_columns_with_whole_ids_run_ids_headers_statuses_and_short_times() -> None:
    lines = _render(JOBS, 80)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    header, *rows = lines
    assert len(rows) == len(JOBS), "\n".join(lines)  # one line per job: nothing wraps
    assert header.split() == ["ID", "NAME", "RUN", "ID", "NODES", "SUBMITTED", "DURATION", "#REC", "STATUS"]
    by_id = {row.split()[0]: row for row in rows}
    running = by_id["12"]
    assert "sky-job-a1b2c3d4e5" in running
    assert "5m ago" in running and "4m 50s" in running and running.split()[-2:] == ["1", "RUNNING"]
    assert "managed-tr…" in running  # the long name is cut, with an ellipsis
    assert "1h ago" in by_id["11"] and "2m 5s" in by_id["11"]
    cancelled = by_id["9"]
    assert "2d ago" in cancelled and "1d 1h" in cancelled and cancelled.split()[-1] == "CANCELLED"


def test_jobs_queue_drops_columns_before_it_cuts_an_id_or_a_status() -> None:
    failed = _job(13, "sky-job-ffffffffff", "hostile", "FAILED_CONTROLLER", 30, 5)
    lines = _render([*JOBS, failed], 80)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert lines[0].split() == ["ID", "NAME", "RUN", "ID", "SUBMITTED", "DURATION", "#REC", "STATUS"]
    assert lines[-1].split()[:3] == ["13", "hostile", "sky-job-ffffffffff"]
    assert lines[-1].split()[-2:] == ["0", "FAILED_CONTROLLER"]


def test_jobs_queue_keeps_the_run_id_of_a_job_without_an_integer_id_on_80_columns() -> None:
    manual = _job(None, "manual__2026-12-03T10:00:00.123456+00:00", "by-hand", "FAILED_PRECHECKS", 30, 5)
    lines = _render([*JOBS, manual], 80)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "RUN ID" in lines[0], "\n".join(lines)
    assert lines[-1].split()[:3] == ["-", "by-hand", manual.run_id], "\n".join(lines)
    assert lines[-1].split()[-1] == "FAILED_PRECHECKS"


def test_jobs_queue_on_a_wide_terminal_shows_every_column_whole() -> None:
    lines = _render(JOBS, 200)
    assert lines[0].split() == [
        "ID",
        "NAME",
        "RUN",
        "ID",
        "NODES",
        "INFRA",
        "SUBMITTED",
        "DURATION",
        "#RECOVERIES",
        "STATUS",
    ]
    assert lines[1].split() == [
        "12",
        "managed-training-run-of-the-nightly-model",
        "sky-job-a1b2c3d4e5",
        "16",
        "aws/us-east-1",
        "5m",
        "ago",
        "4m",
        "50s",
        "1",
        "RUNNING",
    ]


def test_the_cluster_queue_says_cancelled_for_a_cancelled_job_not_its_rank_minus_one() -> None:
    cancelled = {"status": "CANCELLED", "failed_rank": -1, "failed_exit_code": 143}
    assert failure_of(cancelled) == "cancelled"
    assert failure_of({"status": "FAILED", "failed_rank": 1, "failed_exit_code": 4}) == "rank 1: exit 4"
    assert failure_of({"status": "SUCCEEDED"}) == "-"


def test_the_managed_jobs_dag_is_created_unpaused_whatever_airflow_pauses_by_default() -> None:
    from airflow_sky.dags.managed import managed_jobs_dag

    assert managed_jobs_dag().is_paused_upon_creation is False
    assert managed_jobs_dag(dag_id="kept_paused", is_paused_upon_creation=True).is_paused_upon_creation


class DagStandIn(BaseHTTPRequestHandler):
    """GET /api/v2/dags/airflow_sky_jobs answers `dag` (None: 404); every request is recorded."""

    dag: dict[str, Any] | None
    requests: list[str]

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        if self.path == "/api/v2/dags/airflow_sky_jobs" and self.dag is not None:
            self._answer(200, self.dag)
        else:
            self._answer(404, {"detail": "The Dag with dag_id: `airflow_sky_jobs` was not found"})

    def do_POST(self) -> None:
        self.requests.append(f"POST {self.path}")
        self._answer(500, {"detail": "nothing may be created"})

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))  # (httpx reads JSON whatever the type says)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def airflow_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start a stand-in API whose DAG is the one given; the CLI's environment points at it."""
    servers: list[ThreadingHTTPServer] = []

    def start(dag: dict[str, Any] | None) -> list[str]:
        requests: list[str] = []
        handler = type("Handler", (DagStandIn,), {"dag": dag, "requests": requests})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        monkeypatch.setenv("AIRFLOW_SKY_API_URL", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("AIRFLOW_SKY_API_TOKEN", "t")
        return requests

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def task_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    for name in SETTINGS:
        monkeypatch.delenv(f"AIRFLOW__SKY__{name.upper()}", raising=False)
    (tmp_path / "task.yaml").write_text("name: t\nrun: echo hi\n")
    return tmp_path / "task.yaml"


def test_jobs_launch_on_a_paused_dag_is_refused_in_one_line_naming_the_unpause_command(
    airflow_with, task_file, capsys
) -> None:
    requests = airflow_with({"dag_id": "airflow_sky_jobs", "is_paused": True, "is_stale": False})
    assert main(["jobs", "launch", str(task_file), "-d"]) == 2
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert line.startswith("airflow-sky: error: the managed jobs DAG airflow_sky_jobs is paused"), line
    assert "`airflow dags unpause airflow_sky_jobs`" in line and "PATCH /api/v2/dags/airflow_sky_jobs" in line
    assert "submitted" not in out
    assert requests == ["GET /api/v2/dags/airflow_sky_jobs"]  # no Variable, no run


@pytest.mark.parametrize("dag", [None, {"dag_id": "airflow_sky_jobs", "is_paused": False, "is_stale": True}])
def test_jobs_launch_without_a_deployed_dag_is_refused_in_one_line_saying_how_to_deploy_it(
    airflow_with, task_file, capsys, dag
) -> None:
    requests = airflow_with(dag)
    assert main(["jobs", "launch", str(task_file), "-d"]) == 2
    _, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert "has no DAG airflow_sky_jobs" in line, line
    assert "from airflow_sky.dags.managed import managed_jobs_dag; dag = managed_jobs_dag()" in line, line
    assert requests == ["GET /api/v2/dags/airflow_sky_jobs"]
