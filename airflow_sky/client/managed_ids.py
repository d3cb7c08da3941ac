"""Managed job ids: small integers (1, 2, 3, ... per deployment), as SkyPilot's, next to the DAG run id.

`jobs launch` claims the next id by creating the Airflow Variable `airflow_sky_job_id__<N>` (its value: the
run id) before it creates the run: the Variable table's unique key makes the claim atomic, so two launches
at once never share an id (the loser's create answers 409, and it tries N+1). The Variables stay when runs
are deleted, so an id is never given twice. The run id carries the id as well (`sky-job-<N>-<random>`),
which lets `jobs queue` show it without a request per job; the Variable is what an id given by a user is
resolved through. A job id given to a command is either (digits, or an int) or a DAG run id.
"""

from __future__ import annotations

import contextlib
import re
import secrets as random
from collections.abc import Iterator

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path, check_job_id
from airflow_sky.errors import SpecError

ID_VARIABLE = "airflow_sky_job_id__"
_ID_KEY = re.compile(rf"{ID_VARIABLE}(\d+)")
_RUN_ID = re.compile(r"sky-job-(\d+)-[0-9a-f]+")
CLAIM_TRIES = 1000  # ids tried past the newest claim seen (each taken one is a 409)


def id_of_run(run_id: str) -> int | None:
    """The integer id a run id carries (`sky-job-3-1a2b3c4d` -> 3); None for a run made another way."""
    match = _RUN_ID.fullmatch(run_id)
    return int(match.group(1)) if match else None


def new_run_id(job_id: int) -> str:
    # The secrets' Variables are created before the run: whoever made a run of this id first would read
    # them. 32 random bits make that a guess of one in four billion per try, each a REST request.
    return f"sky-job-{job_id}-{random.token_hex(4)}"


def _newest_claim(client: AirflowApi) -> int:
    """The id of the newest claim Variable (by creation), 0 when there is none."""
    page = client.get("/variables", variable_key_pattern=ID_VARIABLE, order_by="-id", limit=20)
    ids = [
        int(match.group(1))
        for variable in page.get("variables") or []
        if isinstance(variable, dict) and (match := _ID_KEY.fullmatch(str(variable.get("key"))))
    ]
    return max(ids, default=0)


@contextlib.contextmanager
def claimed_id(client: AirflowApi, dag_id: str) -> Iterator[tuple[int, str]]:
    """Claim the next job id; yields (id, run id). When the body fails (no run was created), the claim is
    deleted again."""
    job_id = _newest_claim(client) + 1
    for _ in range(CLAIM_TRIES):
        run_id = new_run_id(job_id)
        try:
            client.request(
                "POST",
                "/variables",
                json={
                    "key": f"{ID_VARIABLE}{job_id}",
                    "value": run_id,
                    "description": f"managed job {job_id}: a run of {dag_id} (airflow-sky jobs)",
                },
            )
            break
        except ApiError as e:
            if e.status_code != 409:  # taken by another launch: the next one
                raise
            job_id += 1
    else:
        raise SpecError(f"no free managed job id from {job_id - CLAIM_TRIES} to {job_id - 1}")
    try:
        yield job_id, run_id
    except BaseException:
        with contextlib.suppress(ApiError):
            client.request("DELETE", api_path("variables", f"{ID_VARIABLE}{job_id}"))
        raise


def parse_job_id(given: int | str) -> int | str:
    """A job id as a user gave it: an int (digits) or a DAG run id (checked: never a hostile path)."""
    if isinstance(given, int) and not isinstance(given, bool):
        if given < 1:
            raise SpecError(f"job id {given}: not a job id (a positive integer, or a DAG run id)")
        return given
    text = str(given)
    if text.isdigit():
        return parse_job_id(int(text))
    return check_job_id(text)


def run_id_of(client: AirflowApi, given: int | str) -> str:
    """The DAG run id of a job id given by a user (an integer id through its claim Variable)."""
    parsed = parse_job_id(given)
    if isinstance(parsed, str):
        return parsed
    try:
        value = client.get(api_path("variables", f"{ID_VARIABLE}{parsed}")).get("value")
    except ApiError as e:
        if e.status_code == 404:
            raise SpecError(
                f"job id {parsed}: no such managed job on this deployment (`airflow-sky jobs queue` lists them)"
            ) from e
        raise
    return check_job_id(str(value))
