"""`{{ sky_result('job') }}`: a job's result (the head's return.json) in the templates of later tasks."""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from jinja2 import pass_context

from airflow_sky.task.pipeline import job_id_for


@pass_context
def sky_result(context: Any, job: str) -> Any:
    """Template function: the result of the job `job` (its name, or TaskGroup id) in this DAG run.

    None when that job left no return.json, or has not collected yet (a job that is not upstream).
    """
    return context["ti"].xcom_pull(task_ids=f"{job_id_for(job)}.collect")


def register_sky_result(dag: DAG) -> None:
    """Make `{{ sky_result('job') }}` available in every template of `dag` (sky_job does this)."""
    macros = dict(dag.user_defined_macros or {})
    if "sky_result" not in macros:
        macros["sky_result"] = sky_result
        dag.user_defined_macros = macros
