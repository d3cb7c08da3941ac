"""Watching a training job in the Airflow UI (issue 31's "done when"), in a real browser, under a real Airflow.

A 2-node minGPT job (examples/mingpt, real torchrun DDP on the local infra) runs under `airflow standalone`
(scheduler, dag-processor, triggerer, API server with the airflow-sky plugin) in a private network namespace;
its run follow tasks defer at once, so the triggerer's triggers collect the progress. Headless Chromium
signs in with the auth manager's password and watches the plugin's progress view: each rank's step and
loss advance, with its rate and the job's ETA; rank 1's node is preempted; the view shows the recovery and
both ranks advancing again. See progress_driver.py for what it does, step by step; the assertions are here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_sky.infra.local import daemon
from tests.scheduler.stack import REPO, run_in_private_network, terminate_clusters
from tests.ui.progress_page import number

pytest.importorskip("torch")

# The stack's own deadlines bound it (each wait of the driver gives up after its timeout_s): the driver is
# given up to 1500 s on a loaded machine.
pytestmark = pytest.mark.timeout(1600)

CLUSTER = "progress-view"
DAG_ID = "progress_view_mingpt"
# `make screenshots` refreshes docs/img/progress-view.png; the suite itself never writes tracked files.
DOCS_SCREENSHOTS_ENV = "AIRFLOW_SKY_DOCS_SCREENSHOTS"
# A small model (~8 steps/s on an idle core per rank): enough steps to watch the ranks advance before and
# after a recovery even on an idle machine; a snapshot every 20 steps, so the relaunch resumes from one.
ENVS = {"MAX_STEPS": "300", "SNAPSHOT_EVERY": "20", "LOG_EVERY": "10", "SEED": "7"}
DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task.from_yaml({yaml!r})
task.update_envs({envs!r})
# A preempted node is replaced and the job relaunched (FAILOVER: on the same infra).
task.set_resources({{"cpus": "1+", "job_recovery": {{"strategy": "FAILOVER"}}}})
with DAG({dag_id!r}, schedule=None) as dag:
    # The run follow tasks wait in the triggerer at once: its triggers collect the ranks' progress.
    sky_job(task, cluster_name={cluster!r}, deferrable=True, defer_after_s=0)
"""


def _screenshot_path(tmp_path: Path) -> Path:
    if os.environ.get(DOCS_SCREENSHOTS_ENV) == "1":
        return REPO / "docs" / "img" / "progress-view.png"
    return tmp_path / "progress-view.png"


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The driver's report of one run (it runs once for every test of this file); the cluster torn down."""
    tmp = tmp_path_factory.mktemp("progress-view")
    home = tmp / "airflow"
    (home / "dags").mkdir(parents=True)
    yaml = REPO / "examples" / "mingpt" / "train.yaml"
    (home / "dags" / f"{DAG_ID}.py").write_text(
        DAG.format(yaml=str(yaml), envs=ENVS, dag_id=DAG_ID, cluster=CLUSTER)
    )
    config = {
        "home": str(home),
        "dag_id": DAG_ID,
        "cluster": CLUSTER,
        "num_nodes": 2,
        "preempt_rank": 1,
        "reads": 2,
        "timeout_s": 600,
        "screenshot": str(_screenshot_path(tmp)),
    }
    try:
        driver, report_path = run_in_private_network(
            [sys.executable, "-m", "tests.ui.progress_driver"], tmp, config, timeout_s=1500
        )
        log_path = home / "standalone.log"
        log = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
        assert driver.returncode == 0 and report_path.exists(), driver.stdout + driver.stderr[-5000:] + log
        report: dict[str, Any] = json.loads(report_path.read_text())
        report["context"] = json.dumps(report, indent=1)[-12000:] + "\n--- standalone.log\n" + log
        report["leftover"] = [p.pid for p in daemon.processes_with_marker(CLUSTER)]
        return report
    finally:
        terminate_clusters(CLUSTER)  # a failed run leaves its nodes up


def _reads(report: dict[str, Any], when: str) -> dict[int, list[list[float]]]:
    return {int(rank): reads for rank, reads in report["reads"][when].items()}


def _assert_rates_and_eta_shown(job: dict[str, Any]) -> None:
    """While the job runs: each rank's rate (steps/s of its generation) and the job's ETA are shown."""
    for rank, row in job["ranks"].items():
        rate = number(row["rate"])
        assert rate is not None and rate > 0, (rank, row)
    assert any(c.isdigit() for c in job["fields"]["eta"] or ""), job["fields"]  # e.g. "1m 8s", not a dash


def test_the_api_refuses_a_request_without_airflow_auth_and_answers_the_run_with_it(
    watched: dict[str, Any],
) -> None:
    api = watched.get("api", {}).get("running")
    assert api, watched["context"]
    assert (api["anonymous_status"], api["forged_status"]) == (401, 403), api  # no token; a forged one
    assert api["status"] == 200, api
    assert api["body"]["dag_id"] == DAG_ID and api["body"]["run_id"] == watched["run_id"]
    assert api["unknown_run_status"] == 404


def test_the_view_shows_each_rank_advancing_with_its_loss(watched: dict[str, Any]) -> None:
    assert "before" in watched.get("reads", {}), watched["context"]
    before = _reads(watched, "before")
    assert sorted(before) == [0, 1] and "views" in watched, watched["context"]
    for rank, reads in before.items():
        steps = [step for step, _ in reads]
        assert len(steps) >= 2 and steps == sorted(set(steps)), (rank, reads)  # strictly growing
        assert all(isinstance(loss, float) and 0 < loss < 10 for _, loss in reads), (rank, reads)
    job = next(job for job in watched["views"]["before"]["jobs"] if job["cluster"] == CLUSTER)
    assert watched["views"]["before"]["loaded"] and watched["views"]["before"]["refreshes"] >= 2
    assert job["fields"]["generation"] == "0" and job["fields"]["total"] == ENVS["MAX_STEPS"], job
    assert job["charts"].get("loss", 0) >= 1, job["charts"]  # a loss chart, a line per rank
    _assert_rates_and_eta_shown(job)
    for shown in ("0", "1"):  # a link to that rank's run follow task instance (its log) in the Airflow UI
        log = str(job["ranks"][shown]["log"])
        assert log.endswith(f"/runs/{watched['run_id']}/tasks/minGPT-ddp.run_follow/mapped/{shown}"), log


def test_a_preempted_rank_shows_as_a_recovery_and_every_rank_advances_again(watched: dict[str, Any]) -> None:
    assert "after" in watched.get("reads", {}) and "recovered" in watched["views"], watched["context"]
    job = next(job for job in watched["views"]["recovered"]["jobs"] if job["cluster"] == CLUSTER)
    recovery = next(r for r in job["recoveries"] if r["generation"] == "1")
    assert "1" in recovery["ranks"].split(","), recovery
    assert recovery["text"], recovery  # when, which ranks, time lost, steps redone
    assert job["fields"]["generation"] == "1"
    _assert_rates_and_eta_shown(job)
    for rank, reads in _reads(watched, "after").items():
        steps = [step for step, _ in reads]
        assert len(steps) >= 2 and steps == sorted(set(steps)), (rank, reads)
    shot = Path(watched["screenshot"])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_dag_run_page_offers_the_view_and_the_job_ends_with_its_final_progress(
    watched: dict[str, Any],
) -> None:
    assert "error" not in watched, watched["context"]
    assert watched["external_view"]["registered"], watched["external_view"]
    assert f"/airflow-sky/progress/{DAG_ID}/" in watched["external_view"]["opened"]
    assert watched["state"] == "success", watched["context"]
    ended = watched["api"]["ended"]["body"]
    (job,) = [job for job in ended["jobs"] if job["cluster"] == CLUSTER]
    assert job["source"] in ("final", "live") and job["progress"]["step"] == int(ENVS["MAX_STEPS"]), job
    assert watched["leftover"] == [], "the job's nodes left processes behind"
