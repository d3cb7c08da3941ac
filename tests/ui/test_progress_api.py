"""The progress plugin's JSON API and page under Airflow's real API server (`airflow api-server`, the simple
auth manager asking passwords, a real metadata DB in a private AIRFLOW_HOME), about a real job: a sky_job
run by `airflow dags test` on a kept 2-node local cluster whose ranks print progress lines, collected by
their run-follow tasks into the local infra's state store. The page is checked in headless Chromium.

The page's hostile-data check adds to that job, in the same real state store, what a real run rarely
shows: a relaunch with a hostile reason and records with a hostile metric name (written through
ProgressRecords and JobStates, the store's own writers: this part is the store, not a job)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from airflow_sky.gang.job_progress import Point, RankProgress
from airflow_sky.gang.progress_store import ProgressRecords
from airflow_sky.gang.state import JobStates
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.registry import open_cluster
from tests.dags.conftest import AIRFLOW, airflow_home  # noqa: F401  # the session's migrated AIRFLOW_HOME

DAG_ID = "sky_progress_api"
CLUSTER = "ui-progress-api"
QUIET = "ui-progress-quiet"
STEPS = 4
PASSWORDS = {"admin": "admin-pw", "viewer": "viewer-pw"}
SERVER_START_S = 300.0  # the API server's start on a loaded 2-core machine
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'
CHROMIUM = "/usr/bin/chromium"

DAG = f"""
from airflow.sdk import DAG, TaskGroup, task
from airflow_sky import Task, sky_job

run = '''
for i in $(seq 1 {STEPS}); do
  echo "@@airflow-sky-progress/1 {{\\\\"step\\\\":$i,\\\\"total\\\\":{STEPS},\\\\"metrics\\\\":{{\\\\"loss\\\\":$((10 - i)).$SKYPILOT_NODE_RANK}}}}"
  sleep 1
done
'''
with DAG({DAG_ID!r}, schedule=None) as dag:
    sky_job(Task(name="train", num_nodes=2, run=run), cluster_name={CLUSTER!r}, down=False)
    # A job that reports nothing and whose cluster is gone at the end: no progress to show.
    sky_job(Task(name="quiet", run="echo no progress here"), cluster_name={QUIET!r}, down=True)
    with TaskGroup("other"):  # another task that happens to be named provision and push a "handle"

        @task(task_id="provision")
        def not_a_job(ti=None):
            ti.xcom_push(key="handle", value={{"cluster": "not a job handle"}})

        not_a_job()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`airflow api-server` on a free loopback port, and the tokens of its users."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [AIRFLOW, "api-server", "-H", "127.0.0.1", "-p", str(self.port), "-w", "1"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log = log

    def wait_up(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"API server not up in {SERVER_START_S} s:\n{self.log.read_text()[-3000:]}")

    def token(self, user: str) -> str:
        answer = httpx.post(
            f"{self.url}/auth/token", json={"username": user, "password": PASSWORDS[user]}, timeout=60
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["access_token"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)
        self._log.close()


@pytest.fixture(scope="module")
def stack(
    airflow_home: dict[str, str],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """A real job run to its end on a kept cluster (its records stay in the cluster's store), and the API
    server that shows it."""
    home = tmp_path_factory.mktemp("progress-api")
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    env = {
        **airflow_home,
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "progress-api-test-secret",
    }
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    for old in dags.glob("*.py"):
        old.unlink()
    (dags / f"{DAG_ID}.py").write_text(DAG)
    server: Server | None = None
    try:
        run = subprocess.run(
            [AIRFLOW, "dags", "test", DAG_ID], env=env, capture_output=True, text=True, timeout=900
        )
        assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
        server = Server(env, home / "api-server.log")
        server.wait_up()
        admin = server.token("admin")
        runs = httpx.get(
            f"{server.url}/api/v2/dags/{DAG_ID}/dagRuns", headers={"Authorization": f"Bearer {admin}"}
        )
        assert runs.status_code == 200, runs.text
        (dag_run,) = runs.json()["dag_runs"]
        yield {"server": server, "admin": admin, "run_id": dag_run["dag_run_id"], "env": env}
    finally:
        if server is not None:
            server.stop()
        for cluster in (CLUSTER, QUIET):
            LocalCloud().terminate(cluster)
            assert daemon.processes_with_marker(cluster) == []


def _api(stack: dict[str, Any], run_id: str | None = None, query: str = "") -> str:
    run = quote(run_id or stack["run_id"], safe="")
    return f"{stack['server'].url}/airflow-sky/api/v1/progress/{DAG_ID}/{run}{query}"


def _role_less_token(env: dict[str, str]) -> str:
    """A valid JWT of the deployment's auth manager for a user without any role (no access to any DAG)."""
    code = (
        "from airflow.api_fastapi.app import create_auth_manager\n"
        "from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser\n"
        "print(create_auth_manager().generate_jwt(SimpleAuthManagerUser(username='nobody', role=None)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_api_and_the_page_refuse_a_request_without_access_and_show_no_data(stack: dict[str, Any]) -> None:
    page = _api(stack).replace("/api/v1/progress/", "/progress/")
    for url in (_api(stack), page):
        anonymous = httpx.get(url, timeout=60)
        assert anonymous.status_code == 401, anonymous.text
        forged = httpx.get(url, headers={"Authorization": "Bearer not-a-jwt"}, timeout=60)
        assert forged.status_code == 403, forged.text
        assert CLUSTER not in anonymous.text + forged.text
    no_role = {"Authorization": f"Bearer {_role_less_token(stack['env'])}"}
    refused = httpx.get(_api(stack), headers=no_role, timeout=60)
    assert refused.status_code == 403, refused.text
    assert CLUSTER not in refused.text


def test_the_api_answers_404_for_a_run_the_dag_does_not_have(stack: dict[str, Any]) -> None:
    answer = httpx.get(
        _api(stack, run_id="manual__no-such-run"),
        headers={"Authorization": f"Bearer {stack['admin']}"},
        timeout=60,
    )
    assert answer.status_code == 404, answer.text
    assert "manual__no-such-run" in answer.json()["detail"]


def test_the_api_reads_a_kept_clusters_job_live_with_each_ranks_history_and_log_url(
    stack: dict[str, Any],
) -> None:
    answer = httpx.get(_api(stack), headers={"Authorization": f"Bearer {stack['admin']}"}, timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["dag_id"], body["run_id"]) == (DAG_ID, stack["run_id"])
    jobs = {job["group"]: job for job in body["jobs"]}
    assert set(jobs) == {"train", "quiet"}  # other.provision's XCom is no job handle: left out
    quiet = jobs["quiet"]  # its cluster is gone and it pushed no final progress
    assert (quiet["cluster"], quiet["source"], quiet["progress"]) == (QUIET, "none", None)
    assert list(quiet["log_urls"]) == ["0"]
    job = jobs["train"]
    assert (job["cluster"], job["infra"], job["source"]) == (CLUSTER, "local", "live")
    doc = job["progress"]
    assert doc["job_id"] == job["job_id"]
    assert (doc["step"], doc["total"], doc["percent"]) == (STEPS, STEPS, 100.0)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for row in doc["ranks"]:
        assert row["metrics"] == {"loss": float(f"{10 - STEPS}.{row['rank']}")}
        assert [point[1] for point in row["history"]][-1] == STEPS
    run = quote(stack["run_id"], safe="")
    assert job["log_urls"] == {
        str(rank): f"/dags/{DAG_ID}/runs/{run}/tasks/train.run_follow/mapped/{rank}" for rank in (0, 1)
    }
    # The UI's own way in: its session cookie; a viewer may read a DAG's runs.
    slim = httpx.get(_api(stack, query="?history=0"), cookies={"_token": stack["server"].token("viewer")})
    assert slim.status_code == 200, slim.text
    (train,) = [job for job in slim.json()["jobs"] if job["group"] == "train"]
    assert all("history" not in row for row in train["progress"]["ranks"])


def _make_hostile(job_id: int) -> None:
    """Rank 1 was relaunched (generation 1, a hostile reason) and every rank reports a hostile metric name:
    written into the kept cluster's real state store by its own writers."""
    store = open_cluster(CLUSTER, "local").state_store()
    now = time.time()
    JobStates(store).update(
        job_id,
        lambda state: state.__class__.from_dict(
            {
                **state.to_dict(),
                "generation": 1,
                "history": [
                    {
                        "generation": 1,
                        "action": "relaunch",
                        "reason": HOSTILE,
                        "replaced_ranks": [1],
                        "claimed_at": now - 30,
                        "at": now - 20,
                    }
                ],
            }
        ),
    )
    records = ProgressRecords(store)
    for rank in (0, 1):
        points = tuple(
            Point(now - 40 + s, s, 0, {HOSTILE: 1.0 / s, "loss": 5.0 - s}) for s in (1, 2, 3)
        ) + tuple(Point(now - 15 + s, s, 1, {HOSTILE: 1.0 / s, "loss": 5.0 - s}) for s in (2, 3, 4))
        records.write(
            job_id,
            RankProgress(
                rank=rank,
                generation=1,
                step=4,
                time=now,
                total=8,
                metrics={HOSTILE: 0.25, "loss": 1.5 + rank},
                history=points,
            ),
        )


@contextlib.contextmanager
def _chromium_page(stack: dict[str, Any], token: str) -> Iterator[Any]:
    """A headless Chromium page (Debian's: no browser is downloaded) holding the UI's session cookie."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            context = browser.new_context()
            context.add_cookies([{"name": "_token", "value": token, "url": stack["server"].url}])
            yield context.new_page()
        finally:
            browser.close()


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.5)


def test_the_page_shows_the_job_refreshes_and_escapes_every_value(stack: dict[str, Any]) -> None:
    token = stack["server"].token("viewer")
    answer = httpx.get(_api(stack), cookies={"_token": token}, timeout=60).json()
    (job_id,) = [job["job_id"] for job in answer["jobs"] if job["group"] == "train"]
    _make_hostile(job_id)
    url = _api(stack).replace("/api/v1/progress/", "/progress/") + "?rank=1"
    with _chromium_page(stack, token) as page:
        page.set_default_timeout(120_000)
        page.goto(url)
        root = page.locator("#sky-progress")
        _wait(lambda: root.get_attribute("data-loaded") == "true", "its first data")
        # Refreshed from the API without a reload: the count goes on.
        _wait(lambda: int(root.get_attribute("data-refreshes") or 0) >= 2, "a second refresh")
        job = page.locator(f'section.sky-job[data-cluster="{CLUSTER}"][data-job-id="{job_id}"]')
        _wait(lambda: job.locator('[data-field="generation"]').text_content() == "1", "the relaunch")
        fields = {
            name: job.locator(f'[data-field="{name}"]').first.text_content()
            for name in ("step", "total", "percent", "slowest-rank", "generation")
        }
        assert fields == {
            "step": "4",
            "total": "8",
            "percent": "50.0%",
            "slowest-rank": "0",
            "generation": "1",
        }
        assert job.locator('[data-field="eta"]').text_content()
        assert job.locator('[data-field="updated"]').text_content().endswith("ago")
        quiet = page.locator(f'section.sky-job[data-cluster="{QUIET}"]')
        assert quiet.get_attribute("data-source") == "none"
        assert quiet.locator("tr.sky-rank").count() == 0
        rows = job.locator("tr.sky-rank")
        assert rows.count() == 2
        rank1 = job.locator('tr.sky-rank[data-rank="1"]')
        assert "selected" in (rank1.get_attribute("class") or "")
        assert rank1.locator('td[data-field="step"]').text_content() == "4"
        assert rank1.locator('td[data-metric="loss"]').text_content() == "2.5"
        cells = rank1.locator("td[data-metric]").evaluate_all(
            "cells => cells.map(c => [c.getAttribute('data-metric'), c.textContent, c.children.length])"
        )
        assert sorted(cells) == sorted([[HOSTILE, "0.25", 0], ["loss", "2.5", 0]])
        log = rank1.locator('a[data-log-rank="1"]')
        assert log.get_attribute("href", timeout=5000).endswith("/tasks/train.run_follow/mapped/1")
        # One chart per metric; each rank's generations are lines of their own.
        loss_chart = job.locator('svg.sky-chart[data-metric="loss"]')
        assert loss_chart.locator("polyline").count() == 4
        assert loss_chart.locator('polyline[data-rank="1"][data-generation="0"]').count() == 1
        assert job.locator("svg.sky-chart").count() == 2
        recovery = job.locator("li.sky-recovery")
        assert recovery.count() == 1
        assert (recovery.get_attribute("data-generation"), recovery.get_attribute("data-ranks")) == ("1", "1")
        text = recovery.text_content() or ""
        assert HOSTILE in text and "s lost" in text and "1 step redone" in text
        # The hostile name and reason are text: no element was made of them, no script ran.
        assert page.locator("img").count() == 0
        assert page.evaluate("document.body.dataset.pwned") is None
        # Readable in both themes: the page follows the preference of a browser (or UI) in dark mode.
        background = "getComputedStyle(document.body).backgroundColor"
        assert page.evaluate(background) == "rgb(255, 255, 255)"
        page.emulate_media(color_scheme="dark")
        html = page.locator("html")
        _wait(lambda: html.get_attribute("data-theme") == "dark", "the dark theme")
        assert page.evaluate(background) == "rgb(17, 19, 24)"
        assert page.evaluate("getComputedStyle(document.querySelector('tr.sky-rank td')).color") == (
            "rgb(226, 232, 240)"
        )


def test_a_ranks_log_link_in_the_uis_embedded_view_opens_that_task_instance_in_the_ui(
    stack: dict[str, Any],
) -> None:
    """The UI embeds the view in a sandboxed frame that may not navigate the window; the link asks the UI's
    router instead, so the UI itself shows the rank's task instance."""
    base = stack["server"].url
    run = quote(stack["run_id"], safe="")
    with _chromium_page(stack, stack["admin"]) as page:
        page.set_default_timeout(120_000)
        page.goto(f"{base}/dags/{DAG_ID}/runs/{run}")
        page.get_by_text("Training progress", exact=True).first.click()
        frame = page.frame_locator('iframe[src*="/airflow-sky/progress/"]')
        frame.locator('#sky-progress[data-loaded="true"]').wait_for()
        frame.locator('a[data-log-rank="1"]').click()
        page.wait_for_url(f"**/dags/{DAG_ID}/runs/{run}/tasks/train.run_follow/mapped/1**")
        # The UI routed there itself: its task instance page, not the view's frame, now shows the rank.
        page.get_by_text("run_follow").first.wait_for()
        assert page.locator('iframe[src*="/airflow-sky/progress/"]').count() == 0


def test_a_terminated_clusters_job_shows_the_final_progress_its_run_pushed(stack: dict[str, Any]) -> None:
    """Last in the module: it takes the cluster down. The job's state went with it; the run's final progress
    XCom (pushed when the job ended, before the hostile records above) is what remains."""
    LocalCloud().terminate(CLUSTER)
    headers = {"Authorization": f"Bearer {stack['admin']}"}
    deadline = time.monotonic() + 120
    while True:  # the answer of the last second may still be cached
        jobs = {
            job["group"]: job for job in httpx.get(_api(stack), headers=headers, timeout=60).json()["jobs"]
        }
        job = jobs["train"]
        if job["source"] != "live" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert job["source"] == "final"
    final = job["progress"]
    assert (final["step"], final["total"], final["generation"]) == (STEPS, STEPS, 0)
    assert final["ranks"] == [
        {"rank": rank, "step": STEPS, "metrics": {"loss": float(f"{10 - STEPS}.{rank}")}} for rank in (0, 1)
    ]
    assert final["recoveries"] == []
    assert set(job["log_urls"]) == {"0", "1"}
