"""The DAGs users copy from dags/ import cleanly and have the documented shape."""

from __future__ import annotations

from pathlib import Path

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
    }
    teardown = dag.get_task("minGPT-ddp.teardown")
    assert teardown.is_teardown and dag.get_task("minGPT-ddp.provision").is_setup
    assert "minGPT-ddp.launch" in dag.get_task("minGPT-ddp.run_start").upstream_task_ids


def test_pipeline_dag_runs_prepare_then_training_then_evaluate():
    bag = DagBag(dag_folder=str(DAGS))
    dag = bag.dags["mingpt_pipeline"]
    assert "prepare" in dag.get_task("minGPT-ddp.provision").upstream_task_ids
    assert "minGPT-ddp.collect" in dag.get_task("evaluate").upstream_task_ids
    assert dag.get_task("minGPT-ddp.collect").artifacts_to.endswith("{{ ds }}/")
