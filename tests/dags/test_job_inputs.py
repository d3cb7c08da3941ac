"""sky_job and sky_pipeline build from copies: the caller's Task or Pipeline stays as it was given."""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_sky import Pipeline, Task, sky_job, sky_pipeline


def test_sky_job_env_overrides_reach_the_job_not_the_callers_task():
    task = Task("train", run="echo $LR", envs={"LR": "0.1"})
    with DAG(dag_id="inputs_job", schedule=None):
        group = sky_job(task, env_overrides={"LR": "0.2"})
    assert task.envs == {"LR": "0.1"}
    provision = group.children["train.provision"]
    assert provision.sky_task.envs == {"LR": "0.2"}


def test_sky_pipeline_adds_envs_to_copies_of_the_pipelines_tasks():
    pipeline = Pipeline.from_yaml_str(
        "name: group\nexecution: parallel\n---\nname: a\nrun: 'true'\n---\nname: b\nrun: 'true'\n"
    )
    with DAG(dag_id="inputs_pipeline", schedule=None):
        groups = sky_pipeline(pipeline, env_overrides={"X": "1"})
    assert [task.envs for task in pipeline.tasks] == [{}, {}]
    for group in groups:
        provision = group.children[f"{group.group_id}.provision"]
        assert provision.sky_task.envs == {"X": "1", "SKYPILOT_JOBGROUP_NAME": "group"}
