"""Managed job ids: small integers (1, 2, 3, ... per deployment), as SkyPilot's, next to the DAG run id.

A job's id lives in its run: the run's logical date is ID_EPOCH plus the id in seconds (1970-01-01T00:00:03Z
is job 3). Airflow keeps one run per DAG and logical date (a unique key of its database), so `jobs launch`
claims the next id by creating the run with that logical date: of two launches at once, one is answered 409
and tries the next id. No other record is kept (a Variable could not do it: the API writes Variables with
an upsert, so two creates of one key both succeed). A run triggered another way (the UI, with a logical
date of now, or none) has no integer id and is named by its run id. A job id given to a command is either
an integer (digits) or a DAG run id.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path, check_job_id
from airflow_sky.errors import SpecError

ID_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_ID = 100_000_000  # ids are logical dates up to 1973-03-03: never one Airflow gives a run itself
CLAIM_TRIES = 100  # ids tried past the newest one seen (each one taken is a 409)


def logical_date_of(job_id: int) -> str:
    return (ID_EPOCH + timedelta(seconds=job_id)).isoformat().replace("+00:00", "Z")


def id_of_run(run: Mapping[str, Any]) -> int | None:
    """The integer id of a run (from its logical date); None for a run made another way."""
    value = run.get("logical_date")
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = (when - ID_EPOCH).total_seconds() if when.tzinfo else -1.0
    return int(seconds) if seconds.is_integer() and 1 <= seconds <= MAX_ID else None


def _newest_id(client: AirflowApi, dag_id: str) -> int:
    """The highest id a run of `dag_id` has, 0 when none has one."""
    page = client.get(
        api_path("dags", dag_id, "dagRuns"),
        logical_date_lte=logical_date_of(MAX_ID),
        order_by="-logical_date",
        limit=1,
    )
    runs = page.get("dag_runs") or []
    found = id_of_run(runs[0]) if runs and isinstance(runs[0], dict) else None
    return found or 0


def create_run_with_id(client: AirflowApi, dag_id: str, body: dict[str, Any]) -> int:
    """POST the run `body` (its dag_run_id and conf) with the next free id as its logical date; returns
    the id. A 409 (the id taken by another run) tries the next one."""
    job_id = _newest_id(client, dag_id) + 1
    for _ in range(CLAIM_TRIES):
        if job_id > MAX_ID:
            break
        try:
            client.request(
                "POST",
                api_path("dags", dag_id, "dagRuns"),
                json={**body, "logical_date": logical_date_of(job_id)},
            )
            return job_id
        except ApiError as e:
            if e.status_code != 409:
                raise
            job_id += 1
    raise SpecError(f"no free managed job id after {CLAIM_TRIES} tries up to {job_id}: retry the launch")


def parse_job_id(given: int | str) -> int | str:
    """A job id as a user gave it: an int (digits) or a DAG run id (checked: never a hostile path)."""
    if isinstance(given, int) and not isinstance(given, bool):
        if not 1 <= given <= MAX_ID:
            raise SpecError(f"job id {given}: not a job id (a positive integer, or a DAG run id)")
        return given
    text = str(given)
    if text.isdigit():
        return parse_job_id(int(text))
    return check_job_id(text)


def run_id_of(client: AirflowApi, dag_id: str, given: int | str) -> str:
    """The DAG run id of a job id given by a user (an integer id through its run's logical date)."""
    parsed = parse_job_id(given)
    if isinstance(parsed, str):
        return parsed
    when = logical_date_of(parsed)
    page = client.get(
        api_path("dags", dag_id, "dagRuns"), logical_date_gte=when, logical_date_lte=when, limit=1
    )
    runs = page.get("dag_runs") or []
    if not runs:
        raise SpecError(
            f"job id {parsed}: no such managed job on this deployment (`airflow-sky jobs queue` lists them)"
        )
    return check_job_id(str(runs[0]["dag_run_id"]))
