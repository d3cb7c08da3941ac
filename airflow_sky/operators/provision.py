"""Provision: bring the cluster up (or reuse it) and register the job in the cluster's queue."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from airflow_sky.gang.job import sanitize_cluster_name
from airflow_sky.gang.state import ClusterClosing
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.hooks.pool import SkyPoolHook
from airflow_sky.infra.ledger import owner_of
from airflow_sky.operators.base import CONN_ID_XCOM_KEY, SWEEP_CANCEL_XCOM_KEY, SkyBaseOperator
from airflow_sky.operators.job_spec import JobSpec
from airflow_sky.task import GitWorkdir
from airflow_sky.task.envs import pipeline_task_ids
from airflow_sky.task.resources_effects import no_effect_warning

_CLOSING_ATTEMPTS = 3  # provisions of a cluster that another run's teardown ended meanwhile


def default_cluster_name(dag_id: str, run_id: str, job: str | None = None) -> str:
    """One cluster per DAG run, so overlapping runs never share nodes: `<dag>-<hash of dag and run id>`; a
    job of a pipeline gets one of its own: `<dag>-<job>-<hash>`. The hash keeps 64 bits: whoever may trigger
    the DAG chooses the run id, and must not be able to pick one whose cluster is another run's."""
    digest = hashlib.sha256(json.dumps([dag_id, run_id]).encode()).hexdigest()[:16]
    if job is None:
        return sanitize_cluster_name(f"{dag_id[:23]}-{digest}")
    return sanitize_cluster_name(f"{dag_id[:12]}-{job[:10]}-{digest}")


def trial_cluster_name(dag_id: str, run_id: str, group: str) -> str:
    """A sweep trial's own cluster (a sweep without a pool): one per trial of each DAG run, its group id in
    the hash, so that trials (and two sweeps of one DAG) never share one."""
    digest = hashlib.sha256(json.dumps([dag_id, run_id, group]).encode()).hexdigest()[:16]
    return sanitize_cluster_name(f"{dag_id[:12]}-{group.rpartition('.')[2][:10]}-{digest}")


@dataclasses.dataclass(frozen=True)
class PipelineSlot:
    """Where a job sits in a pipeline: SKYPILOT_TASK_IDS names every task of it, and the job its own."""

    name: str
    index: int
    task_names: tuple[str, ...]
    task_ids: tuple[str, ...] = ()  # given (the CLI runs a pipeline's jobs as runs of their own), else
    # derived from the DAG run, so every job of one run agrees on them


@dataclasses.dataclass(frozen=True)
class _PoolWorker:
    """The pool worker a job runs on, what hands it over to the worker's own queue, and the pool's task."""

    cluster: str
    hand_over: Callable[[], None]
    task: dict[str, Any]


class SkyProvisionOperator(SkyBaseOperator):
    """Brings up `num_nodes` nodes (idempotent) and allocates the job id; returns the JobHandle as a dict.

    XComs: the return value is every node of the cluster (a list of dicts, head first: sync and setup map
    over it); the key `handle` holds the JobHandle as a dict, which every other task of the job reads; when
    the task sets resources.ports, the key `endpoints` maps each opened port to `host:port` on the head
    node (as `airflow-sky status --endpoints`; JSON keys, so the ports are strings there).
    A failure after nodes were created for this run tears them down here, since a teardown does not run
    when its setup task failed.
    """

    template_fields: Sequence[str] = ("cluster_name", "sky_task")
    ui_color = "#c8e6c9"

    def __init__(
        self,
        *,
        cluster_name: str | None = None,
        infra: str = "local",
        down: bool = True,
        must_exist: bool = False,
        retry_until_up: bool = False,
        pipeline: PipelineSlot | None = None,
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        sky_pool: str | None = None,
        sweep_plan_task: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.sky_pool = sky_pool  # (not `pool`: an operator's `pool` is the Airflow pool it takes a slot of)
        self.sweep_plan_task = (
            sweep_plan_task  # a sweep's trial: its plan task says when the sweep is cancelled
        )
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.pipeline = pipeline
        self.must_exist = must_exist
        self.retry_until_up = retry_until_up
        self.cluster_name = cluster_name
        self.infra = infra
        self.down = down

    def adopt_job_spec(self, spec: JobSpec) -> None:
        self.infra, self.down = spec.infra, spec.down
        self.cluster_name = spec.cluster_name or self.cluster_name
        if spec.pool:
            self.sky_pool, self.must_exist, self.down = spec.pool, True, False

    def _skip_if_sweep_cancelled(self, context: Any) -> None:
        """A trial of a cancelled sweep does not start (skipped, as the trials never reached)."""
        if self.sweep_plan_task is None:
            return
        reason = context["ti"].xcom_pull(task_ids=self.sweep_plan_task, key=SWEEP_CANCEL_XCOM_KEY)
        if reason:
            raise AirflowSkipException(f"the sweep was cancelled ({reason}): this trial does not start")

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.mask_secrets()  # (and a managed job's spec adopted: its infra, cluster, down and pool)
        self._skip_if_sweep_cancelled(context)
        if not self.sky_pool:
            return self._provision(context, None)
        # A pool's job runs on a free worker, set up already: it waits its turn in the pool's queue (PENDING)
        # and holds the worker once it is registered in the worker cluster's own job queue.
        pool = SkyPoolHook(self.sky_pool, self.infra, self.conn_id)
        key = f"{self.dag_id}/{context['run_id']}/{self.task_id}"

        def wait(seconds: float) -> None:
            self._skip_if_sweep_cancelled(context)
            time.sleep(seconds)

        worker, ticket = pool.wait_for_worker(key, self.sky_task.name or self.task_id, self.log.info, wait)
        try:
            self._skip_if_sweep_cancelled(context)  # cancelled while it waited: the worker goes back
            hand_over = functools.partial(pool.hand_over, worker, ticket)
            return self._provision(context, _PoolWorker(worker, hand_over, pool.record.task))
        except BaseException:
            pool.give_up(ticket, worker)
            raise

    def _provision(self, context: Any, worker: _PoolWorker | None) -> list[dict[str, Any]]:
        """Provision (or reuse) the cluster and register the job; `worker`: the pool worker to run on."""
        run_id = context["run_id"]
        job = self.task_id.rsplit(".", 1)[0] if self.pipeline and "." in self.task_id else None
        # Normalized here too: a DAG's cluster_name (sky_job's keyword, a run conf's) is rendered only now.
        if worker is not None:
            name = worker.cluster
        elif self.cluster_name:
            name = self.cluster_name
        elif self.sweep_plan_task is not None:  # a trial of a sweep without a pool: a cluster of its own
            name = trial_cluster_name(self.dag_id, run_id, self.task_id.rpartition(".")[0])
        else:
            name = default_cluster_name(self.dag_id, run_id, job)
        name = sanitize_cluster_name(name)
        hook = SkyClusterHook(name, self.infra, self.conn_id)
        no_effect = no_effect_warning(self.task_id, self.sky_task.resources, self.infra)
        if no_effect is not None:
            self.log.warning("%s", no_effect)
        hook.check_autostop(self.sky_task)
        current = hook.nodes()
        existed = bool(current)
        if self.must_exist:
            hook.check_exec_nodes(current, self.sky_task.num_nodes, "TASK.yaml")
        self.log.info(
            "%s cluster %s on %s (%d nodes)",
            "Reusing" if existed else "Launching",
            name,
            self.infra,
            self.sky_task.num_nodes,
        )
        # Buckets first: a bucket the connection cannot reach fails the job before any node costs money.
        triggering_user = getattr(context.get("dag_run"), "triggering_user_name", None)
        owner = owner_of(self.dag_id, run_id, triggering_user)
        buckets = hook.prepare_buckets(self.sky_task, self.log.info, self.aws_conn_id, self.gcp_conn_id)
        try:
            for attempt in range(1, _CLOSING_ATTEMPTS + 1):
                try:
                    hook.provision(self.sky_task, retry_until_up=self.retry_until_up, owner=owner)
                    nodes = hook.running_nodes(expected=self.sky_task.num_nodes)
                    hook.arm_autostop(self.sky_task, nodes)
                    handle = hook.register_job(
                        self.sky_task,
                        nodes,
                        submit_key=f"{self.dag_id}/{run_id}/{self.task_id}",
                        pipeline_task_ids=self._pipeline_task_ids(context),
                        pipeline_index=self.pipeline.index if self.pipeline else 0,
                    )
                    break
                except ClusterClosing as e:
                    # Another run's teardown found the cluster idle and ended it under this provision.
                    if self.must_exist or attempt == _CLOSING_ATTEMPTS:
                        raise
                    self.log.info("Cluster %s: %s", name, e)
                    existed = False
            if buckets is not None:
                hook.record_job_buckets(handle, buckets)
            if worker is not None:
                hook.record_pool_task(handle, worker.task)
                worker.hand_over()  # the worker's own job queue holds it for this job now
        except BaseException:
            if not existed:  # half a cluster runs no job: nothing of this run's may be left behind
                self.log.warning("Provisioning failed; removing what was created for cluster %s", name)
                hook.terminate()
            raise
        self.log.info("Job %d on cluster %s (SKYPILOT_TASK_ID=%s)", handle.job_id, name, handle.sky_task_id)
        # The cluster's job queue: the job starts once no earlier job needs its nodes (gang.job_queue).
        runs_setup = not self.must_exist and self.sky_task.setup is not None
        hook.wait_in_queue(self.sky_task, handle, runs_setup, self.log.info)
        workdir = self.sky_task.workdir
        if isinstance(workdir, GitWorkdir) and handle.git_commit is not None:
            # Pinned once for the job: every node (and a recovery's replacement) checks out this commit.
            self.log.info(
                "workdir: %s at %s -> commit %s", workdir.url, workdir.ref or "HEAD", handle.git_commit
            )
        for node in handle.nodes:
            self.log.info(
                "node rank %d: %s (%s, %s)", node.rank, node.internal_ip, node.instance_id, node.status.value
            )
        # Without the nodes: every task renders this XCom as a template field, and the job state has them.
        context["ti"].xcom_push(key="handle", value=handle.to_dict(nodes=False))
        if self.conn_id is not None:  # a name, never a credential
            context["ti"].xcom_push(key=CONN_ID_XCOM_KEY, value=self.conn_id)
        if self.sky_task.resources.ports:
            endpoints = hook.cluster.endpoints()
            self.log.info("endpoints: %s", ", ".join(f"{p}: {a}" for p, a in endpoints.items()))
            context["ti"].xcom_push(key="endpoints", value={str(p): a for p, a in endpoints.items()})
        return [n.to_dict() for n in handle.nodes]

    def _pipeline_task_ids(self, context: Any) -> tuple[str, ...]:
        """In a pipeline: every task's SKYPILOT_TASK_ID, the same in each of the run's provision tasks."""
        if self.pipeline is None:
            return ()
        if self.pipeline.task_ids:
            return self.pipeline.task_ids
        dag_run = context["dag_run"]
        started = dag_run.run_after or dag_run.logical_date
        run_key = hashlib.sha1(f"{self.dag_id}/{dag_run.run_id}".encode()).hexdigest()[:6]
        return tuple(pipeline_task_ids(self.pipeline.name, self.pipeline.task_names, started, run_key))
