"""The resume-after-defer race of Airflow 3.3, under a real scheduler (`airflow standalone`, see stack_driver.py).

A trigger that fires before the scheduler processed the exit of the attempt that deferred gets the resumed
task failed ("Executor reported that the task instance ... finished with state success, but the task
instance's state attribute is queued"; apache/airflow #66374, #71580, #72716). Short phases hit it most.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon
from airflow_sky.operators.provision import default_cluster_name
from tests.scheduler.stack import run_stack, terminate_clusters

# The stack's own deadline, not pytest's 600 s default, bounds it: run_stack waits up to 1500 s,
# also on a loaded machine.
pytestmark = pytest.mark.timeout(1600)

# Runs of each DAG. Before the trigger's minimum wait, two runs in three failed: three catch a regression.
RUNS = 3

SHORT_JOB = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

# Setup is the short phase the race needs; the run is long enough that its follow tasks start before it
# ends even on a loaded machine, so every run defers (a test that deferred nothing would prove nothing).
task = Task(name="short", num_nodes=4, setup="sleep 5", run="sleep 12")
# One run of each DAG at a time: two cores serve the scheduler, the API server, the triggerer and 8 nodes.
with DAG({dag_id!r}, schedule=None, max_active_runs=1) as dag:
    sky_job(task, deferrable={deferrable!r}{extra})
"""


def test_short_phases_never_lose_to_the_resume_after_defer_race_deferrable_or_blocking(tmp_path: Path):
    """Airflow 3.3 fails a resumed task when its trigger fired before the scheduler processed the deferring
    attempt's exit (apache/airflow #66374, #72716): with 5 s phases, two runs in three failed so.

    Deferrable runs defer at once here (defer_after_s=0), so only the trigger's minimum wait protects them.
    """
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    dags = {"short_deferrable": (True, ", defer_after_s=0"), "short_blocking": (False, "")}
    for dag_id, (deferrable, extra) in dags.items():
        (home / "dags" / f"{dag_id}.py").write_text(
            SHORT_JOB.format(dag_id=dag_id, deferrable=deferrable, extra=extra)
        )
    config = {"home": str(home), "batch": dict.fromkeys(dags, RUNS), "timeout_s": 1200}
    try:
        report, log = run_stack(tmp_path, config, timeout_s=1500)
        assert "error" not in report, json.dumps(report, indent=1)[:8000] + log[-8000:]
        failed = [
            (run["dag_id"], run["run_id"], [ti for ti in run["task_instances"] if ti["state"] != "success"])
            for run in report["runs"]
            if run["state"] != "success"
        ]
        mismatches = log.count("finished with state success, but the task instance's state attribute is")
        assert not failed, (
            f"{len(failed)}/{2 * RUNS} runs failed ({mismatches} state mismatches): {failed}\n{log[-8000:]}"
        )
        assert len(report["runs"]) == 2 * RUNS
        logs_dir = home / "logs" / "dag_id=short_deferrable"
        task_logs = [p.read_text(errors="replace") for p in logs_dir.rglob("*.log")]
        deferrals = sum(text.count("waiting in the triggerer") for text in task_logs)
        # 8 follow tasks per run; one that starts after its phase's verdict (a loaded machine: CI runs five
        # test files at once on two CPUs) has nothing to wait for. The 12 s run makes at least one per run.
        assert deferrals >= RUNS, f"only {deferrals} deferrals in the deferrable runs' follow tasks"
        print(
            f"{2 * RUNS}/{2 * RUNS} runs succeeded in {report['run_s']:.0f}s: {deferrals} deferrals, {mismatches} state mismatches"
        )
        for run in report["runs"]:
            cluster = default_cluster_name(run["dag_id"], run["run_id"])
            assert daemon.processes_with_marker(cluster) == [], f"{cluster} left processes behind"
    finally:
        terminate_clusters("short-")  # a failed or aborted run leaves its nodes up
