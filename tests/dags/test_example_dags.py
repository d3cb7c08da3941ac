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
        "setup_follow",
        "launch",
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
        for step in ("provision", "sync", "launch", "collect", "teardown")
    )
    # Every barrier is an edge: setup waits for every node's sync, the run (started by launch) for every setup.
    # (provision is upstream of each too: they read its XCom.)
    assert dag.get_task("minGPT-ddp.setup_follow").upstream_task_ids - {"minGPT-ddp.provision"} == {
        "minGPT-ddp.sync"
    }
    assert dag.get_task("minGPT-ddp.launch").upstream_task_ids - {"minGPT-ddp.provision"} == {
        "minGPT-ddp.setup_follow"
    }
    assert dag.get_task("minGPT-ddp.run_follow").upstream_task_ids - {"minGPT-ddp.provision"} == {
        "minGPT-ddp.launch"
    }


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


def test_a_job_wider_than_max_map_length_is_refused_when_the_dag_is_parsed(monkeypatch):
    from airflow.sdk import DAG

    from airflow_sky import Task, sky_job
    from airflow_sky.errors import SpecError

    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "8")
    with DAG("fits"):
        sky_job(Task(run="true", num_nodes=8))  # exactly the limit is fine
    with pytest.raises(SpecError, match=r"num_nodes: 9 nodes .* max_map_length \(8\)"), DAG("wide"):
        sky_job(Task(run="true", num_nodes=9))


def test_per_node_tasks_carry_the_node_console_link_and_the_provider_registers_it():
    from airflow.sdk import DAG

    from airflow_sky import Task, sky_job
    from airflow_sky.operators.links import SkyNodeConsoleLink
    from airflow_sky.provider import get_provider_info

    with DAG("links") as dag:
        sky_job(Task(name="j", run="true", num_nodes=2))
    linked = {
        t.task_id for t in dag.tasks if any(isinstance(x, SkyNodeConsoleLink) for x in t.operator_extra_links)
    }
    assert linked == {f"j.{p}" for p in ("sync", "setup_follow", "run_follow")}
    assert "airflow_sky.operators.links.SkyNodeConsoleLink" in get_provider_info()["extra-links"]
    link = SkyNodeConsoleLink()
    url = "https://eu-west-1.console.aws.amazon.com/ec2/home?region=eu-west-1#InstanceDetails:instanceId=i-1"
    assert link.get_link(type("Op", (), {"node": {"console_url": url}})(), ti_key=None) == url
    assert link.get_link(type("Op", (), {"node": {"rank": 0}})(), ti_key=None) == ""  # local, ssh: none
