"""Managed jobs as their runs show them: `jobs queue`, `logs` and `cancel` read and steer the runs of the
deployment's managed jobs DAG through the REST API (a job's status in SkyPilot's words, by the rules of
gang.job_status from the run's states and the job-state record's mirror)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path
from airflow_sky.client.managed_dag import borrowed_api, dag_get, run_path
from airflow_sky.client.managed_failures import failure_lines, remove_leftover_uploads, spec_never_ran
from airflow_sky.client.managed_failures import step as _step
from airflow_sky.client.managed_ids import id_of_run, parse_job_id, run_id_of
from airflow_sky.dags.managed import JOB_GROUP, MANAGED_DAG_ID
from airflow_sky.errors import SpecError
from airflow_sky.gang import job_status
from airflow_sky.gang.queue_progress import queue_progress
from airflow_sky.operators.base import JOB_STATUS_XCOM_KEY

CANCEL_NOTE = "Cancelled with `airflow-sky jobs cancel`"
UNFINISHED = ("queued", "running")  # the run states of a job not ended
_ACTIVE = ("running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting")
_LOG_STEPS = ("setup_follow", "run_follow")
_ENDED = ("success", "failed", "skipped", "upstream_failed", "removed")
LOG_POLL_S = 2.0
PROGRESS_API = "/airflow-sky/api/v1/progress"  # the deployment's plugin (airflow_sky.ui), when installed


@dataclasses.dataclass(frozen=True)
class ManagedJob:
    """One managed job (a run of the managed jobs DAG) as `jobs queue` shows it."""

    job_id: int | None  # the small integer id (client.managed_ids); None for a run made another way
    run_id: str  # the DAG run id
    name: str
    status: str  # a gang.job_status.ManagedStatus
    recoveries: int
    num_nodes: int | None
    submitted: datetime | None
    duration_s: float | None
    infra: str
    # As the deployment's airflow-sky plugin reports it (gang.queue_progress: step, total, percent, rate,
    # eta_s); None when the job reports none, or the deployment has no plugin to ask.
    progress: dict[str, Any] | None = None
    pool: str | None = None  # the pool it runs on (`jobs launch --pool`)
    num_jobs: int | None = None  # its submission's SKYPILOT_NUM_JOBS (`--num-jobs`)


def queue(
    limit: int = 50, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID, skip_finished: bool = False
) -> list[ManagedJob]:
    """The latest managed jobs, newest first (with `skip_finished`, only those not ended). A run that ended
    without its uploads removed has them removed here (client.managed_failures)."""
    states = {"state": list(UNFINISHED)} if skip_finished else {}
    with borrowed_api(api) as client:
        runs = dag_get(client, dag_id, "dagRuns", limit=limit, order_by="-run_after", **states)
        return [_job(client, dag_id, run) for run in runs["dag_runs"]]


def job(job_id: int | str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> ManagedJob:
    """One managed job's status (`job_id`: its integer id, or its DAG run id)."""
    parse_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with borrowed_api(api) as client:
        return _job(client, dag_id, client.get(run_path(dag_id, run_id_of(client, dag_id, job_id))))


def latest(api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> ManagedJob:
    """The newest managed job (`jobs logs` with no id)."""
    jobs = queue(limit=1, api=api, dag_id=dag_id)
    if not jobs:
        raise SpecError("no managed jobs yet: `airflow-sky jobs launch TASK.yaml` submits one")
    return jobs[0]


def cancel(job_id: int | str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> None:
    """Stop the job: its run is marked failed; its follow tasks are killed, which stops every rank, and its
    teardown still runs, which (with down, the default) terminates the nodes."""
    parse_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with borrowed_api(api) as client:
        run_id = run_id_of(client, dag_id, job_id)
        run = client.get(run_path(dag_id, run_id))
        if run["state"] in ("success", "failed"):
            raise SpecError(f"job {job_id} already ended ({_status(run, [])})")
        client.request("PATCH", run_path(dag_id, run_id), json={"state": "failed", "note": CANCEL_NOTE})


def unfinished(api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> list[ManagedJob]:
    """Every managed job not ended (`jobs cancel --all`), newest first."""
    with borrowed_api(api) as client:
        path = api_path("dags", dag_id, "dagRuns")
        runs = list(client.pages(path, "dag_runs", state=list(UNFINISHED), order_by="-run_after"))
        return [_job(client, dag_id, run) for run in runs]


def logs(
    job_id: int | str,
    *,
    follow: bool = True,
    emit: Callable[[str], object] = print,
    api: AirflowApi | None = None,
    dag_id: str = MANAGED_DAG_ID,
    poll_s: float = LOG_POLL_S,
) -> ManagedJob:
    """Print every rank's setup and run log lines (and the job's own messages: recoveries, failures) as the
    follow tasks write them; with `follow`, until the job ends. Returns the job's status at the end."""
    parse_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with borrowed_api(api) as client:
        job_id = run_id_of(client, dag_id, job_id)
        readers: dict[tuple[str, int, int], _LogReader] = {}
        while True:
            run = client.get(run_path(dag_id, job_id))
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
                for line in reader.read(final=ti.get("state") in _ENDED):
                    emit(line)
            if not follow or (ended and all(r.done for r in readers.values())):
                for line in failure_lines(client, dag_id, job_id, tis) if ended else ():
                    emit(line)
                return _job(client, dag_id, run, tis, emit)
            time.sleep(poll_s)


class _LogReader:
    """One task instance try's log, read on from where the last read ended (the API's continuation token)."""

    def __init__(
        self, client: AirflowApi, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
    ):
        self.client = client
        self.path = run_path(dag_id, run_id) + api_path("taskInstances", task_id, "logs", try_number)
        self.map_index = map_index
        self.token: str | None = None
        self.seen = 0  # log events read so far
        self.done = False

    def read(self, final: bool) -> Iterator[str]:
        """The job's lines written since the last read. `final`: the task instance had ended before this
        read, so that a page without a continuation token is the log's end. Airflow also leaves the token
        out while a task is not running (a deferred follow task going back to the queue): the next read
        then starts over, and skips the events already read."""
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
        events = page.get("content") or []
        if self.token is None:  # from the start: the first read, or one after a page without a token
            events, self.seen = events[self.seen :], len(events)
        else:
            self.seen += len(events)
        for event in events:
            line = _job_line(event)
            if line is not None:
                yield line
        self.token = page.get("continuation_token")
        self.done = self.token is None and final


def _job_line(event: Any) -> str | None:
    """A log event's text when it is the job's own (a node's line, a recovery, a failure), else None."""
    if not isinstance(event, dict):
        return None
    logger = str(event.get("logger") or "")
    if "airflow_sky" not in logger:
        return None
    return str(event.get("event", ""))


def _task_instances(client: AirflowApi, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return list(client.pages(run_path(dag_id, run_id) + "/taskInstances", "task_instances"))


def _job(
    client: AirflowApi,
    dag_id: str,
    run: Mapping[str, Any],
    tis: list[dict[str, Any]] | None = None,
    emit: Callable[[str], object] | None = None,
) -> ManagedJob:
    # A run conf is whatever its trigger wrote: read it without trusting its shape (jobs queue lists all).
    given = run.get("conf")
    conf: dict[str, Any] = given if isinstance(given, dict) else {}
    jobs = conf.get("jobs")
    first = (jobs[0] if isinstance(jobs, list) and jobs else {}) if "jobs" in conf else conf
    first = first if isinstance(first, dict) else {}
    task: dict[str, Any] = first["task"] if isinstance(first.get("task"), dict) else {}
    num_nodes = task.get("num_nodes")
    if tis is None:
        tis = _task_instances(client, dag_id, run["dag_run_id"])
    # Every job of a pipeline that got to its run: the latest one's status, all their recoveries.
    groups = sorted(
        {
            str(t["task_id"]).rsplit(".", 1)[0]
            for t in tis
            if _step(t) == "run_follow" and t.get("state") in ("running", "deferred", "success", "failed")
        }
    )
    pushed = [x for x in (_job_status_xcom(client, dag_id, run["dag_run_id"], g) for g in groups) if x]
    status_xcom = pushed[-1] if pushed else None
    started, ended = _time(run.get("start_date")), _time(run.get("end_date"))
    status = _status(run, tis, status_xcom)
    remove_leftover_uploads(run, tis, emit)
    return ManagedJob(
        job_id=id_of_run(run),
        run_id=run["dag_run_id"],
        name=str(conf.get("pipeline") or task.get("name") or "-"),
        status=status,
        recoveries=sum(job_status.mirrored_recoveries(x) for x in pushed),
        num_nodes=num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else None,
        submitted=_time(run.get("queued_at")) or started,
        duration_s=((ended or datetime.now(UTC)) - started).total_seconds() if started else None,
        infra=str(first.get("infra") or "local"),
        progress=_progress(client, dag_id, run["dag_run_id"]) if groups else None,
        pool=first["pool"] if isinstance(first.get("pool"), str) else None,
        num_jobs=_num_jobs(task),
    )


def _num_jobs(task: Mapping[str, Any]) -> int | None:
    envs = task.get("envs")
    value = envs.get("SKYPILOT_NUM_JOBS") if isinstance(envs, Mapping) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _progress(client: AirflowApi, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The run's progress from the deployment's airflow-sky plugin (airflow_sky.ui: the JSON API the
    progress view reads), its latest job that reports any; None when none does, or when the plugin is
    not installed or cannot answer: the queue goes on without it."""
    try:
        page = client.plugin_get(PROGRESS_API + api_path(dag_id, run_id), history=0)
    except ApiError:
        return None
    jobs = page.get("jobs") if isinstance(page, dict) else None
    found = (
        [queue_progress(j.get("progress")) for j in jobs if isinstance(j, dict)]
        if isinstance(jobs, list)
        else []
    )
    reported = [p for p in found if p is not None]
    return reported[-1] if reported else None


def _status(
    run: Mapping[str, Any], tis: list[dict[str, Any]], status_xcom: Mapping[str, Any] | None = None
) -> job_status.ManagedStatus:
    steps = [(_step(t), t.get("state")) for t in tis]
    status = job_status.of_run(run.get("state"), run.get("note") == CANCEL_NOTE, steps, status_xcom)
    if status == job_status.ManagedStatus.FAILED_PRECHECKS and spec_never_ran(tis):
        return job_status.ManagedStatus.FAILED_CONTROLLER  # not refused: it never started
    return status


def _job_status_xcom(
    client: AirflowApi, dag_id: str, run_id: str, group: str = JOB_GROUP
) -> dict[str, Any] | None:
    """What the head's run follow task of `group` last pushed about recoveries (none before the first)."""
    path = run_path(dag_id, run_id) + api_path(
        "taskInstances", f"{group}.run_follow", "xcomEntries", JOB_STATUS_XCOM_KEY
    )
    try:
        value = client.get(path, map_index=0).get("value")
    except ApiError as e:
        if e.status_code == 404:
            return None
        raise
    return value if isinstance(value, dict) else None


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else None
