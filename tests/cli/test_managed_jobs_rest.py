"""What `airflow-sky jobs ...` sends to and shows from the Airflow REST API when ids or run confs are hostile.

The API is a stand-in HTTP server on loopback (real sockets, real httpx, the real CLI as a subprocess) that
answers canned runs and records the paths it was asked: what a run conf can make the CLI print or request
is the point, and a real Airflow (tests/scheduler) takes minutes to start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import AirflowApi, ApiConfig, api_path, check_job_id
from airflow_sky.errors import SpecError
from tests.cli.stand_in import answer_json, jobs_queue, serve

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
HOSTILE_RUN = {
    "dag_run_id": "manual__2026-12-03T10:00:00+00:00",
    "state": "failed",
    "queued_at": "2026-12-03T10:00:00Z",
    "start_date": "2026-12-03T10:00:01Z",
    "end_date": "2026-12-03T10:00:05Z",
    "conf": {"task": {"name": "[bold red]boom", "num_nodes": "[/x]"}, "infra": "[/x]", "secrets": []},
}
ODD_RUN = {**HOSTILE_RUN, "dag_run_id": "manual__odd", "conf": {"jobs": {"not": "a list"}}}


class StandIn(BaseHTTPRequestHandler):
    paths: list[str]

    def do_GET(self) -> None:
        self.paths.append(self.path)
        if self.path.startswith("/auth/token"):
            body: Any = {"access_token": "t"}
        elif self.path.startswith("/api/v2/dags/airflow_sky_jobs/dagRuns?"):
            body = {"dag_runs": [HOSTILE_RUN, ODD_RUN], "total_entries": 2}
        elif "/taskInstances" in self.path and "/xcomEntries/" not in self.path:
            body = {"task_instances": [], "total_entries": 0}
        else:
            self.send_error(404)
            return
        answer_json(self, body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []
    with serve(StandIn, paths=paths) as url:
        yield url, paths


def test_rest_path_segments_are_quoted_whole_and_dot_segments_never_resolve():
    assert api_path("dags", "d", "dagRuns", "a/b?c#d") == "/dags/d/dagRuns/a%2Fb%3Fc%23d"
    assert api_path("dagRuns", "..", "x") == "/dagRuns/%2E%2E/x"
    assert api_path("dagRuns", ".") == "/dagRuns/%2E"
    assert (
        api_path("dagRuns", "manual__2026-12-03T10:00:00+00:00")
        == "/dagRuns/manual__2026-12-03T10%3A00%3A00%2B00%3A00"
    )
    assert api_path("logs", 3) == "/logs/3"


@pytest.mark.parametrize("bad", ["..", ".", "../../variables", "a/b", "x y", "[/x]", "", "sky-job-1\n"])
def test_an_id_that_cannot_be_a_run_id_is_refused_naming_it(bad):
    with pytest.raises(SpecError, match=r"^job id .*: not a job id \(a DAG run id"):
        check_job_id(bad)


@pytest.mark.parametrize("good", ["sky-job-20261203-101500-a1b2c3", "manual__2026-12-03T10:00:00.1+00:00"])
def test_real_run_ids_are_job_ids(good):
    assert check_job_id(good) == good


def test_a_hostile_job_id_reaches_no_request_and_a_server_id_reaches_its_own_path(stand_in):
    url, paths = stand_in
    api = AirflowApi(ApiConfig(url, token="t"))
    for call in (managed_jobs.job, managed_jobs.cancel):
        with pytest.raises(SpecError, match="not a job id"):
            call("../../variables", api=api)
    with pytest.raises(SpecError, match="not a job id"):
        managed_jobs.logs("..", api=api, follow=False)
    assert paths == []
    jobs = managed_jobs.queue(api=api)
    assert [j.run_id for j in jobs] == [HOSTILE_RUN["dag_run_id"], "manual__odd"]
    assert [j.job_id for j in jobs] == [None, None]  # runs made by hand: no integer id
    assert (
        "/api/v2/dags/airflow_sky_jobs/dagRuns/manual__2026-12-03T10%3A00%3A00%2B00%3A00/taskInstances"
        in (p.split("?")[0] for p in paths)
    )


def test_jobs_queue_shows_a_run_confs_markup_as_text_for_everyone(stand_in):
    url, _ = stand_in
    done = jobs_queue(url)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if "manual__2026" in line)
    # as written, NODES "-"
    assert re.search(r"\[bold red\]boom\s+manual__\S+\s+-\s+\[/x\]\s", line), done.stdout
    odd = next(line for line in done.stdout.splitlines() if "manual__odd" in line)
    assert odd.split()[:5] == ["-", "-", "manual__odd", "-", "local"], done.stdout  # no known shape: no crash


def test_jobs_launch_runs_the_deployments_policy_from_its_environment_first_and_exits_2(stand_in, tmp_path):
    url, paths = stand_in
    (tmp_path / "task.yaml").write_text("name: t\nrun: echo hi\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_SKY_API", "AIRFLOW__SKY__"))}
    env.update({"AIRFLOW_SKY_API_URL": url, "AIRFLOW_SKY_API_TOKEN": "t", "AIRFLOW_SKY_HOME": str(tmp_path)})
    env["AIRFLOW__SKY__MANAGED_INFRAS"] = "aws"
    for extra, refusal in (
        ([], "infra: local is not allowed here; allowed: aws"),
        (["--infra", "aws", "-c", "prod"], None),
    ):
        if refusal is None:  # the cluster names too
            env["AIRFLOW__SKY__MANAGED_CLUSTER_NAMES"] = "dev-*"
            # A token names no user here: a name in no user's namespace and no shared one is refused all
            # the same, naming the shared ones.
            refusal = (
                "cluster_name: prod is not allowed here; name a cluster of your own, <your user>--<name>"
            )
        done = subprocess.run(
            [*CLI, "jobs", "launch", str(tmp_path / "task.yaml"), "-y", "-d", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()  # one line, no traceback
        assert line.startswith(f"airflow-sky: error: the run conf: {refusal}"), line
        assert extra == [] or "or a shared one: dev-* ([sky] managed_cluster_names" in line, line
    assert paths == []  # nothing reached the API
