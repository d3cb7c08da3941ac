"""airflow-sky on a distributed Airflow: PostgreSQL, Redis, CeleryExecutor with two workers (celery_stack.py).

Two 3-node jobs on an ssh pool of real OpenSSH servers, triggered through the REST API at once: one plain,
one whose rank 1 host is killed while its follow tasks wait in the triggerer. Consecutive phases run on
alternate workers, each with its own HOME, TMPDIR and AIRFLOW_HOME, so neither job can lean on a file one
worker wrote. Everything is read back through the REST API, as a user's monitoring would; the progress
plugin's JSON API answers the plain job's final progress through the API server.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.scheduler.stack import run_in_private_network

# The stack's own deadline, not pytest's 600 s default, bounds it: the stack driver is given up to 1200 s,
# also on a loaded machine.
pytestmark = pytest.mark.timeout(1300)

REPO = Path(__file__).resolve().parents[2]
# The suite never writes tracked files: its screenshots go to the test's temporary folder, unless
# `make screenshots` asks for the docs' own (docs/img).
DOCS_SCREENSHOTS_ENV = "AIRFLOW_SKY_DOCS_SCREENSHOTS"
SECRET = "stack-s3cret-7Qz"

PLAIN_DAG = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name="plain",
    num_nodes=3,
    setup='echo "setup on rank $SKYPILOT_SETUP_NODE_RANK"',
    run='for i in 1 2 3; do echo "rank $SKYPILOT_NODE_RANK says line $i of $SKYPILOT_NUM_NODES"; '
        'echo "@@airflow-sky-progress/1 {{\\\\"step\\\\": $i, \\\\"total\\\\": 3}}"; sleep 1; done; '
        'echo "token length ${{#API_TOKEN}}"; '
        'echo "{{\\\\"rank\\\\": $SKYPILOT_NODE_RANK}}" > "$AIRFLOW_SKY_XCOM_DIR/return.json"',
    envs={{"RUN": "{{{{ run_id }}}}"}},
    secrets={{"API_TOKEN": {SECRET!r}}},
)
with DAG("celery_plain", schedule=None, catchup=False):
    sky_job(task, cluster_name="celery-plain", infra="ssh/stack", conn_id="sky_pool")
"""

PREEMPT_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name="spot",
    num_nodes=3,
    # Generation 0 holds until the driver killed rank 1's host (once every follow task deferred): a fixed
    # sleep could end before a loaded machine started the follow tasks, and nothing would be preempted.
    run='echo "generation $AIRFLOW_SKY_RECOVERY_COUNT rank $SKYPILOT_NODE_RANK on $(whoami)"; '
        'echo \\'@@airflow-sky-progress/1 {"step": 1, "total": 2}\\'; '
        'echo "$SKYPILOT_NODE_RANK" > ~/spot-started; '
        'if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 400; fi; '
        'sleep 25; echo "done rank $SKYPILOT_NODE_RANK"',
)
with DAG("celery_preempt", schedule=None, catchup=False):
    sky_job(task, cluster_name="celery-spot", infra="ssh/stack", conn_id="sky_pool", deferrable=True,
            defer_after_s=2)
"""


def _run_stack(tmp_path: Path, config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    for need in ("redis-server", "runuser"):
        assert shutil.which(need), f"{need} is missing (scripts/bootstrap.sh installs it)"
    driver, report_path = run_in_private_network(
        [sys.executable, "-m", "tests.deploy.celery_stack"], tmp_path, config, timeout_s
    )
    assert driver.returncode == 0 and report_path.exists(), driver.stdout[-3000:] + driver.stderr[-5000:]
    return json.loads(report_path.read_text())


def _component_logs(root: Path) -> str:
    return "".join(
        f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(root.glob("*.log"))
    )


KILLED_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(name="killed", num_nodes=3, run='echo "rank $SKYPILOT_NODE_RANK up"; sleep 3600')
with DAG("celery_killed", schedule=None, catchup=False):
    sky_job(task, cluster_name="celery-killed", infra="ssh/stack", conn_id="sky_pool", deferrable=False)
"""


def run_celery_stack(tmp: Path, dags: dict[str, str], config: dict[str, Any]) -> dict[str, Any]:
    """Run celery_stack.py with these DAG files (dag_id: source) and config; its report, checked for errors."""
    root = tmp / "stack"
    (root / "dags").mkdir(parents=True)
    for dag_id, source in dags.items():
        (root / "dags" / f"{dag_id}.py").write_text(source)
    report = _run_stack(tmp, {"root": str(root), "dags": list(dags), **config}, timeout_s=1200)
    assert "error" not in report, report.get("error", "") + _component_logs(root)
    report["component_logs"] = _component_logs(root)
    return report


@pytest.fixture(scope="module")
def stack_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    shots = _screenshots_dir(tmp_path_factory)
    config = {
        "pool_size": 10,  # 3 + 3 + 3 hosts for the jobs, one spare for the recovery
        "preempt": {"dag_id": "celery_preempt", "rank": 1, "marker": "spot-started"},
        "fail_task": {"dag_id": "celery_killed", "task_id": "killed.run_follow", "map_index": 0},
        "screenshots": {"dag_id": "celery_plain", "group": "plain", "dir": str(shots)},
        "progress_api": "celery_plain",
        "progress_live": "celery_preempt",
        "timeout_s": 480,
    }
    dags = {
        "celery_plain": PLAIN_DAG,
        "celery_preempt": PREEMPT_DAG,
        "celery_killed": KILLED_DAG,
    }
    return run_celery_stack(tmp_path_factory.mktemp("celery"), dags, config)


PHASES = (
    "provision",
    "sync",
    "setup_follow",
    "launch",
    "run_follow",
    "collect",
    "teardown",
)


def _tis(report: dict[str, Any], dag_id: str, phase: str) -> list[dict[str, Any]]:
    tis = report["runs"][dag_id]["task_instances"]
    return sorted((ti for ti in tis if ti["task_id"].endswith(f".{phase}")), key=lambda ti: ti["map_index"])


def test_a_three_node_job_succeeds_with_its_phases_spread_over_two_celery_workers(stack_report):
    run = stack_report["runs"]["celery_plain"]
    assert run["state"] == "success", (
        json.dumps(run["task_instances"], indent=1) + stack_report["component_logs"]
    )
    hosts = {phase: {ti["hostname"] for ti in _tis(stack_report, "celery_plain", phase)} for phase in PHASES}
    # Provision on one worker; starting, following and tearing down on the other or alternately.
    assert hosts["provision"] == {"worker-a"} and hosts["teardown"] == {"worker-b"}
    assert hosts["sync"] == {"worker-b"} and hosts["setup_follow"] == {"worker-a"}  # setup started on b
    assert hosts["launch"] == {"worker-b"} and hosts["run_follow"] == {"worker-a"}  # the run started on b
    assert hosts["collect"] == {"worker-b"}


def test_every_rank_log_read_through_the_rest_api_holds_that_ranks_own_lines(stack_report):
    logs = stack_report["runs"]["celery_plain"]["logs"]
    follows = _tis(stack_report, "celery_plain", "run_follow")
    assert [ti["map_index"] for ti in follows] == [0, 1, 2]
    for ti in follows:
        log = logs[f"{ti['task_id']}[{ti['map_index']}]"]
        rank = ti["map_index"]
        assert f"rank {rank} says line 3 of 3" in log, log
        assert all(f"rank {other} says" not in log for other in {0, 1, 2} - {rank}), log
        assert ti["rendered_map_index"].startswith(f"rank {rank} · 127.0.")
        assert SECRET not in log and "token length 16" in log
    for ti in _tis(stack_report, "celery_plain", "setup_follow"):
        assert f"setup on rank {ti['map_index']}" in logs[f"{ti['task_id']}[{ti['map_index']}]"]


def test_the_ui_shows_the_rendered_spec_with_secrets_masked_the_node_link_and_the_connection_type(
    stack_report,
):
    rendered = stack_report["runs"]["celery_plain"]["rendered_fields"]
    assert "rank $SKYPILOT_NODE_RANK says line" in rendered["sky_task.run"]
    assert rendered["sky_task.envs"]["RUN"] == stack_report["runs"]["celery_plain"]["run_id"]  # rendered
    assert rendered["sky_task.secrets"] == {"API_TOKEN": "***"}
    assert SECRET not in json.dumps(rendered)
    assert "sky_ssh_pool" in stack_report["connection_types"]  # the UI offers the provider's connection type
    # An ssh host has no cloud console: the node link is there, without a URL.
    assert stack_report["runs"]["celery_plain"]["extra_links"]["extra_links"] == {"Node console": None}


def test_a_host_lost_under_a_deferred_follow_is_replaced_once_and_the_job_succeeds(stack_report):
    run = stack_report["runs"]["celery_preempt"]
    assert "preempted" in stack_report, "the rank 1 host was never killed"
    assert run["state"] == "success", (
        json.dumps(run["task_instances"], indent=1) + stack_report["component_logs"]
    )
    follows = _tis(stack_report, "celery_preempt", "run_follow")
    logs = {ti["map_index"]: run["logs"][f"{ti['task_id']}[{ti['map_index']}]"] for ti in follows}
    joined = "\n".join(logs.values())
    assert "generation 1 rank 1" in joined and "generation 2" not in joined  # exactly one recovery
    lost = stack_report["preempted"]["address"]
    assert f"Replacing the node of rank 1 ({lost}" in joined  # by whichever follow task led the relaunch
    for rank, log in logs.items():
        assert "waiting in the triggerer" in log
        # Printed while the task waited in the triggerer: the trigger's lines are in the task's own log.
        assert f"done rank {rank}" in log, log


def test_nothing_is_left_running_or_locked_on_the_hosts(stack_report):
    assert stack_report["leftover_processes"] == []
    # Only the killed host still holds the lock of the cluster it left (it came back after the teardown).
    assert stack_report["locked_hosts"] == [stack_report["preempted"]["address"]]


def test_the_progress_plugin_reads_a_running_job_live_through_its_ssh_pool_connection(stack_report):
    # Read while the job's ranks ran and their follow tasks waited in the triggerer: the pool exists only as
    # the Airflow connection the job named (conn_id="sky_pool"), which its provision task handed the plugin.
    api = stack_report["progress_live"]
    assert api["status"] == 200, api
    (job,) = api["body"]["jobs"]
    assert (job["group"], job["cluster"], job["source"]) == ("spot", "celery-spot", "live"), job
    ranks = job["progress"]["ranks"]
    assert [(r["rank"], r["step"]) for r in ranks] == [(0, 1), (1, 1), (2, 1)], job


def test_the_progress_plugin_answers_for_a_finished_run_through_the_api_server(stack_report):
    api = stack_report["progress_api"]
    assert api["status"] == 200, api
    (job,) = api["body"]["jobs"]
    assert (job["group"], job["cluster"]) == ("plain", "celery-plain"), job
    # Each rank reported steps 1..3: the job's last progress, read live or from its final XCom.
    assert job["source"] in ("final", "live") and job["progress"]["step"] == 3, job
    assert sorted(job["log_urls"]) == ["0", "1", "2"] and "run_follow" in job["log_urls"]["1"], job
    assert api["forged_status"] == 403, api  # Airflow's auth refuses a token it did not sign


def _screenshots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get(DOCS_SCREENSHOTS_ENV) == "1":
        return REPO / "docs" / "img"
    return tmp_path_factory.mktemp("screenshots")


def test_the_ui_renders_the_grid_and_a_rank_log_in_a_real_browser(stack_report):
    assert stack_report["screenshots"] == {"grid": "", "log": ""}
    shots = Path(stack_report["screenshots_dir"])
    for name in ("grid.png", "rank-log.png"):
        png = shots / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_a_follow_task_marked_failed_cancels_the_job_and_the_teardown_still_frees_every_host(stack_report):
    run = stack_report["runs"]["celery_killed"]
    assert "marked_failed_at_s" in stack_report, "the follow task was never marked failed"
    states = {
        (ti["task_id"].rsplit(".", 1)[-1], ti["map_index"]): ti["state"] for ti in run["task_instances"]
    }
    assert run["state"] == "failed"
    assert states[("run_follow", 0)] == "failed"
    # The other ranks were stopped, not left to sleep out their 3600 s (the stack's deadline is 480 s for all
    # runs, so a run that ended at all was cancelled), and the teardown ran.
    assert {states[("run_follow", 1)], states[("run_follow", 2)]} <= {"failed", "upstream_failed"}
    assert states[("teardown", -1)] == "success", states
    logs = "\n".join(run["logs"].values())
    # Cancelled by the marked task's on_kill, or (marked before it ran) by a sibling that saw it failed.
    assert (
        "Task killed: cancelling job" in logs
        or "Cancelling job 1: a follow task of the job was failed" in logs
    )
    assert "CANCELLED: cancelled (" in logs
    # test_nothing_is_left_running_or_locked_on_the_hosts: no process and no lock of it is left.
