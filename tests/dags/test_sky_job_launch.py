"""sky_job takes a whole launch description (task.launch.Launch): the engine's DAG is built from it, with
every option on the operators, and a launch given with the keywords it replaces is refused."""

from __future__ import annotations

import dataclasses

import pytest
from airflow.sdk import DAG

from airflow_sky import Task, sky_job
from airflow_sky.client.engine import launch_dag
from airflow_sky.errors import SpecError
from airflow_sky.operators.provision import PipelineSlot
from airflow_sky.task.launch import Launch, LaunchOptions


def test_the_engines_dag_carries_every_option_of_a_non_default_launch() -> None:
    task = Task("train", run="echo {{ not_a_template }}", setup="true", num_nodes=2)
    kept = LaunchOptions(
        "kept-c1", down=False, setup=False, must_exist=True, retry_until_up=True, follow=False
    )
    slot = PipelineSlot("p", 1, ("a", "train"), ("id-a", "id-train"))
    options = dataclasses.replace(
        kept, pipeline_name=slot.name, pipeline_index=1, pipeline_task_names=slot.task_names
    )
    options = dataclasses.replace(options, pipeline_task_ids=slot.task_ids)
    dag = launch_dag(Launch(task, options), "launch_options_dag")
    ids = set(dag.task_dict)
    provision = dag.task_dict["job.provision"]
    assert (provision.cluster_name, provision.infra, provision.down) == ("kept-c1", "local", False)
    assert (provision.must_exist, provision.retry_until_up) == (True, True)
    assert provision.execution_timeout is None  # an exec onto a kept cluster waits in its queue
    assert provision.pipeline == slot
    assert "job.setup_follow" not in ids  # setup=False
    assert "job.launch" in ids and "job.run_follow" not in ids  # follow=False: the group ends at launch
    assert task.run == "echo {{ not_a_template }}"  # the launch's own task is left as it was given


def test_the_engines_dag_with_default_options_has_every_step() -> None:
    launch = Launch(Task("train", run="true", setup="true"), LaunchOptions(cluster_name="c2"))
    dag = launch_dag(launch, "launch_defaults_dag")
    for step in ("provision", "sync", "setup_follow", "launch", "run_follow", "collect", "teardown"):
        assert f"job.{step}" in dag.task_dict
    assert dag.task_dict["job.teardown"].down is True
    assert dag.task_dict["job.provision"].pipeline is None


def test_keywords_and_a_launch_build_the_same_provision_step() -> None:
    task = Task("train", run="true")
    with DAG(dag_id="keywords_dag", schedule=None):
        by_keywords = sky_job(task, cluster_name="c3", down=False, must_exist=True, group_id="j")
    launch = Launch(task, LaunchOptions(cluster_name="c3", down=False, must_exist=True))
    with DAG(dag_id="launch_dag", schedule=None):
        by_launch = sky_job(launch=launch, group_id="j")
    first, second = by_keywords.children["j.provision"], by_launch.children["j.provision"]
    fields = ("cluster_name", "infra", "down", "must_exist", "retry_until_up", "pipeline")
    assert [getattr(first, f) for f in fields] == [getattr(second, f) for f in fields]


def test_a_launch_with_keywords_it_already_describes_is_refused_naming_them() -> None:
    launch = Launch(Task("train", run="true"), LaunchOptions(cluster_name="c4"))
    with DAG(dag_id="conflict_dag", schedule=None), pytest.raises(SpecError) as raised:
        sky_job(launch=launch, down=False, infra="local")
    assert "down, infra cannot be given with it" in str(raised.value)


def test_sky_job_without_a_task_or_a_launch_is_refused() -> None:
    with DAG(dag_id="empty_dag", schedule=None), pytest.raises(SpecError, match="give the task"):
        sky_job(group_id="j")
