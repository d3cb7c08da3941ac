"""Managed jobs: a task run by a deployed Airflow (the `airflow_sky_jobs` DAG), like `sky jobs`.

`launch` checks the task here, uploads its local files to the jobs bucket (client.jobs_bucket), puts its
secrets into Airflow Variables and triggers a run of the DAG through the REST API; `queue`, `logs` and
`cancel` read and steer those runs through the same API. Nothing here touches a node: the deployment's
workers do, so a job goes on when this process (or laptop) is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets as random
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_path, check_job_id
from airflow_sky.client.jobs_bucket import (
    SETTING,
    JobsBucketConfig,
    UploadFile,
    UploadProgress,
    files_to_upload,
    jobs_bucket_config,
    open_store,
    run_prefix,
    upload,
)
from airflow_sky.dags.managed import JOB_GROUP, MANAGED_DAG_ID
from airflow_sky.errors import SkyError, SpecError
from airflow_sky.operators.base import JOB_STATUS_XCOM_KEY
from airflow_sky.operators.job_spec import JobSpec, job_owner, secret_variable_key
from airflow_sky.task import Task
from airflow_sky.task.conf_policy import SETTINGS, ConfPolicy
from airflow_sky.task.jobs_bucket import LocalUpload, job_files_uri, local_paths, translate_local_paths
from airflow_sky.task.pipeline import SERIAL, Pipeline

CANCEL_NOTE = "Cancelled with `airflow-sky jobs cancel`"
_ACTIVE = ("running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting")
_STARTING_STEPS = ("spec", "provision", "sync", "setup_follow", "launch")
_LOG_STEPS = ("setup_follow", "run_follow")
_ENDED = ("success", "failed", "skipped", "upstream_failed", "removed")
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


class LaunchAborted(SkyError):
    """The user declined the launch at its confirmation (nothing was created)."""


class DagNotReady(ApiError, ValueError):
    """The deployment's managed jobs DAG is missing or paused: a job submitted now would never start.
    (A ValueError: the CLI exits 2, as for any refused launch.)"""


def launch(
    task: Task | Pipeline | str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    infra: str | None = None,
    num_nodes: int | None = None,
    cluster_name: str | None = None,
    down: bool = True,
    api: AirflowApi | None = None,
    dag_id: str = MANAGED_DAG_ID,
    confirm: Callable[[str], bool] | None = None,
    upload_progress: UploadProgress | None = None,
) -> str:
    """Submit `task` (a Task, a Pipeline, or a task YAML: one task or a pipeline file) as a managed job;
    returns its job id (the DAG run id). A pipeline's tasks run in order in that one run, each on a cluster
    of its own; the deployed DAG needs as many pipeline slots (`managed_jobs_dag(pipeline_slots=N)`).

    Everything is checked here: a bad task is refused before anything reaches Airflow. Secrets go into
    Airflow Variables (never into the run's conf), which the run deletes when it ends. A local workdir and
    local file_mounts are uploaded to the configured jobs bucket (client.jobs_bucket), which the run removes
    when it ends; without one they are refused, naming the setting.

    :param confirm: asked with the job's name once the task is checked, before anything is uploaded or
        created; False raises LaunchAborted.
    :param upload_progress: told how the upload of local files goes (files and bytes).
    """
    tasks, pipeline = _tasks_of(task, env)
    for one in tasks:
        if secrets:
            one.update_secrets(secrets)
    if num_nodes is not None:
        if pipeline is not None:
            raise SpecError("num_nodes: a pipeline's tasks name their own node counts")
        if num_nodes < 1:
            raise SpecError(f"num_nodes: must be an integer >= 1, got {num_nodes}")
        tasks[0].num_nodes = num_nodes
    run_id = f"sky-job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{random.token_hex(3)}"
    bucket = _jobs_bucket_for(tasks, pipeline)
    run_uri = bucket.bucket.run_uri(run_id) if bucket is not None else None
    uploads: list[LocalUpload] = []
    if run_uri is not None:
        for index, one in enumerate(tasks):
            tasks[index], more = translate_local_paths(one, job_files_uri(run_uri, index, len(tasks)))
            uploads += more
    specs = []
    for index, one in enumerate(tasks):
        mapping = one.to_dict(secret_references=True)  # a token in a git URL travels as ${NAME}
        mapping["secrets"] = {name: None for name in one.secrets}
        owner = job_owner(run_id, index, len(tasks))
        specs.append(
            JobSpec(
                task=mapping,
                secrets={name: secret_variable_key(owner, name) for name in one.secrets},
                infra=infra or one.resources.infra or "local",
                cluster_name=cluster_name if pipeline is None else None,
                down=down,
                uploads=run_uri if uploads else None,
            )
        )
    policy = client_policy()
    for index, spec in enumerate(specs):  # what the DAG's spec tasks will check, checked here first
        JobSpec.from_conf(spec.to_run_conf(), owner=job_owner(run_id, index, len(specs)))
        if policy is not None:
            spec.check_policy(policy, tasks[index])
    files = files_to_upload(bucket.bucket, uploads) if bucket is not None and uploads else []
    confs = [spec.to_run_conf() for spec in specs]
    conf = confs[0] if pipeline is None else {"pipeline": pipeline, "jobs": confs}
    values = {
        spec.secrets[name]: one.secrets[name]
        for spec, one in zip(specs, tasks, strict=True)
        for name in spec.secrets
    }
    with _api(api) as client:
        check_dag_ready(client, dag_id)
        if pipeline is not None:
            _check_pipeline_slots(client, dag_id, len(tasks))
        if confirm is not None and not confirm(pipeline or tasks[0].name or "unnamed"):
            raise LaunchAborted("Aborted: nothing was uploaded or submitted")
        with _uploaded(bucket, run_uri if uploads else None, files, upload_progress):
            _submit(client, dag_id, run_id, conf, values)
    return run_id


def client_policy() -> ConfPolicy | None:
    """The deployment's run conf policy as this machine knows it: its `AIRFLOW__SKY__MANAGED_*` variables
    (as on a machine that shares the deployment's settings). None when none is set: the deployment's spec
    task then checks alone (a conf naming a worker path is refused here all the same)."""
    settings = {name: os.environ.get(f"AIRFLOW__SKY__{name.upper()}") for name in SETTINGS}
    if not any(settings.values()):
        return None
    return ConfPolicy.from_settings(settings.get, os.environ.get("AIRFLOW__SKY__DEFAULT_STORE"))


def _jobs_bucket_for(tasks: list[Task], pipeline: str | None) -> JobsBucketConfig | None:
    """The jobs bucket, when a task names local paths (else None, and the setting is not even read); without
    one configured, those paths are refused naming the setting."""
    unreadable = [(one, local_paths(one)) for one in tasks]
    unreadable = [(one, fields) for one, fields in unreadable if fields]
    if not unreadable:
        return None
    bucket = jobs_bucket_config()
    if bucket is None:
        one, fields = unreadable[0]
        raise SpecError(
            f"{_label(one, pipeline)}{', '.join(fields)}: a managed job runs on the deployment's workers, which "
            f"cannot read this machine's files; set {SETTING} to a bucket (s3://<bucket>[/<prefix>] or gs://...) "
            "that `jobs launch` uploads them to for the job (the deployment's [sky] jobs_bucket must name "
            "the same; docs/deploy.md), or use a git workdir (workdir: {url: ...})"
        )
    return bucket


@contextlib.contextmanager
def _uploaded(
    bucket: JobsBucketConfig | None,
    run_uri: str | None,
    files: list[UploadFile],
    progress: UploadProgress | None,
) -> Iterator[None]:
    """The run's local files uploaded for the body; removed again when the body (or the upload) fails, so
    that nothing of a refused launch stays behind."""
    if bucket is None or run_uri is None:
        yield
        return
    store = open_store(bucket)
    store.check()
    try:
        upload(store, files, run_uri, progress)
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            store.delete(run_prefix(bucket.bucket, run_uri))
        raise


def _submit(
    client: AirflowApi, dag_id: str, run_id: str, conf: dict[str, Any], values: Mapping[str, str]
) -> None:
    """Create the secrets' Variables, then the run; on a refusal, delete the Variables again."""
    created: list[str] = []
    try:
        for key, value in values.items():
            client.request(
                "POST",
                "/variables",
                json={"key": key, "value": value, "description": f"a secret of {run_id}"},
            )
            created.append(key)
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        try:
            client.request("POST", api_path("dags", dag_id, "dagRuns"), json=body)
        except ApiError as e:
            if e.status_code != 404:
                raise
            raise _no_dag(client, dag_id) from e
    except ApiError:
        for key in created:  # nothing of a refused launch stays behind
            with contextlib.suppress(ApiError):
                client.request("DELETE", api_path("variables", key))
        raise


def _tasks_of(
    task: Task | Pipeline | str | os.PathLike[str], env: Mapping[str, str] | None
) -> tuple[list[Task], str | None]:
    """The tasks to run (copies of a given Task's or Pipeline's, which launch edits), and the pipeline's
    name (None for a single task)."""
    if isinstance(task, Task):
        return [task.with_envs(env or {})], None
    if not isinstance(task, Pipeline):
        task = Pipeline.from_yaml(os.fspath(task), env_overrides=env)
        if len(task.tasks) == 1 and task.execution == SERIAL:
            return task.tasks, None
    else:
        task = dataclasses.replace(task, tasks=[one.with_envs(env or {}) for one in task.tasks])
    if task.execution != SERIAL:
        raise SpecError(
            f"pipeline {task.name}: execution: {task.execution}: a managed job runs a pipeline's tasks in order; "
            "put a parallel pipeline in a DAG (dags_from_folder) instead"
        )
    return list(task.tasks), task.name


def _label(task: Task, pipeline: str | None) -> str:
    return "" if pipeline is None else f"task {task.name or '(unnamed)'}: "


def check_dag_ready(client: AirflowApi, dag_id: str = MANAGED_DAG_ID) -> None:
    """Refuse (DagNotReady, naming the fix) when the deployment's `dag_id` is missing or paused: a run of a
    paused DAG stays queued, and `jobs queue` would say PENDING forever."""
    dag = _dag_get(client, dag_id)
    if dag.get("is_stale"):  # its file left the DAG folder: the scheduler runs none of its runs
        raise _no_dag(client, dag_id)
    if dag.get("is_paused"):
        raise DagNotReady(
            f"the managed jobs DAG {dag_id} is paused on the Airflow at {client.config.url}, so a job would "
            f"wait PENDING; unpause it: `airflow dags unpause {dag_id}` (or PATCH /api/v2/dags/{dag_id} "
            '{"is_paused": false}, or its toggle in the UI)',
            409,
        )


def _dag_get(client: AirflowApi, dag_id: str, *below: str, **params: Any) -> Any:
    """GET the DAG's own path (or one below it); a 404 says the DAG is not deployed, and how to deploy it."""
    try:
        return client.get(api_path("dags", dag_id, *below), **params)
    except ApiError as e:
        if e.status_code == 404:
            raise _no_dag(client, dag_id) from e
        raise


def _no_dag(client: AirflowApi, dag_id: str) -> DagNotReady:
    argument = "" if dag_id == MANAGED_DAG_ID else f"dag_id={dag_id!r}"
    return DagNotReady(
        f"the Airflow at {client.config.url} has no DAG {dag_id}: deploy it with a file in its DAG folder "
        f"holding `from airflow_sky.dags.managed import managed_jobs_dag; dag = managed_jobs_dag({argument})` "
        "(docs/deploy.md#managed-jobs)",
        404,
    )


def _check_pipeline_slots(client: AirflowApi, dag_id: str, jobs: int) -> None:
    """Refuse, before anything is created, a pipeline longer than the deployed DAG has slots for."""
    tasks = _dag_get(client, dag_id, "tasks")["tasks"]
    slots = sum(1 for t in tasks if re.fullmatch(r"spec\d*", str(t.get("task_id"))))
    if jobs > slots:
        raise SpecError(
            f"the pipeline has {jobs} tasks; the deployed {dag_id} DAG runs at most {slots} "
            f"(deploy it as managed_jobs_dag(pipeline_slots={jobs}) or more)"
        )


def queue(limit: int = 50, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> list[ManagedJob]:
    """The latest managed jobs, newest first."""
    with _api(api) as client:
        runs = _dag_get(client, dag_id, "dagRuns", limit=limit, order_by="-run_after")
        return [_job(client, dag_id, run) for run in runs["dag_runs"]]


def job(job_id: str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> ManagedJob:
    """One managed job's status."""
    check_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with _api(api) as client:
        return _job(client, dag_id, client.get(_run_path(dag_id, job_id)))


def cancel(job_id: str, api: AirflowApi | None = None, dag_id: str = MANAGED_DAG_ID) -> None:
    """Stop the job: its run is marked failed; its follow tasks are killed, which stops every rank, and its
    teardown still runs, which (with down, the default) terminates the nodes."""
    check_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with _api(api) as client:
        run = client.get(_run_path(dag_id, job_id))
        if run["state"] in ("success", "failed"):
            raise SpecError(f"job {job_id} already ended ({_status(client, dag_id, run, [])})")
        client.request("PATCH", _run_path(dag_id, job_id), json={"state": "failed", "note": CANCEL_NOTE})


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
    check_job_id(job_id)  # a typo or a hostile id is one line, never a request
    with _api(api) as client:
        readers: dict[tuple[str, int, int], _LogReader] = {}
        while True:
            run = client.get(_run_path(dag_id, job_id))
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
                for line in _spec_errors(client, dag_id, job_id, tis) if ended else ():
                    emit(line)
                return _job(client, dag_id, run, tis)
            time.sleep(poll_s)


def _spec_errors(client: AirflowApi, dag_id: str, run_id: str, tis: list[dict[str, Any]]) -> Iterator[str]:
    """Why the deployment refused the run's conf: the error its failed spec task logged (the deployment's
    policy, a conf this machine did not check), as one line each."""
    for ti in tis:
        if not (re.fullmatch(r"spec\d*", _step(ti)) and ti.get("state") == "failed" and ti.get("try_number")):
            continue
        path = _run_path(dag_id, run_id) + api_path("taskInstances", ti["task_id"], "logs", ti["try_number"])
        try:
            page = client.request("GET", path, headers={"Accept": "application/json"}).json()
        except (ApiError, ValueError):
            continue
        errors = [
            str(error["exc_value"])
            for event in page.get("content") or []
            for value in (event.values() if isinstance(event, dict) else ())
            for error in (value if isinstance(value, list) else ())
            if isinstance(error, dict) and error.get("exc_value")
        ]
        if errors:  # the first: the exception raised (the rest are its causes)
            yield f"{ti['task_id']} failed: {errors[0]}"


class _LogReader:
    """One task instance try's log, read on from where the last read ended (the API's continuation token)."""

    def __init__(
        self, client: AirflowApi, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
    ):
        self.client = client
        self.path = _run_path(dag_id, run_id) + api_path("taskInstances", task_id, "logs", try_number)
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


def _run_path(dag_id: str, run_id: str) -> str:
    """The REST path of a DAG run (a job id a user gave is checked first: check_job_id)."""
    return api_path("dags", dag_id, "dagRuns", run_id)


def _step(ti: Mapping[str, Any]) -> str:
    return str(ti["task_id"]).rsplit(".", 1)[-1]


def _task_instances(client: AirflowApi, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return list(client.pages(_run_path(dag_id, run_id) + "/taskInstances", "task_instances"))


def _job(
    client: AirflowApi, dag_id: str, run: Mapping[str, Any], tis: list[dict[str, Any]] | None = None
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
    return ManagedJob(
        job_id=run["dag_run_id"],
        name=str(conf.get("pipeline") or task.get("name") or "-"),
        status=_status(client, dag_id, run, tis, status_xcom),
        recoveries=sum(int(x.get("generation", 0)) for x in pushed),
        num_nodes=num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else None,
        submitted=_time(run.get("queued_at")) or started,
        duration_s=((ended or datetime.now(UTC)) - started).total_seconds() if started else None,
        infra=str(first.get("infra") or "local"),
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


def _job_status_xcom(
    client: AirflowApi, dag_id: str, run_id: str, group: str = JOB_GROUP
) -> dict[str, Any] | None:
    """What the head's run follow task of `group` last pushed about recoveries (none before the first)."""
    path = _run_path(dag_id, run_id) + api_path(
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
