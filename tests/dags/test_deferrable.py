"""Deferrable follow tasks (`sky_job(..., deferrable=True)`): the wait happens in a trigger, not a worker.

`airflow dags test` runs each deferred task's trigger inline until it fires, so these prove the trigger
and the resume path end to end on real nodes; tests/scheduler proves them under a real triggerer.
"""

from __future__ import annotations

import time

from airflow_sky.infra.local import daemon

DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(name={name!r}, num_nodes={nodes}, setup={setup!r}, run={run!r}, secrets={{"TOKEN": "tok-3141-secret"}})
with DAG({name!r}, schedule=None) as dag:
    sky_job(task, cluster_name={name!r} + "-c", deferrable=True, defer_after_s=0, trigger_min_wait_s=0)
"""


def test_deferred_followers_log_every_line_once_and_succeed(run_dag):
    run = 'for i in 1 2 3; do echo "tick $SKYPILOT_NODE_RANK $i token=$TOKEN"; sleep 1; done'
    source = DAG.format(
        name="deferred", nodes=2, setup='echo "setup on $SKYPILOT_SETUP_NODE_RANK"; sleep 2', run=run
    )
    result = run_dag("deferred", source)
    assert result.returncode == 0, result.digest
    assert "waiting in the triggerer" in result.output
    for rank in (0, 1):
        assert result.output.count(f"setup on {rank}") == 1, result.digest
        for i in (1, 2, 3):
            assert result.output.count(f"tick {rank} {i} token=***") == 1, result.digest
    assert "tok-3141-secret" not in result.output
    assert daemon.processes_with_marker("deferred-c") == []


def test_deferred_followers_wake_up_to_fail_fast(run_dag, tmp_path):
    run = (
        f'if [ "$SKYPILOT_NODE_RANK" = 2 ]; then sleep 3; date +%s.%N > {str(tmp_path / "failed-at")!r}; exit 3; fi; '
        "sleep 3600"
    )
    result = run_dag("deferredff", DAG.format(name="deferredff", nodes=3, setup="true", run=run))
    finished = time.time()
    assert result.returncode != 0
    assert "rank 2 failed with exit code 3; killed the processes on the other nodes" in result.output
    assert result.output.count("killed: rank 2 failed with exit code 3") >= 2
    failed_at = float((tmp_path / "failed-at").read_text())
    assert finished - failed_at < 60, "the deferred followers did not wake up on the failure"
    assert daemon.processes_with_marker("deferredff-c") == []


def test_trigger_serializes_to_what_rebuilds_it():
    from airflow.sdk.module_loading import import_string

    from airflow_sky.triggers import SkyFollowTrigger

    trigger = SkyFollowTrigger(
        cluster_name="c",
        infra="local",
        conn_id=None,
        nodes=[{"rank": 0, "internal_ip": "127.0.0.2"}],
        rank=0,
        job_id=1,
        phase="run",
        generation=2,
        owner="dag/run/job.run_follow/0",
        offset=128,
        job_recovery={"max_restarts_on_errors": 1},
        max_recoveries=2,
        secrets={"TOKEN": "x"},
        min_wait_s=15.0,
    )
    classpath, kwargs = trigger.serialize()
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert classpath == "airflow_sky.triggers.follow.SkyFollowTrigger"
