"""A DAG run whose whole Airflow dies mid-job leaves nothing running: the nodes' idle switch ends them.

On the CeleryExecutor stack (celery_stack.py), a 2-node job on the local infra (one machine's nodes, shared
by both workers) with `autostop: {idle_minutes: 0, down: true}`. Once its ranks run, every Airflow process
is SIGKILLed at once (a lost scheduler machine): no teardown can run, no task's on_kill either. The ranks
end, and each node's watcher, which needs no Airflow, removes its node.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from tests.deploy.test_celery_deployment import run_celery_stack

ABANDONED_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job
from airflow_sky.task import Resources

task = Task(
    name="abandoned",
    num_nodes=2,
    run='echo "rank $SKYPILOT_NODE_RANK up"; sleep 30',
    resources=Resources(autostop={"idle_minutes": 0, "down": True}),
)
with DAG("celery_abandoned", schedule=None, catchup=False):
    sky_job(task, cluster_name="celery-abandoned", deferrable=False)
"""
CLUSTER = "celery-abandoned"


@pytest.fixture(scope="module")
def abandoned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = {
        "pool_size": 1,  # no job of this module uses the ssh pool
        "pool_prefix": "aband",
        "abandon": {"dag_id": "celery_abandoned", "cluster": CLUSTER},
        "timeout_s": 300,
    }
    return run_celery_stack(tmp_path_factory.mktemp("abandoned"), {"celery_abandoned": ABANDONED_DAG}, config)


@pytest.mark.timeout(1200)  # the stack, the job, then two idle rounds of the nodes' watcher
def test_a_run_whose_airflow_died_mid_job_is_stopped_by_the_idle_switch(abandoned, monkeypatch):
    from airflow_sky.infra.local import daemon
    from airflow_sky.infra.local.cloud import LocalCloud

    assert abandoned["abandoned"]["cluster"] == CLUSTER  # killed while its follow tasks ran
    monkeypatch.setenv("AIRFLOW_SKY_LOCAL_ROOT", abandoned["local_root"])
    try:
        # Nothing of Airflow is left to tear it down: the job ends, and autostop (idle 0, down) removes it.
        deadline = time.monotonic() + 360
        while daemon.processes_with_marker(CLUSTER) and time.monotonic() < deadline:
            time.sleep(2)
        assert daemon.processes_with_marker(CLUSTER) == []
    finally:
        with contextlib.suppress(Exception):
            LocalCloud().terminate(CLUSTER)
