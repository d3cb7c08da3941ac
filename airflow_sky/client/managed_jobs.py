"""Managed jobs: a task run by a deployed Airflow (the `airflow_sky_jobs` DAG), like `sky jobs`.

`launch` checks the task here, puts its secrets into Airflow Variables and triggers a run of the DAG through
the REST API; `queue`, `logs` and `cancel` read and steer those runs through the same API. Nothing here
touches a node: the deployment's workers do, so a job goes on when this process (or laptop) is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets as random
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError
from airflow_sky.dags.managed import JOB_GROUP, MANAGED_DAG_ID
from airflow_sky.errors import SpecError
from airflow_sky.operators.base import JOB_STATUS_XCOM_KEY
from airflow_sky.operators.job_spec import JobSpec, local_paths, secret_variable_key
from airflow_sky.task import Task

CANCEL_NOTE = "Cancelled with `airflow-sky jobs cancel`"
_ACTIVE = ("running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting")
_STARTING_STEPS = ("spec", "provision", "sync", "setup_follow", "launch")
_LOG_STEPS = ("setup_follow", "run_follow")
LOG_POLL_S = 2.0


@dataclasses.dataclass(frozen=True)
class ManagedJob:
    """One managed job (a run of the managed jobs DAG) as `jobs queue` shows it."""

    job_id: str  # the DAG run id
    name: str
    status: (
        str  # SkyPilot's: PENDING, STARTING, RUNNING, RECOVERING, SUCCEEDED, FAILED, FAILED_SETUP, CANCELLED
    )
    recoveries: int
    num_nodes: int | None
    submitted: datetime | None
    duration_s: float | None
    infra: str


def launch(
    task: Task | str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    infra: str | None = None,
    num_nodes: int | None = None,
    cluster_name: str | None = None,
    down: bool = True,
    api: AirflowApi | None = None,
    dag_id: str = MANAGED_DAG_ID,
) -> str:
    """Submit `task` (a Task or a task YAML) as a managed job; returns its job id (the DAG run id).

    The task is checked here: a bad one is refused before anything reaches Airflow. Secrets go into Airflow
    Variables (never into the run's conf), which the run deletes when it ends.
    """
    if not isinstance(task, Task):
        task = Task.from_yaml(os.fspath(task), env_overrides=env)
    elif env:
        task = task.update_envs(env)
    if secrets:
        task = task.update_secrets(secrets)
    if num_nodes is not None:
        if num_nodes < 1:
            raise SpecError(f"num_nodes: must be an integer >= 1, got {num_nodes}")
        task.num_nodes = num_nodes
    unreadable = local_paths(task)
    if unreadable:
        raise SpecError(
            f"{', '.join(unreadable)}: a managed job runs on the deployment's workers, which cannot read this "
            "machine's files; use a git workdir (workdir: {url: ...}) or bucket file_mounts (s3://, gs://)"
        )
    mapping = task.to_dict()
    mapping["secrets"] = {name: None for name in task.secrets}
    run_id = f"sky-job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{random.token_hex(3)}"
    spec = JobSpec(
        task=mapping,
        secrets={name: secret_variable_key(run_id, name) for name in task.secrets},
        infra=infra or task.resources.infra or "local",
        cluster_name=cluster_name,
        down=down,
    )
    JobSpec.from_conf(spec.to_conf())  # what the DAG's spec task will check, checked here first
    with _api(api) as client:
        created: list[str] = []
        try:
            for name, key in spec.secrets.items():
                client.request(
                    "POST",
                    "/variables",
                    json={
                        "key": key,
                        "value": task.secrets[name],
                        "description": f"secret {name} of {run_id}",
                    },
                )
                created.append(key)
            body = {"dag_run_id": run_id, "logical_date": None, "conf": spec.to_conf()}
            try:
                client.request("POST", f"/dags/{dag_id}/dagRuns", json=body)
            except ApiError as e:
                if e.status_code != 404:
                    raise
                raise ApiError(
                    f"the Airflow at {client.config.url} has no DAG {dag_id}: add the managed jobs DAG to its "
                    "DAG folder (docs/deploy.md, managed jobs)",
                    404,
                ) from e
        except ApiError:
            for key in created:  # nothing of a refused launch stays behind
                with contextlib.suppress(ApiError):
                    client.request("DELETE", f"/variables/{key}")
            raise
    return run_id


def queue(limit: int = 50, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> list[ManagedJob]:
    """The latest managed jobs, newest first."""
    with _api(api) as client:
        runs = client.get(f"/dags/{dag_id}/dagRuns", limit=limit, order_by="-run_after")["dag_runs"]
        return [_job(client, dag_id, run) for run in runs]


def job(job_id: str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> ManagedJob:
    """One managed job's status."""
    with _api(api) as client:
        return _job(client, dag_id, client.get(f"/dags/{dag_id}/dagRuns/{job_id}"))


def cancel(job_id: str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> None:
    """Stop the job: its run is marked failed; its follow tasks are killed, which stops every rank, and its
    teardown still runs, which (with down, the default) terminates the nodes."""
    with _api(api) as client:
        run = client.get(f"/dags/{dag_id}/dagRuns/{job_id}")
        if run["state"] in ("success", "failed"):
            raise SpecError(f"job {job_id} already ended ({_status(client, dag_id, run, [])})")
        client.request(
            "PATCH", f"/dags/{dag_id}/dagRuns/{job_id}", json={"state": "failed", "note": CANCEL_NOTE}
        )


def logs(
    job_id: str,
    *,
    follow: bool = True,
    emit: Callable[[str], object] = print,
    api: AirflowApi | None = None,
    dag_id: str = MANAGED_DAG_ID,
    poll_s: float = LOG_POLL_S,
) -> ManagedJob:
    """Print every rank's setup and run log lines (and the job's own messages: recoveries, failures) as the
    follow tasks write them; with `follow`, until the job ends. Returns the job's status at the end."""
    with _api(api) as client:
        readers: dict[tuple[str, int, int], _LogReader] = {}
        while True:
            run = client.get(f"/dags/{dag_id}/dagRuns/{job_id}")
            ended = run["state"] in ("success", "failed")
            tis = _task_instances(client, dag_id, job_id)
            for ti in sorted(
                tis,
                key=lambda t: (_LOG_STEPS.index(_step(t)) if _step(t) in _LOG_STEPS else 9, t["map_index"]),
            ):
                if _step(ti) not in _LOG_STEPS or not ti.get("try_number"):
                    continue
                key = (ti["task_id"], int(ti["map_index"]), int(ti["try_number"]))
                reader = readers.setdefault(key, _LogReader(client, dag_id, job_id, *key))
                for line in reader.read():
                    emit(line)
            if not follow or (ended and all(r.done for r in readers.values())):
                return _job(client, dag_id, run, tis)
            time.sleep(poll_s)


class _LogReader:
    """One task instance try's log, read on from where the last read ended (the API's continuation token)."""

    def __init__(
        self, client: AirflowApi, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
    ):
        self.client = client
        self.path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        self.map_index = map_index
        self.token: str | None = None
        self.done = False

    def read(self) -> Iterator[str]:
        if self.done:
            return
        params: dict[str, Any] = {"map_index": self.map_index}
        if self.token:
            params["token"] = self.token
        try:
            page = self.client.request(
                "GET", self.path, params=params, headers={"Accept": "application/json"}
            ).json()
        except ApiError as e:
            if e.status_code == 404:  # not started yet
                return
            raise
        for event in page.get("content") or []:
            line = _job_line(event)
            if line is not None:
                yield line
        token = page.get("continuation_token")
        if token is None:
            self.done = True
        else:
            self.token = token


def _job_line(event: Any) -> str | None:
    """A log event's text when it is the job's own (a node's line, a recovery, a failure), else None."""
    if not isinstance(event, dict):
        return None
    logger = str(event.get("logger") or "")
    if "airflow_sky" not in logger:
        return None
    return str(event.get("event", ""))


def _api(api: AirflowApi | None) -> Any:
    """The given client (left open), or a new one closed after use."""
    return _Borrowed(api) if api is not None else AirflowApi()


class _Borrowed:
    def __init__(self, api: AirflowApi) -> None:
        self.api = api

    def __enter__(self) -> AirflowApi:
        return self.api

    def __exit__(self, *exc: object) -> None:
        return None


def _step(ti: Mapping[str, Any]) -> str:
    return str(ti["task_id"]).rsplit(".", 1)[-1]


def _task_instances(client: AirflowApi, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return list(client.pages(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances"))


def _job(
    client: AirflowApi, dag_id: str, run: Mapping[str, Any], tis: list[dict[str, Any]] | None = None
) -> ManagedJob:
    conf = run.get("conf") or {}
    task: dict[str, Any] = conf["task"] if isinstance(conf.get("task"), dict) else {}
    if tis is None:
        tis = _task_instances(client, dag_id, run["dag_run_id"])
    status_xcom = (
        _job_status_xcom(client, dag_id, run["dag_run_id"])
        if _any(tis, "run_follow", ("running", "deferred", "success", "failed"))
        else None
    )
    started, ended = _time(run.get("start_date")), _time(run.get("end_date"))
    return ManagedJob(
        job_id=run["dag_run_id"],
        name=str(task.get("name") or "-"),
        status=_status(client, dag_id, run, tis, status_xcom),
        recoveries=int(status_xcom["generation"]) if status_xcom else 0,
        num_nodes=task.get("num_nodes"),
        submitted=_time(run.get("queued_at")) or started,
        duration_s=((ended or datetime.now(UTC)) - started).total_seconds() if started else None,
        infra=str(conf.get("infra") or "local"),
    )


def _status(
    client: AirflowApi,
    dag_id: str,
    run: Mapping[str, Any],
    tis: list[dict[str, Any]],
    status_xcom: Mapping[str, Any] | None = None,
) -> str:
    state = run.get("state")
    if run.get("note") == CANCEL_NOTE:
        return "CANCELLED" if state in ("success", "failed") else "CANCELLING"
    if state == "queued":
        return "PENDING"
    if state == "success":
        return "SUCCEEDED"
    if state == "failed":
        if _any(tis, "setup_follow", ("failed",)):
            return "FAILED_SETUP"
        if _any(tis, "spec", ("failed",)):
            return "FAILED_PRECHECKS"
        return "FAILED"
    if status_xcom and status_xcom.get("status") == "RECOVERING":
        return "RECOVERING"
    if _any(tis, "launch", ("success",)):
        return "RUNNING"
    return "STARTING" if any(_step(t) in _STARTING_STEPS and t.get("state") for t in tis) else "PENDING"


def _any(tis: list[dict[str, Any]], step: str, states: tuple[str, ...]) -> bool:
    return any(_step(t) == step and t.get("state") in states for t in tis)


def _job_status_xcom(client: AirflowApi, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """What the head's run follow task last pushed about recoveries (none before the first)."""
    path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{JOB_GROUP}.run_follow/xcomEntries/{JOB_STATUS_XCOM_KEY}"
    try:
        value = client.get(path, map_index=0).get("value")
    except ApiError as e:
        if e.status_code == 404:
            return None
        raise
    return value if isinstance(value, dict) else None


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else None
