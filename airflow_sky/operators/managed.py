"""The tasks around a managed job: reading its spec from the run conf, then, when the run ends, forgetting
its secrets and removing the files `jobs launch` uploaded for it."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow.sdk import BaseOperator, Variable
from airflow.sdk.exceptions import AirflowSkipException

from airflow_sky.errors import SpecError
from airflow_sky.hooks.cluster import jobs_bucket_setting, remove_job_files, sky_setting
from airflow_sky.operators.job_spec import SECRET_NAME, JobSpec, job_confs, secret_owner, secret_variable_key
from airflow_sky.operators.secrets import read_secrets
from airflow_sky.task.cluster_namespace import run_cluster_name
from airflow_sky.task.conf_policy import ConfPolicy
from airflow_sky.task.jobs_bucket import checked_uploads_uri


def deployment_policy() -> ConfPolicy:
    """The deployment's rules for run confs: the `[sky] managed_*` settings of the Airflow config
    (task.conf_policy: AIRFLOW__SKY__MANAGED_INFRAS, ...) read by this worker, and its `jobs_bucket`, of which
    a run may mount its own uploads only."""
    return ConfPolicy.from_settings(
        sky_setting,
        default_store=sky_setting("default_store"),
        jobs_bucket=jobs_bucket_setting(),
    )


def triggering_user(context: Any) -> str | None:
    """The Airflow user who triggered the run (the UI, the REST API, `airflow dags trigger`); None for a run
    the scheduler made."""
    user = getattr(context["dag_run"], "triggering_user_name", None)
    return user if isinstance(user, str) and user else None


class SkyJobSpecOperator(BaseOperator):
    """Checks the run conf of a managed job (see operators.job_spec) and returns the spec of the job in slot
    `index` (0: the job, or a pipeline's first); every task of that job reads the spec from this task's XCom.
    A bad conf, or one the deployment's policy refuses for the user who triggered the run
    (deployment_policy), fails here, before any node exists; a slot the pipeline does not use is skipped,
    and so is every task after it.

    A job whose conf names no cluster gets one of its own here, named with 64 random bits
    (task.cluster_namespace.run_cluster_name): the spec carries the name to every task of the job, so its
    retries find the same cluster, and no run id leads to it."""

    ui_color = "#e8eaf6"

    def __init__(self, *, index: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index

    def execute(self, context: Any) -> dict[str, Any]:
        confs = job_confs(context["dag_run"].conf or {})
        if self.index >= len(confs):
            raise AirflowSkipException(f"the run has {len(confs)} job(s); slot {self.index + 1} is not used")
        source = "the run conf" if len(confs) == 1 else f"the run conf: jobs[{self.index}]"
        owner = secret_owner(self.dag_id, context["run_id"], self.index)
        spec = JobSpec.from_conf(confs[self.index], source=source, owner=owner)
        task = spec.load_task(read_secrets(spec))
        user = triggering_user(context)
        # Before anything is provisioned, and on the conf's own cluster name (a run's own is always fine).
        spec.check_policy(deployment_policy(), task, source, user)
        if spec.cluster_name is None and spec.pool is None:  # (a pool's job gets its worker's cluster)
            # A pipeline's jobs run one after the other, each on a cluster of its own (as in SkyPilot).
            job = f"job{self.index + 1}" if len(confs) > 1 else None
            spec = dataclasses.replace(spec, cluster_name=run_cluster_name(self.dag_id, job))
        if spec.uploads is not None:
            # A prefix this deployment could not remove at the end is refused before any node exists.
            checked_uploads_uri(spec.uploads, jobs_bucket_setting(), context["run_id"], f"{source}: uploads")
        self.log.info(
            "Job %s of %s: %d node(s) on %s, cluster %s (%s)",
            task.name or "(unnamed)",
            user or "no user",
            task.num_nodes,
            spec.infra,
            spec.cluster_name or f"a worker of pool {spec.pool}",
            "torn down at the end" if spec.down else "kept",
        )
        return spec.to_conf()


class SkyForgetSecretsOperator(BaseOperator):
    """Deletes the Airflow Variables that held a managed job's secrets, once the job ended (a teardown task:
    it runs whatever the job's outcome, and when the run is cancelled). Reads the run conf itself, so that
    it cleans up after a conf the spec task refused, too."""

    ui_color = "#e8eaf6"

    def execute(self, context: Any) -> None:
        try:
            confs = job_confs(context["dag_run"].conf or {})
        except SpecError:
            confs = []
        keys = [
            secret_variable_key(secret_owner(self.dag_id, context["run_id"], index), name)
            for index, conf in enumerate(confs)
            if isinstance(conf, dict) and isinstance(conf.get("secrets"), list)
            for name in conf["secrets"]
            if isinstance(name, str) and SECRET_NAME.match(name)
        ]
        for key in keys:
            Variable.delete(key)
        self.log.info("Deleted the Variables of %d secret(s)", len(keys))


class SkyRemoveUploadsOperator(BaseOperator):
    """Removes the files `jobs launch` uploaded for the run (its tasks' workdirs and local file_mounts, under
    `<jobs bucket>/<run id>/`) once the run ended: a teardown task, so also after a failure or a cancel, and
    idempotent. Reads the run conf itself; removes only this run's prefix of the deployment's own
    `[sky] jobs_bucket` (a conf naming anything else fails this task and deletes nothing)."""

    ui_color = "#e8eaf6"

    def __init__(self, *, aws_conn_id: str | None = None, gcp_conn_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Any) -> None:
        try:
            confs = job_confs(context["dag_run"].conf or {})
        except SpecError:
            confs = []
        named = sorted({str(c["uploads"]) for c in confs if isinstance(c, dict) and c.get("uploads")})
        if not named:
            self.log.info("The run uploaded no files")
            return
        configured = jobs_bucket_setting()
        prefixes = {checked_uploads_uri(uri, configured, context["run_id"]) for uri in named}
        for prefix in sorted(prefixes):
            remove_job_files(prefix, self.log.info, self.aws_conn_id, self.gcp_conn_id)
