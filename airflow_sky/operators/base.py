"""What every airflow-sky operator shares: the task spec, the infra, and the job handle from provision."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.log import mask_secret

from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import JobHandle
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.operators.job_spec import JobSpec
from airflow_sky.operators.secrets import read_secrets
from airflow_sky.task import Task
from airflow_sky.task.redaction import sensitive_values
from airflow_sky.task.templating import protect_shell_syntax

# Mapped per-node tasks show up in the UI as e.g. "rank 1 · 127.0.0.3".
NODE_MAP_INDEX_TEMPLATE = "rank {{ task.node['rank'] }} · {{ task.node['internal_ip'] }}"


RESULT_XCOM_KEY = "result"  # every run follow task's {"rank": r, "value": its return.json or None}
# The job's final progress (gang.job_progress.final_metrics: step, total, metrics per rank, recoveries).
PROGRESS_XCOM_KEY = "progress"
# A sweep's plan task (dags.sweep) pushes its trials under SWEEP_XCOM_KEY; a cancel of the sweep pushes the
# reason under SWEEP_CANCEL_XCOM_KEY to the same task instance, which every trial not yet started reads.
SWEEP_XCOM_KEY = "sky_sweep"
SWEEP_CANCEL_XCOM_KEY = "sky_sweep_cancelled"
JOB_STATUS_XCOM_KEY = "job_status"  # a run follow task's {"status": RECOVERING | RUNNING, "generation": g}
# The Airflow connection the job's cluster is reached through, when not the infra's default (an ssh pool's
# connection, an aws/gcp conn_id): the provision task pushes it so the progress view can read the job live.
CONN_ID_XCOM_KEY = "conn_id"


class SkyBaseOperator(BaseOperator):
    """Base of the phase operators. `cluster` is the provision task's XCom (a JobHandle as a dict)."""

    ui_color = "#d6e9ff"
    # `cluster` arrives as an XComArg: Airflow resolves XComArgs in template fields at run time. The task
    # spec's own template fields (setup, run, envs, secrets) render per run.
    template_fields: Sequence[str] = ("cluster", "sky_task")
    _sky_task: Task | Any  # see the sky_task property
    # The rendered-template view shows the spec's rendered scripts and envs (secrets masked), not a repr.
    template_fields_renderers = {
        "sky_task.setup": "bash",
        "sky_task.run": "bash",
        "sky_task.envs": "json",
        "sky_task.secrets": "json",
    }

    def __init__(
        self,
        *,
        sky_task: Task | Any,
        cluster: dict[str, Any] | Any = None,
        conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(sky_task, Task):
            # A copy per operator: rendering templates fills the spec in place. Shell syntax that Jinja would
            # misread is escaped here, not at render time: a mapped task renders without calling our hooks.
            sky_task = copy.deepcopy(sky_task)
            sky_task.setup = protect_shell_syntax(sky_task.setup)
            sky_task.run = protect_shell_syntax(sky_task.run)
        # Otherwise an XComArg: a managed job's spec (operators.job_spec), resolved at run time. Its scripts
        # are never rendered by Jinja: they come from a run conf, not from the DAG's author.
        self.sky_task = sky_task
        self.cluster = cluster
        self.conn_id = conn_id

    @property
    def sky_task(self) -> Task:
        """The task; a managed job's spec becomes its Task (secrets read from their Variables) on first use."""
        value: Any = self._sky_task
        if isinstance(value, Mapping):
            spec = JobSpec.from_conf(value, source="the job spec")
            self._sky_task = value = spec.load_task(read_secrets(spec))
            self.adopt_job_spec(spec)
        return value

    @sky_task.setter
    def sky_task(self, value: Task | Any) -> None:
        self._sky_task = value

    def adopt_job_spec(self, spec: JobSpec) -> None:
        """Take what a managed job's spec says beyond the task (infra, cluster, down); see the overrides."""

    def handle(self) -> JobHandle:
        """The job this task works on, with its nodes as the job state has them."""
        return self.job.handle

    @functools.cached_property
    def job(self) -> GangJob:
        """The job on its cluster (gang.gang_job), from the hook: built once per task, one Cluster and one
        infra driver for all the task does."""
        named = JobHandle.from_dict(self.cluster)
        return self.hook(named).job(named)

    def latest_handle(self, context: Any) -> JobHandle:
        """The job as of its current generation (the job state): a recovery may have replaced nodes."""
        return self.job.current()

    def hook(self, handle: JobHandle) -> SkyClusterHook:
        """The task's one hook on `handle`'s cluster (built on first use)."""
        hook: SkyClusterHook | None = getattr(self, "_hook", None)
        if hook is None or (hook.cluster_name, hook.infra) != (handle.cluster_name, handle.infra or "local"):
            hook = self._hook = SkyClusterHook(handle.cluster_name, handle.infra, self.conn_id)
        return hook

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        # Secrets are registered before and after rendering, so neither the literal nor the rendered value
        # reaches a log or the rendered-template view.
        self.mask_secrets()
        super().render_template_fields(context, jinja_env)
        self.mask_secrets()

    def render_template(
        self, content: Any, context: Any, jinja_env: Any = None, seen_oids: set[int] | None = None
    ) -> Any:
        # A string without Jinja syntax renders to itself: skip compiling it. Every per-node task renders
        # the task's scripts and envs, and a 64-node job has hundreds of task instances.
        if isinstance(content, str) and "{" not in content and not content.endswith(tuple(self.template_ext)):
            return content
        return super().render_template(content, context, jinja_env, seen_oids)

    def mask_secrets(self) -> None:
        """Register the task's secrets with Airflow's masker before anything can log them."""
        if not isinstance(self._sky_task, Task | Mapping):
            return  # a managed job's spec not resolved yet: its secrets are masked as they are read
        for key, value in sensitive_values(self.sky_task).items():
            mask_secret(value, name=key)

    @property
    def group_prefix(self) -> str:
        """`group.` for a task inside sky_job's TaskGroup (used to find sibling tasks' XComs)."""
        return self.task_id.rsplit(".", 1)[0] + "." if "." in self.task_id else ""
