"""A task YAML as a DAG: one sky_job, or for a pipeline file (several documents) one sky_job per task."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from airflow_sky.dags.job import sky_job
from airflow_sky.dags.pipeline import sky_pipeline
from airflow_sky.dags.task_path import resolve_task_path
from airflow_sky.task import Task
from airflow_sky.task.pipeline import Pipeline, is_pipeline_file, job_id_for


def dag_from_yaml(
    path: str | os.PathLike[str],
    *,
    dag_id: str | None = None,
    cluster_name: str | None = None,
    infra: str | None = None,
    down: bool = True,
    env_overrides: dict[str, str] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """A DAG holding one sky_job for the task YAML at `path` (DAG kwargs such as schedule pass through).

    A pipeline file (several YAML documents) becomes one DAG of its jobs (see sky_pipeline).
    """
    resolved = resolve_task_path(path)
    if is_pipeline_file(resolved):
        if cluster_name is not None:
            dag_kwargs.setdefault("job_kwargs", {})["cluster_name"] = cluster_name
        return dag_from_pipeline_file(
            resolved, dag_id=dag_id, infra=infra, down=down, env_overrides=env_overrides, **dag_kwargs
        )
    task = Task.from_yaml(resolved, env_overrides=env_overrides)
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("tags", ["airflow-sky"])
    with DAG(dag_id=dag_id or job_id_for(task.name or "sky_job"), **dag_kwargs) as dag:
        sky_job(task, cluster_name=cluster_name, infra=infra, down=down)
    return dag


def dag_from_pipeline_file(
    path: str | os.PathLike[str],
    *,
    dag_id: str | None = None,
    infra: str | None = None,
    down: bool = True,
    env_overrides: dict[str, str] | None = None,
    job_kwargs: dict[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """A DAG running the pipeline YAML at `path` (DAG kwargs such as schedule pass through)."""
    pipeline = Pipeline.from_yaml(resolve_task_path(path), env_overrides=env_overrides)
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("tags", ["airflow-sky", "pipeline"])
    with DAG(dag_id=dag_id or job_id_for(pipeline.name) or Path(path).stem, **dag_kwargs) as dag:
        sky_pipeline(pipeline, infra=infra, down=down, **(job_kwargs or {}))
    return dag
