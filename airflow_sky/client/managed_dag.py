"""The deployment's managed jobs DAG through the REST API: whether it is there and unpaused, and the paths of
its runs. Shared by launching (client.managed_jobs) and reading the runs (client.managed_runs)."""

from __future__ import annotations

import re
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path
from airflow_sky.dags.managed import MANAGED_DAG_ID
from airflow_sky.errors import SpecError


class DagNotReady(ApiError, ValueError):
    """The deployment's managed jobs DAG is missing or paused: a job submitted now would never start.
    (A ValueError: the CLI exits 2, as for any refused launch.)"""


def check_dag_ready(client: AirflowApi, dag_id: str = MANAGED_DAG_ID) -> None:
    """Refuse (DagNotReady, naming the fix) when the deployment's `dag_id` is missing or paused: a run of a
    paused DAG stays queued, and `jobs queue` would say PENDING forever."""
    dag = dag_get(client, dag_id)
    if dag.get("is_stale"):  # its file left the DAG folder: the scheduler runs none of its runs
        raise no_dag(client, dag_id)
    if dag.get("is_paused"):
        raise DagNotReady(
            f"the managed jobs DAG {dag_id} is paused on the Airflow at {client.config.url}, so a job would "
            f"wait PENDING; unpause it: `airflow dags unpause {dag_id}` (or PATCH /api/v2/dags/{dag_id} "
            '{"is_paused": false}, or its toggle in the UI)',
            409,
        )


def dag_get(client: AirflowApi, dag_id: str, *below: str, **params: Any) -> Any:
    """GET the DAG's own path (or one below it); a 404 says the DAG is not deployed, and how to deploy it."""
    try:
        return client.get(api_path("dags", dag_id, *below), **params)
    except ApiError as e:
        if e.status_code == 404:
            raise no_dag(client, dag_id) from e
        raise


def no_dag(client: AirflowApi, dag_id: str) -> DagNotReady:
    argument = "" if dag_id == MANAGED_DAG_ID else f"dag_id={dag_id!r}"
    return DagNotReady(
        f"the Airflow at {client.config.url} has no DAG {dag_id}: deploy it with a file in its DAG folder "
        f"holding `from airflow_sky.dags.managed import managed_jobs_dag; dag = managed_jobs_dag({argument})` "
        "(docs/deploy.md#managed-jobs)",
        404,
    )


def check_pipeline_slots(client: AirflowApi, dag_id: str, jobs: int) -> None:
    """Refuse, before anything is created, a pipeline longer than the deployed DAG has slots for."""
    tasks = dag_get(client, dag_id, "tasks")["tasks"]
    slots = sum(1 for t in tasks if re.fullmatch(r"spec\d*", str(t.get("task_id"))))
    if jobs > slots:
        raise SpecError(
            f"the pipeline has {jobs} tasks; the deployed {dag_id} DAG runs at most {slots} "
            f"(deploy it as managed_jobs_dag(pipeline_slots={jobs}) or more)"
        )


def borrowed_api(api: AirflowApi | None) -> Any:
    """The given client (left open), or a new one closed after use."""
    return _Borrowed(api) if api is not None else AirflowApi()


class _Borrowed:
    def __init__(self, api: AirflowApi) -> None:
        self.api = api

    def __enter__(self) -> AirflowApi:
        return self.api

    def __exit__(self, *exc: object) -> None:
        return None


def run_path(dag_id: str, run_id: str) -> str:
    """The REST path of a DAG run (a job id a user gave is checked first: check_job_id)."""
    return api_path("dags", dag_id, "dagRuns", run_id)
