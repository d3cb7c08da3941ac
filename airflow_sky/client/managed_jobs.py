"""Managed jobs: a task run by a deployed Airflow (the `airflow_sky_jobs` DAG), like `sky jobs`.

`launch` checks the task here, uploads its local files to the jobs bucket (client.jobs_bucket), puts its
secrets into Airflow Variables and triggers a run of the DAG through the REST API; `queue`, `logs` and
`cancel` (client.managed_runs, re-exported here) read and steer those runs through the same API. Nothing
here touches a node: the deployment's workers do, so a job goes on when this process (or laptop) is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets as random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_sky.client.airflow_api import AirflowApi, ApiError, api_config, api_path
from airflow_sky.client.cluster_names import check_cluster_name
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
from airflow_sky.client.managed_dag import borrowed_api, check_dag_ready, check_pipeline_slots, no_dag
from airflow_sky.client.managed_ids import create_run_with_id
from airflow_sky.client.managed_runs import ManagedJob, cancel, job, latest, logs, queue, unfinished
from airflow_sky.dags.managed import MANAGED_DAG_ID
from airflow_sky.errors import SkyError, SpecError
from airflow_sky.operators.job_spec import JobSpec, secret_owner, secret_variable_key
from airflow_sky.task import Task
from airflow_sky.task.conf_policy import SETTINGS, ConfPolicy
from airflow_sky.task.jobs_bucket import LocalUpload, job_files_uri, local_paths, translate_local_paths
from airflow_sky.task.pipeline import SERIAL, Pipeline
from airflow_sky.task.pool import check_pool_job, check_pool_name

__all__ = [
    "LaunchAborted",
    "ManagedJob",
    "cancel",
    "client_policy",
    "job",
    "latest",
    "launch",
    "logs",
    "queue",
    "unfinished",
]


class LaunchAborted(SkyError):
    """The user declined the launch at its confirmation (nothing was created)."""


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
    pool: str | None = None,
) -> int:
    """Submit `task` (a Task, a Pipeline, or a task YAML: one task or a pipeline file) as a managed job;
    returns its job id (a small integer, claimed atomically with the run: client.managed_ids). A
    pipeline's tasks run in order in that one run, each on a cluster of its own; the deployed DAG needs as many pipeline slots (`managed_jobs_dag(pipeline_slots=N)`).

    Everything is checked here: a bad task is refused before anything reaches Airflow. Secrets go into
    Airflow Variables (never into the run's conf), which the run deletes when it ends. A local workdir and
    local file_mounts are uploaded to the configured jobs bucket (client.jobs_bucket), which the run removes
    when it ends; without one they are refused, naming the setting.

    :param confirm: asked with the job's name once the task is checked, before anything is uploaded or
        created; False raises LaunchAborted.
    :param upload_progress: told how the upload of local files goes (files and bytes).
    :param pool: run on a free worker of this pool (`jobs pool apply`): the task may have no setup, workdir
        or file_mounts, and the worker stays up after the job.
    """
    tasks, pipeline = _tasks_of(task, env)
    if pool is not None:
        if pipeline is not None or cluster_name is not None:
            raise SpecError("--pool: a pool's job is one task, run on the pool's workers (no -c/--cluster)")
        check_pool_name(pool)
        check_pool_job(tasks[0], "the pool's job")
        down = False
    if cluster_name is not None:
        cluster_name = check_cluster_name(cluster_name)  # the name the cluster gets, as `launch -c` names it
    for one in tasks:
        if secrets:
            one.update_secrets(secrets)
    if num_nodes is not None:
        if pipeline is not None:
            raise SpecError("num_nodes: a pipeline's tasks name their own node counts")
        if num_nodes < 1:
            raise SpecError(f"num_nodes: must be an integer >= 1, got {num_nodes}")
        tasks[0].num_nodes = num_nodes
    # The Variables are created before the run: whoever made a run of this id first would read them. 40
    # random bits make that a guess of one in a trillion per try, each a REST request.
    run_id = f"sky-job-{random.token_hex(5)}"
    bucket = _jobs_bucket_for(tasks, pipeline)
    ready = _Prepared.of(tasks, pipeline, bucket, dag_id, run_id, infra, cluster_name, down, pool)
    policy = client_policy()
    user = _api_user(api)
    for index, spec in enumerate(ready.specs):  # what the DAG's spec tasks will check, checked here first
        JobSpec.from_conf(spec.to_run_conf(), owner=secret_owner(dag_id, run_id, index))
        if policy is not None:
            # The deployment judges the cluster name by the user its API knows, which a token does not say.
            spec.check_policy(policy, ready.tasks[index], user=user, user_known=user is not None)
    files = files_to_upload(bucket.bucket, ready.uploads) if bucket is not None and ready.uploads else []
    with borrowed_api(api) as client:
        check_dag_ready(client, dag_id)
        if pipeline is not None:
            check_pipeline_slots(client, dag_id, len(tasks))
        if confirm is not None and not confirm(pipeline or tasks[0].name or "unnamed"):
            raise LaunchAborted("Aborted: nothing was uploaded or submitted")
        with _uploaded(bucket, ready.run_uri if ready.uploads else None, files, upload_progress):
            return _submit(client, dag_id, run_id, ready.conf, ready.values)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What a launch submits for one run id: the tasks (local paths turned into the run's uploads), their
    specs, the run conf, the secrets' Variables and the uploads."""

    run_id: str
    tasks: list[Task]
    specs: list[JobSpec]
    conf: dict[str, Any]
    values: dict[str, str]
    uploads: list[LocalUpload]
    run_uri: str | None

    @classmethod
    def of(
        cls,
        tasks: list[Task],
        pipeline: str | None,
        bucket: JobsBucketConfig | None,
        dag_id: str,
        run_id: str,
        infra: str | None,
        cluster_name: str | None,
        down: bool,
        pool: str | None = None,
    ) -> _Prepared:
        tasks = list(tasks)
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
            owner = secret_owner(dag_id, run_id, index)
            specs.append(
                JobSpec(
                    task=mapping,
                    secrets={name: secret_variable_key(owner, name) for name in one.secrets},
                    infra=infra or one.resources.infra or "local",
                    cluster_name=cluster_name if pipeline is None else None,
                    down=down,
                    uploads=run_uri if uploads else None,
                    pool=pool,
                )
            )
        confs = [spec.to_run_conf() for spec in specs]
        conf = confs[0] if pipeline is None else {"pipeline": pipeline, "jobs": confs}
        values = {
            spec.secrets[name]: one.secrets[name]
            for spec, one in zip(specs, tasks, strict=True)
            for name in spec.secrets
        }
        return cls(run_id, tasks, specs, conf, values, uploads, run_uri)


def client_policy() -> ConfPolicy | None:
    """The deployment's run conf policy as this machine knows it: its `AIRFLOW__SKY__MANAGED_*` variables
    (as on a machine that shares the deployment's settings). None when none is set: the deployment's spec
    task then checks alone (a conf naming a worker path is refused here all the same)."""
    settings = {name: os.environ.get(f"AIRFLOW__SKY__{name.upper()}") for name in SETTINGS}
    if not any(settings.values()):
        return None
    return ConfPolicy.from_settings(settings.get, os.environ.get("AIRFLOW__SKY__DEFAULT_STORE"))


def _api_user(api: AirflowApi | None) -> str | None:
    """The Airflow user this launch logs in as, when the API config names one (a token names none here)."""
    if api is not None:
        return api.config.username
    with contextlib.suppress(SkyError):
        return api_config().username
    return None


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
) -> int:
    """Create the secrets' Variables, then the run with the next free job id (returned); on a refusal,
    delete the Variables again."""
    created: list[str] = []
    try:
        for key, value in values.items():
            client.request(
                "POST",
                "/variables",
                json={"key": key, "value": value, "description": f"a secret of {dag_id} run {run_id}"},
            )
            created.append(key)
        try:
            return create_run_with_id(client, dag_id, {"dag_run_id": run_id, "conf": conf})
        except ApiError as e:
            if e.status_code != 404:
                raise
            raise no_dag(client, dag_id) from e
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
