"""The DAGs users copy from dags/ import cleanly and have the documented shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_example_dags_import_without_errors():
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert {"mingpt_ddp", "mingpt_pipeline"} <= set(bag.dags)


def test_mingpt_dag_has_one_task_per_phase_in_order():
    bag = DagBag(dag_folder=str(DAGS))
    dag = bag.dags["mingpt_ddp"]
    ids = {t.task_id.split(".", 1)[1] for t in dag.tasks}
    assert ids == {
        "provision",
        "sync",
        "setup_start",
        "setup_follow",
        "launch",
        "run_start",
        "run_follow",
        "collect",
        "teardown",
        "terminated",
    }
    teardown = dag.get_task("minGPT-ddp.teardown")
    assert teardown.is_teardown and dag.get_task("minGPT-ddp.provision").is_setup
    # A teardown that fails (a cluster left running) fails the run through the leaf after it.
    assert dag.get_task("minGPT-ddp.terminated").upstream_task_ids == {"minGPT-ddp.teardown"}
    # Every step but the user's own scripts has a deadline.
    assert all(
        dag.get_task(f"minGPT-ddp.{step}").execution_timeout is not None
        for step in ("provision", "sync", "setup_start", "launch", "run_start", "collect", "teardown")
    )
    assert "minGPT-ddp.launch" in dag.get_task("minGPT-ddp.run_start").upstream_task_ids


def test_pipeline_dag_runs_prepare_then_training_then_evaluate():
    bag = DagBag(dag_folder=str(DAGS))
    dag = bag.dags["mingpt_pipeline"]
    assert "prepare" in dag.get_task("minGPT-ddp.provision").upstream_task_ids
    assert "minGPT-ddp.collect" in dag.get_task("evaluate").upstream_task_ids
    assert dag.get_task("minGPT-ddp.collect").artifacts_to.endswith("{{ ds }}/")


def test_conn_id_on_the_local_infra_is_refused_when_the_dag_is_parsed():
    from airflow.sdk import DAG

    from airflow_sky import Task, sky_job
    from airflow_sky.errors import SpecError

    with pytest.raises(SpecError, match="conn_id: the local infra takes no Airflow connection"), DAG("c"):
        sky_job(Task(run="true"), conn_id="my_aws")
