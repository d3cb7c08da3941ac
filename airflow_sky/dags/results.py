"""A job's result and final progress for later tasks: `{{ sky_result('job') }}` / `{{ sky_progress('job') }}`
in templates, `job_result(group)` (dags.job) / `job_progress(group)` as XComArgs."""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, TaskGroup
from jinja2 import pass_context

from airflow_sky.operators.base import PROGRESS_XCOM_KEY
from airflow_sky.task.pipeline import job_id_for


@pass_context
def sky_result(context: Any, job: str) -> Any:
    """Template function: the result of the job `job` (its name, or TaskGroup id) in this DAG run.

    None when that job left no return.json, or has not collected yet (a job that is not upstream).
    """
    return context["ti"].xcom_pull(task_ids=f"{job_id_for(job)}.collect")


@pass_context
def sky_progress(context: Any, job: str) -> Any:
    """Template function: the final progress of the job `job` (gang.job_progress.final_metrics: `step`,
    `total`, `metrics`, `ranks`, `recoveries`); None when it reported none or has not collected yet."""
    return context["ti"].xcom_pull(task_ids=f"{job_id_for(job)}.collect", key=PROGRESS_XCOM_KEY)


def job_progress(group: TaskGroup) -> Any:
    """The job's final progress for downstream tasks (an XComArg of its collect task; None when the job
    reported none): e.g. `job_progress(group)["metrics"]` in a @task."""
    return group.children[f"{group.group_id}.collect"].output[PROGRESS_XCOM_KEY]  # type: ignore[attr-defined]


def register_sky_result(dag: DAG) -> None:
    """Make `{{ sky_result('job') }}` and `{{ sky_progress('job') }}` available in every template of `dag`
    (sky_job does this)."""
    macros = dict(dag.user_defined_macros or {})
    macros.setdefault("sky_result", sky_result)
    macros.setdefault("sky_progress", sky_progress)
    dag.user_defined_macros = macros
