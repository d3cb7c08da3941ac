"""Jobs wider than Airflow's default limits complete on the CeleryExecutor stack (celery_stack.py).

Two 24-node jobs on an ssh pool of 48 real OpenSSH servers, against `max_active_tasks_per_dag` = 16 and
Celery's default 16 slots per worker (both untouched here): a phase's 24 mapped task instances cannot all
run at once. The start/follow split makes that harmless: every rank is started by quick tasks before any
follow task waits, so the ranks never wait on a slot for each other. Blocking follow tasks take turns in the
slots; deferrable ones wait in the triggerer and hold none.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from tests.deploy.test_celery_deployment import run_celery_stack

# The stack's own deadline, not pytest's 600 s default, bounds it: run_celery_stack waits up to 1200 s for the stack,
# also on a loaded machine.
pytestmark = pytest.mark.timeout(1300)

NODES = 24
DEFAULT_MAX_ACTIVE_TASKS_PER_DAG = 16

WIDE_JOB = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name="wide",
    num_nodes={nodes},
    run='echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"; {wait}; echo "rank $SKYPILOT_NODE_RANK done"',
)
with DAG({dag_id!r}, schedule=None) as dag:
    sky_job(task, cluster_name={dag_id!r}, infra="ssh/stack", conn_id="sky_pool", deferrable={deferrable!r},
            defer_after_s=0, setup=False)
"""
# The deferrable job's ranks run until the driver saw one of its follow tasks deferred (a follow task that
# starts after its rank ended has nothing to wait for, as on a loaded machine), at most 5 minutes.
RELEASE_WAIT = "for _ in $(seq 300); do [ -e {release} ] && break; sleep 1; done"


def _max_concurrent(tis: list[dict[str, Any]]) -> int:
    """The most of these task instances that ran at one moment (from their start and end dates)."""
    events = []
    for ti in tis:
        events.append((datetime.fromisoformat(ti["start_date"]), 1))
        events.append((datetime.fromisoformat(ti["end_date"]), -1))
    running = peak = 0
    for _, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("wide")
    release = tmp / "release-wide-deferrable"
    waits = {
        "wide_blocking": (False, "sleep 10"),
        "wide_deferrable": (True, RELEASE_WAIT.format(release=release)),
    }
    dags = {
        dag_id: WIDE_JOB.format(nodes=NODES, dag_id=dag_id, deferrable=deferrable, wait=wait)
        for dag_id, (deferrable, wait) in waits.items()
    }
    config = {
        "pool_size": 2 * NODES,
        "pool_prefix": "wide",
        "log_phases": ["run_follow"],
        # Two 24-node jobs on 48 sshd hosts of a 2-core machine, each host reset to its baseline as it is
        # taken and freed (infra.ssh.login_baseline): 600 s left too little once the suite loads the machine.
        "timeout_s": 900,
        "release_when_deferred": {"dag_id": "wide_deferrable", "file": str(release)},
    }
    return run_celery_stack(tmp, dags, config)


def test_a_24_node_job_completes_under_the_default_task_limits_deferrable_or_blocking(wide_report):
    for dag_id, run in wide_report["runs"].items():
        context = json.dumps(run["task_instances"], indent=1)[:4000] + wide_report["component_logs"]
        assert run["state"] == "success", f"{dag_id}: {context}"
        follows = [ti for ti in run["task_instances"] if ti["task_id"] == "wide.run_follow"]
        assert len(follows) == NODES and all(ti["state"] == "success" for ti in follows), dag_id
        for ti in follows:
            assert f"rank {ti['map_index']} done" in run["logs"][f"wide.run_follow[{ti['map_index']}]"]
    print(f"2 runs of {NODES} nodes in {wide_report['run_s']:.0f}s")


def test_the_limit_did_bind_and_deferred_follow_tasks_held_no_slot(wide_report):
    blocking = [ti for ti in wide_report["runs"]["wide_blocking"]["task_instances"] if ti["start_date"]]
    follows = [ti for ti in blocking if ti["task_id"] == "wide.run_follow"]
    # Never more than 16 of the job's tasks at once, so the 24 blocking follow tasks took turns.
    assert _max_concurrent(blocking) <= DEFAULT_MAX_ACTIVE_TASKS_PER_DAG < len(follows)
    # Deferrable follow tasks waited in the triggerer (their ranks ran until one had deferred).
    deferred = wide_report["runs"]["wide_deferrable"]["logs"]
    assert any("waiting in the triggerer" in log for log in deferred.values())


def test_nothing_is_left_on_the_48_hosts(wide_report):
    assert wide_report["leftover_processes"] == []
    assert wide_report["locked_hosts"] == []
