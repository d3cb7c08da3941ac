"""SkyClusterHook: the one door from Airflow to a cluster's infra and nodes.

Operators and triggers reach clouds and nodes only through this hook: it builds the plain `Cluster` object
(infra.cluster) once from the infra name and the Airflow connection, does the cluster's work (provision,
register the job, the job queue, the per-node file work, buckets, release), and hands out the job object
(`job(handle)`, gang.gang_job.GangJob) for everything a job does on its nodes: start, follow, watch,
relaunch, cancel, kill, results.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_sky.errors import SkyError
from airflow_sky.gang import lifecycle
from airflow_sky.gang.cluster_down import Release, release_cluster
from airflow_sky.gang.cluster_jobs import wait_in_queue
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import (
    bucket_record,
    check_exec_nodes,
    job_bucket_record,
    job_states,
    record_buckets,
    register_job,
)
from airflow_sky.gang.pool import record_pool_task
from airflow_sky.infra import ledger
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.local.daemon import check_shared_mounts
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import artifacts, buckets
from airflow_sky.node.files import UploadResult, upload_task_files
from airflow_sky.node.settings import sky_setting
from airflow_sky.task import Task
from airflow_sky.task.container import inherited_container
from airflow_sky.task.hooks import HookEvent
from airflow_sky.task.storage import (
    BucketMount,
    bucket_mounts,
    default_store,
    has_bucket_mounts,
    shared_mount_paths,
)

# rclone options whose values are credentials: registered with Airflow's masker before any use.
_SECRET_OPTIONS = ("secret_access_key", "session_token", "service_account_credentials", "token")


def task_buckets(task: Task, infra: str | None) -> list[BucketMount]:
    """The task's bucket mounts on `infra` (a bucket named without `store` takes the infra's store, else
    `[sky] default_store`); raises SpecError naming the field."""
    configured = sky_setting("default_store")
    infra = infra or task.resources.infra or "local"
    mounts = bucket_mounts(task, default_store(infra, configured))
    if infra == "local":
        check_shared_mounts(shared_mount_paths(mounts))
    return mounts


def jobs_bucket_setting() -> str | None:
    """The deployment's jobs bucket (`[sky] jobs_bucket`): where `jobs launch` puts a managed job's local
    files; a run's end removes only its own prefix there."""
    return sky_setting("jobs_bucket")


def remove_job_files(
    uri: str, log: Callable[[str], None], aws_conn_id: str | None = None, gcp_conn_id: str | None = None
) -> int:
    """Delete the objects below `uri` (a checked run prefix: task.jobs_bucket.checked_uploads_uri) with the
    Airflow connection of its store; returns how many."""
    return buckets.delete_prefix(uri, log, aws_conn_id, gcp_conn_id)


class SkyClusterHook(BaseHook):
    """Talks to one cluster: provisioning through its Cloud driver, files through SSH, jobs through the
    GangJob it hands out. A task builds one (SkyBaseOperator.hook), and with it one Cluster.

    :param cluster_name: the cluster (instances are found by this name on the infra).
    :param infra: `local`, `ssh/<pool>`, `aws[/region]`, `gcp[/region]`.
    :param conn_id: the Airflow connection with the infra's credentials (clouds other than local).
    """

    conn_name_attr = "conn_id"
    hook_name = "airflow-sky cluster"

    def __init__(self, cluster_name: str, infra: str = "local", conn_id: str | None = None) -> None:
        super().__init__()
        self.cluster_name = cluster_name
        self.infra = infra or "local"
        self.conn_id = conn_id
        self._jobs: dict[int, GangJob] = {}

    @functools.cached_property
    def cluster(self) -> Cluster:
        """The plain Cluster object the gang core works with: built once per hook, as the SSH provider's
        hook keeps its client (one infra driver, one cloud session, for all a task does)."""
        return open_cluster(self.cluster_name, self.infra, self.conn_id)

    def get_conn(self) -> Cluster:
        return self.cluster

    def check_exec_nodes(self, nodes: list[Node], num_nodes: int, file: str) -> None:
        """An exec's nodes are up and set up already (gang.phases.check_exec_nodes says how to fix it)."""
        check_exec_nodes(self.cluster_name, self.infra, nodes, num_nodes, file)

    def register_job(self, task: Task, nodes: list[Node], submit_key: str, **pipeline: Any) -> JobHandle:
        """The job's id and SKYPILOT_TASK_ID in the cluster's job state (gang.phases.register_job)."""
        return register_job(self.cluster, task, nodes, submit_key, **pipeline)

    def wait_in_queue(
        self, task: Task, handle: JobHandle, runs_setup: bool, say: Callable[[str], None]
    ) -> None:
        """Wait in the cluster's job queue until the nodes the job needs are free (gang.job_queue)."""
        wait_in_queue(self.cluster, task, handle, runs_setup, say)

    def job(self, handle: JobHandle) -> GangJob:
        """The job object (gang.gang_job) every phase task and trigger works through, once per job: start,
        follow, watch, relaunch, cancel, kill, results. A handle without nodes gets the job state's."""
        job = self._jobs.get(handle.job_id)
        if job is None:
            states = job_states(self.cluster)
            if not handle.nodes:
                handle = dataclasses.replace(handle, nodes=states.require(handle.job_id).job_nodes)
            job = self._jobs[handle.job_id] = GangJob.of(self.cluster, handle, states)
        return job

    # ---- cluster ---------------------------------------------------------------------------------------

    def provision(
        self, task: Task, retry_until_up: bool = False, owner: dict[str, str | None] | None = None
    ) -> list[Node]:
        """Bring the cluster to at least the task's node count; an existing larger cluster is kept as is.

        retry_until_up: when no placement has capacity, keep trying (with backoff) instead of failing.
        owner: who the fleet ledger says owns a cluster this brings up (ledger.owner_of).
        """
        return self.cluster.provision(
            task.num_nodes, task.resources, job_name=task.name, retry_until_up=retry_until_up, owner=owner
        )

    def check_autostop(self, task: Task) -> None:
        """Refuse resources.autostop on an infra whose nodes cannot stop themselves (before provisioning)."""
        self.cluster.autostop_for(task.resources)

    def arm_autostop(self, task: Task, nodes: list[Node]) -> None:
        """Arm every node's autostop watcher (resources.autostop); nothing without it."""
        autostop = self.cluster.arm_autostop(nodes, task.resources)
        if autostop is not None:
            self.log.info(
                "Autostop armed on %d node(s): each stops itself after %d idle minute(s)",
                len(nodes),
                autostop.idle_s // 60,
            )

    def nodes(self) -> list[Node]:
        return self.cluster.nodes()

    def running_nodes(self, expected: int | None = None) -> list[Node]:
        return self.cluster.running_nodes(expected)

    def terminate(self) -> None:
        self.cluster.terminate()

    def cost_since(self, since: float | None) -> dict[str, Any] | None:
        """What the cluster's nodes cost from `since` (a run's start) to now, from the fleet ledger
        (ledger.summary: node-hours times the catalog's hourly price); None when the ledger has no record."""
        record = self.cluster.ledger_record()
        if record is None:
            return None
        return ledger.summary(record, time.time(), since)

    def run_lifecycle_hooks(
        self,
        event: HookEvent,
        log: Callable[[str], None],
        task: Task | None = None,
        job_id: int | None = None,
    ) -> None:
        """The cluster's `config.hooks` for `event` on its running nodes (warnings, never an error)."""
        lifecycle.run_hooks(self.cluster, event, log, task, job_id)

    # ---- files -----------------------------------------------------------------------------------------

    def sync_task_files(
        self,
        node: Node,
        task: Task,
        log: Callable[[str], None],
        bucket_plan: buckets.BucketPlan | None = None,
        git_commit: str | None = None,
        container_image: str | None = None,
    ) -> UploadResult:
        """The workdir and local file_mounts onto `node`; then the node copies or mounts its buckets and
        starts the cluster's container (`container_image`, when the job's task names none itself)."""
        container = inherited_container(task.container, container_image)
        with self.cluster.client(node) as client:
            return upload_task_files(
                client,
                task,
                log,
                bucket_plan,
                git_commit=git_commit,
                container=container,
                cluster_name=self.cluster.name,
            )

    # ---- buckets ---------------------------------------------------------------------------------------

    def prepare_buckets(
        self,
        task: Task,
        log: Callable[[str], None],
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
    ) -> dict[str, Any] | None:
        """Create the task's named buckets that are absent (uploading a local `source` into them) before any
        node exists; returns the record to keep with the job (record_job_buckets), None without buckets."""
        mounts = task_buckets(task, self.infra)
        if not mounts:
            return None
        created = buckets.prepare_buckets(mounts, log, aws_conn_id, gcp_conn_id)
        identity = self.cluster.node_bucket_identity()
        return buckets.bucket_record(mounts, aws_conn_id, gcp_conn_id, identity, created, self.infra)

    def record_job_buckets(self, handle: JobHandle, record: dict[str, Any]) -> None:
        record_buckets(self.cluster, handle, record)

    def record_pool_task(self, handle: JobHandle, task: dict[str, Any]) -> None:
        """A pool job: its worker's task (setup, workdir), for a replacement node (gang.pool)."""
        record_pool_task(job_states(self.cluster), handle.job_id, task)

    def bucket_plan(self, handle: JobHandle, task: Task) -> buckets.BucketPlan | None:
        """What a node needs to attach the job's buckets (credentials included: never log it; they are
        registered with Airflow's secret masker here). A task without buckets reads nothing."""
        if not has_bucket_mounts(task):
            return None
        plan = buckets.plan_from_record(bucket_record(self.cluster, handle))
        for options in plan.secret_options() if plan else ():
            for name in _SECRET_OPTIONS:
                if options.get(name):
                    mask_secret(options[name])
        return plan

    def release_cluster(self, handle: JobHandle, down: bool, log: Callable[[str], None]) -> Release:
        """Whether this job's teardown ends the cluster (gang.cluster_down): with `down`, only when no other
        job holds it; otherwise the job is released alone and the last job's teardown ends the cluster."""
        return release_cluster(job_states(self.cluster), handle.job_id, down, log)

    def release_buckets(
        self,
        handle: JobHandle,
        task: Task,
        log: Callable[[str], None],
        detach: bool = True,
        also: Sequence[int] = (),
    ) -> None:
        """Unmount the buckets on every node (after their uploads), remove the nodes' bucket credentials,
        and delete the buckets this job (and the jobs `also`, whose teardown left theirs to this one)
        created for `persistent: false` mounts. Without `detach` (other jobs still use the cluster, and a
        node's mounts are shared) the nodes' mounts stay."""
        found = [bucket_record(self.cluster, handle)] if has_bucket_mounts(task) else []
        found += [job_bucket_record(self.cluster, job_id) for job_id in also]
        records = [r for r in found if r and r.get("mounts")]
        if not records:
            return
        if detach:
            self._detach_buckets(log)
        for record in records:
            mounts = [BucketMount.from_dict(m) for m in record["mounts"]]
            transient = {m.bucket_uri for m in mounts if not m.persistent}
            doomed = [uri for uri in record.get("created", []) if uri in transient]
            if doomed:
                buckets.delete_buckets(doomed, log, record.get("aws_conn_id"), record.get("gcp_conn_id"))

    def _detach_buckets(self, log: Callable[[str], None]) -> None:
        nodes = [n for n in self.cluster.nodes() if n.status.value == "RUNNING"]

        def detach(node: Node) -> None:
            with self.cluster.client(node, conn_retry_attempts=1) as client:
                buckets.detach_buckets(client, log)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
            for node, future in zip(nodes, [pool.submit(detach, n) for n in nodes], strict=True):
                try:
                    future.result()
                except (SkyError, OSError) as e:
                    log(f"could not unmount the buckets of rank {node.rank}: {e}")

    def upload_artifacts(self, nodes: Sequence[Node], *upload: Any, **connections: Any) -> dict[str, Any]:
        """Stream artifacts from each of `nodes` over this cluster's SSH clients; `upload` and `connections`
        as node.artifacts.upload_artifacts takes them (paths, destination, per_rank, log; the connection
        ids). Returns {artifact: uri}."""
        with self.cluster.clients(nodes) as clients:
            return artifacts.upload_artifacts(clients, nodes, *upload, **connections)
