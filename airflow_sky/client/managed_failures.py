"""Why a managed job failed before its task ran, and what a failed run left in the jobs bucket.

A run whose `spec` task failed is one of two things: the deployment refused the conf (the task ran and
raised: FAILED_PRECHECKS, with its error), or the task never ran at all (Airflow's workers could not run it,
e.g. they could not reach the API server's execution API: FAILED_CONTROLLER, with what Airflow recorded).
A task instance that ran has the host it ran on; the scheduler fails one that never started as a "state
mismatch", which its audit log keeps.

The run's own `remove_uploads` teardown removes its files from the jobs bucket; when it did not succeed
(its workers ran nothing), the CLI that sees the ended run removes them with this machine's credentials.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path
from airflow_sky.client.managed_dag import run_path
from airflow_sky.errors import SkyError

ENDED = ("success", "failed")


def step(ti: Mapping[str, Any]) -> str:
    return str(ti["task_id"]).rsplit(".", 1)[-1]


def _failed_specs(tis: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in tis if re.fullmatch(r"spec\d*", step(t)) and t.get("state") == "failed"]


def never_ran(ti: Mapping[str, Any]) -> bool:
    """A task instance that failed without ever running on a worker (no host, no process)."""
    return not ti.get("hostname") and ti.get("pid") is None


def spec_never_ran(tis: list[dict[str, Any]]) -> bool:
    """The run's failed spec task (the first) never ran: the run failed before it started."""
    failed = _failed_specs(tis)
    return bool(failed) and never_ran(failed[0])


def failure_lines(client: AirflowApi, dag_id: str, run_id: str, tis: list[dict[str, Any]]) -> Iterator[str]:
    """Why the run's spec task failed, one line each: the deployment's refusal (the error its spec task
    raised), or, for a task that never ran, that it never ran and what Airflow recorded."""
    for ti in _failed_specs(tis):
        if never_ran(ti):
            said = _state_mismatch(client, dag_id, run_id, ti["task_id"])
            yield (
                f"{ti['task_id']} never ran: Airflow failed the job before it started (its workers could not "
                "run the task: check that they reach the API server's execution API, [core] "
                "execution_api_server_url, and the scheduler's log)"
                + (f"; Airflow says: {said}" if said else "")
            )
            continue
        errors = _errors(client, dag_id, run_id, ti) if ti.get("try_number") else []
        if errors:  # the first: the exception raised (the rest are its causes)
            yield f"{ti['task_id']} failed: {errors[0]}"
        else:
            yield f"{ti['task_id']} failed on {ti.get('hostname')} with no error in its log (see its log in the UI)"


def _errors(client: AirflowApi, dag_id: str, run_id: str, ti: Mapping[str, Any]) -> list[str]:
    path = run_path(dag_id, run_id) + api_path("taskInstances", ti["task_id"], "logs", ti["try_number"])
    try:
        page = client.request("GET", path, headers={"Accept": "application/json"}).json()
    except (ApiError, ValueError):
        return []
    return [
        str(error["exc_value"])
        for event in page.get("content") or []
        for value in (event.values() if isinstance(event, dict) else ())
        for error in (value if isinstance(value, list) else ())
        if isinstance(error, dict) and error.get("exc_value")
    ]


def _state_mismatch(client: AirflowApi, dag_id: str, run_id: str, task_id: str) -> str | None:
    """What the scheduler recorded when the executor failed the task before it ran (its audit log; None
    when there is none, or this user may not read it)."""
    try:
        page = client.get(
            "/eventLogs", dag_id=dag_id, run_id=run_id, task_id=task_id, event="state mismatch", limit=1
        )
    except ApiError:
        return None
    logs = page.get("event_logs") if isinstance(page, dict) else None
    extra = logs[0].get("extra") if isinstance(logs, list) and logs and isinstance(logs[0], dict) else None
    return " ".join(str(extra).split())[:400] if extra else None


def remove_leftover_uploads(
    run: Mapping[str, Any], tis: list[dict[str, Any]], emit: Callable[[str], object] | None = None
) -> int:
    """When the run ended and its `remove_uploads` teardown did not succeed, remove the files `jobs launch`
    uploaded for it (the conf's `uploads`, only `<this machine's jobs bucket>/<run id>`); returns how many
    objects went. Nothing happens without a jobs bucket configured here, or for a prefix not of this run."""
    if run.get("state") not in ENDED or any(
        step(t) == "remove_uploads" and t.get("state") == "success" for t in tis
    ):
        return 0
    uris = _conf_uploads(run.get("conf"))
    if not uris:
        return 0
    from airflow_sky.client.jobs_bucket import jobs_bucket_config, open_store, run_prefix

    try:
        bucket = jobs_bucket_config()
        expected = bucket.bucket.run_uri(str(run["dag_run_id"])) if bucket is not None else None
    except SkyError:
        return 0
    if bucket is None or expected not in uris:
        return 0
    try:
        removed = open_store(bucket).delete(run_prefix(bucket.bucket, expected))
    except Exception as e:  # (the store's own errors) a read command goes on; the next one tries again
        if emit is not None:
            emit(f"Could not remove the job's uploaded files from {expected}: {e}")
        return 0
    if removed and emit is not None:
        emit(
            f"Removed the job's {removed} uploaded file(s) from {expected} (the deployment did not: its "
            "remove_uploads task did not run)"
        )
    return removed


def _conf_uploads(conf: Any) -> set[str]:
    if not isinstance(conf, dict):
        return set()
    jobs = conf.get("jobs") if "jobs" in conf else [conf]
    if not isinstance(jobs, list):
        return set()
    return {str(j["uploads"]) for j in jobs if isinstance(j, dict) and isinstance(j.get("uploads"), str)}
