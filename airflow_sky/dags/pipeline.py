"""A pipeline (several tasks, one YAML) in a DAG: a sky_job TaskGroup per task, each on its own cluster.

    serial:    train (provision ... teardown) -> eval (provision ... teardown) -> ...
    parallel:  train | eval | ...        (side by side, no edge between them)

In a serial pipeline a job starts only once the one before it succeeded and its cluster is down (or kept,
with down=False): its provision waits on the previous job's collect (the job succeeded) and teardown. A
failed job stops the ones after it (upstream_failed), and the DAG run fails.

A job reads an earlier job's result (the head's return.json, see `job_result`) with the `sky_result`
template: `{{ sky_result('train') }}`, `{{ sky_result('train')['checkpoint'] }}`, or `| tojson` for JSON.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import TaskGroup

from airflow_sky.dags.job import sky_job
from airflow_sky.dags.task_path import resolve_task_path
from airflow_sky.errors import SpecError
from airflow_sky.operators.provision import PipelineSlot
from airflow_sky.task.pipeline import PARALLEL, Pipeline


def sky_pipeline(
    pipeline: Pipeline | str | os.PathLike[str],
    *,
    infra: str | None = None,
    down: bool = True,
    env_overrides: dict[str, str] | None = None,
    task_ids: tuple[str, ...] = (),
    **job_kwargs: Any,
) -> list[TaskGroup]:
    """The jobs of a pipeline in the current DAG, one sky_job TaskGroup per task (group id: the task's name).

    :param pipeline: a Pipeline, or the path of a (multi-document) task YAML; a relative path is read
        against the directory of the DAG file that calls this.
    :param infra: the infra of every job that names none in its resources (default: local).
    :param down: tear each job's cluster down when the job ends.
    :param task_ids: every task's SKYPILOT_TASK_ID (default: derived from the DAG run).
    :param job_kwargs: passed to every sky_job (deferrable, max_recoveries, conn_id, ...).

    Each job runs on a cluster of its own, `<dag>-<job>-<hash of run id>`, unless `cluster_name` is
    given in job_kwargs (a serial pipeline may share one kept cluster; a parallel one may not).
    """
    envs: dict[str, str] = {}  # added to copies of the tasks: the caller's Pipeline stays as it was
    if not isinstance(pipeline, Pipeline):
        pipeline = Pipeline.from_yaml(resolve_task_path(pipeline), env_overrides=env_overrides)
    elif env_overrides:
        envs.update(env_overrides)
    if pipeline.execution == PARALLEL:
        if job_kwargs.get("cluster_name"):
            raise SpecError(
                f"pipeline {pipeline.name!r}: cluster_name: a parallel pipeline's tasks run side by side and "
                "cannot share one cluster; leave it unset (each task gets its own)"
            )
        envs["SKYPILOT_JOBGROUP_NAME"] = pipeline.name  # as SkyPilot's job groups set it
    tasks = [task.with_envs(envs) if envs else task for task in pipeline.tasks]
    names = tuple(task.name or job_id for task, job_id in zip(tasks, pipeline.job_ids, strict=True))
    groups: list[TaskGroup] = []
    for index, (task, job_id) in enumerate(zip(tasks, pipeline.job_ids, strict=True)):
        slot = PipelineSlot(pipeline.name, index, names, tuple(task_ids))
        group = sky_job(task, infra=infra, down=down, group_id=job_id, pipeline=slot, **job_kwargs)
        if groups and pipeline.execution != PARALLEL:
            _after(groups[-1], group)
        groups.append(group)
    return groups


def _after(previous: TaskGroup, group: TaskGroup) -> None:
    """`group` starts once `previous` succeeded (collect) and released its cluster (teardown)."""
    provision = group.children[f"{group.group_id}.provision"]
    for step in ("collect", "teardown"):
        task = previous.children.get(f"{previous.group_id}.{step}")
        if task is not None:
            task >> provision
        else:  # a detached run (follow_run=False): its last task
            previous.children[f"{previous.group_id}.launch"] >> provision
            break
