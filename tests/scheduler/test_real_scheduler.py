"""A job under a real Airflow: scheduler + dag-processor + triggerer + API server (`airflow standalone`).

`airflow dags test` runs one task instance at a time; a real scheduler runs the mapped follow tasks of
every rank at once, and deferrable follow tasks wait in the triggerer. This proves the job's behaviour
there: ranks followed concurrently and deferred, a preempted worker recovered by exactly one leader, the
head's return.json reaching a downstream task through XCom, nothing left running. The stack runs in a private network namespace
(`unshare --net`, see stack_driver.py), so its servers are reachable from nowhere else.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon
from tests.scheduler.stack import run_stack, terminate_clusters

# The stack's own deadline, not pytest's 600 s default, bounds it: run_stack waits up to 900 s,
# also on a loaded machine.
pytestmark = pytest.mark.timeout(1000)

CLUSTER = "real-sched"

DAG = """
from airflow.sdk import DAG, task
from airflow_sky import Task, job_result, sky_job

job_task = Task(
    name="realsched",
    num_nodes=2,
    envs={{"PROBE": {probe!r}}},
    setup='sleep 2',
    run='''
echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT $(echo "$SKYPILOT_NODE_IPS" | tail -n1)" >> "$PROBE/starts"
echo "rank $SKYPILOT_NODE_RANK running"
sleep 20
mkdir -p "$AIRFLOW_SKY_XCOM_DIR"
printf '{{"rank": %s, "recoveries": %s}}' "$SKYPILOT_NODE_RANK" "$AIRFLOW_SKY_RECOVERY_COUNT" > "$AIRFLOW_SKY_XCOM_DIR/return.json"
''',
)

with DAG("real_scheduler_job", schedule=None) as dag:
    # Defer at once (the trigger's minimum wait is the default): the follow tasks must wait in the triggerer.
    job = sky_job(job_task, cluster_name={cluster!r}, deferrable=True, defer_after_s=0)

    @task
    def evaluate(result):
        return result

    evaluate(job_result(job))
"""


def _overlap(a: dict[str, str], b: dict[str, str]) -> bool:
    start = max(datetime.fromisoformat(a["start_date"]), datetime.fromisoformat(b["start_date"]))
    end = min(datetime.fromisoformat(a["end_date"]), datetime.fromisoformat(b["end_date"]))
    return start < end


def test_real_scheduler_defers_ranks_concurrently_recovers_a_preempted_worker_once_and_hands_off_xcom(
    tmp_path: Path,
):
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    probe = tmp_path / "probe"
    probe.mkdir()
    (home / "dags" / "real_scheduler_job.py").write_text(DAG.format(probe=str(probe), cluster=CLUSTER))
    config = {
        "home": str(home),
        "dag_id": "real_scheduler_job",
        "xcom_task_id": "evaluate",
        # Preempt while both run follow tasks wait in the triggerer: the triggers must wake them up.
        "preempt": {
            "cluster": CLUSTER,
            "rank": 1,
            "probe": str(probe / "starts"),
            "lines": 2,
            "after_deferred": "realsched.run_follow",
        },
        "timeout_s": 420,
    }
    try:
        report, log = run_stack(tmp_path, config, timeout_s=900)
        context = json.dumps(report, indent=1) + "\n" + log[-8000:]
        assert "error" not in report, context
        assert report["state"] == "success", context
        tis = {(ti["task_id"], ti["map_index"]): ti for ti in report["task_instances"]}
        assert all(ti["state"] == "success" for ti in tis.values()), context

        # The scheduler ran both ranks' follow tasks at the same time; they waited in the triggerer.
        follow = [tis[("realsched.run_follow", rank)] for rank in (0, 1)]
        assert _overlap(*follow), context
        assert ["realsched.run_follow", "deferred"] in report["seen_states"], context

        # One recovery, led once: each rank started exactly once per generation, rank 1 on a new node.
        starts = [line.split() for line in (probe / "starts").read_text().splitlines()]
        assert sorted((s[1], s[0]) for s in starts) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], (
            starts
        )
        worker_ip = {s[1]: s[2] for s in starts}
        assert worker_ip["0"] != worker_ip["1"], starts

        # The head's return.json reached the downstream task.
        assert report["xcom"] in ({"rank": 0, "recoveries": 1}, json.dumps({"rank": 0, "recoveries": 1})), (
            context
        )
        assert daemon.processes_with_marker(CLUSTER) == []
    finally:
        terminate_clusters(CLUSTER)  # a failed run leaves its nodes up
