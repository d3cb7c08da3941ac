"""The steps of a job on its cluster, each one call the operators make: register the job, start a rank's
script, mark the job's status, read a rank's result, stop a rank. Plain Python over a Cluster.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import shlex
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from airflow_sky.errors import ClusterError, JobFailed, RemoteError
from airflow_sky.gang import lifecycle
from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobHandle, JobStatus, Phase
from airflow_sky.infra.base import Node, NodeStatus
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs, rclone
from airflow_sky.node.client import FileTooLarge, NodeClient, UnsafeRemoteFile
from airflow_sky.node.container import container_name
from airflow_sky.node.git_commit import resolve_commit
from airflow_sky.task import GitWorkdir, Task, envs
from airflow_sky.task.diagnostics import did_you_mean
from airflow_sky.task.redaction import redact_json
from airflow_sky.task.storage import BucketMount, has_bucket_mounts

# The largest return.json read into XCom: XComs are rows of the Airflow DB, not a file store.
MAX_RESULT_BYTES = 1024 * 1024

# The generation a run script sees, so a job can tell a relaunch from its first start.
RECOVERY_COUNT_ENV = "AIRFLOW_SKY_RECOVERY_COUNT"


@dataclasses.dataclass(frozen=True)
class StartResult:
    rank: int
    pid: int | None
    started: bool  # False: attached to a start that happened before (a retried task), or nothing to start
    lost: bool = False  # the node is gone: recovery is the run follow tasks' job
    skipped: str | None = None  # why nothing was started (the job ended, or a relaunch took over)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"rank": self.rank, "pid": self.pid, "started": self.started}
        if self.lost:
            data["lost"] = True
        if self.skipped:
            data["skipped"] = self.skipped
        return data


def phase_env(cluster: Cluster, task: Task, handle: JobHandle, phase: Phase, rank: int) -> dict[str, str]:
    """The env of `rank`'s setup or run script: SKYPILOT_* from the job's nodes, plus envs and secrets."""
    nodes = handle.phase_nodes(phase)
    ips = [n.internal_ip for n in nodes]
    # What the infra really gave each node (a local node has none, whatever the task asked for).
    gpus = max(math.ceil(n.gpus) for n in nodes)
    build = envs.setup_envs if phase == "setup" else envs.run_envs
    every_rank = build(task, ips, cluster.info(), handle.sky_task_id, gpus, handle.sky_task_ids)
    # The network's env (NCCL over EFA, ...) first: the task's own envs win over it.
    env = {**cluster.network_env(), **every_rank[[n.rank for n in nodes].index(rank)]}
    if phase == "run":
        env[RECOVERY_COUNT_ENV] = str(handle.generation)
    return env


def check_exec_nodes(
    cluster_name: str,
    infra: str,
    nodes: list[Node],
    num_nodes: int,
    file: str,
    *,
    launch_command: str | None = None,
    known_clusters: Iterable[str] = (),
) -> None:
    """`exec` runs without setup: every node it uses must already be up and set up (never grown or replaced).

    Raises ClusterError saying how to fix it: a stopped cluster is started (`airflow-sky start`, its disks
    are set up already); otherwise a launch (`launch_command`, by default one of `file` alone) adds or
    replaces nodes and runs setup on them. `known_clusters`: names for a did-you-mean when there is none.
    """
    command = launch_command or f"airflow-sky launch -c {shlex.quote(cluster_name)} {shlex.quote(file)}"
    fix = f"run `{command}`: it brings the cluster to size and runs setup"
    if not nodes:
        raise ClusterError(
            f"cluster {cluster_name!r} does not exist on {infra}; launch it first: {fix}"
            f"{did_you_mean(cluster_name, known_clusters)}"
        )
    used = sorted(nodes, key=lambda n: n.rank)[:num_nodes]
    down = [n for n in used if n.status is not NodeStatus.RUNNING]
    if len(nodes) < num_nodes:
        raise ClusterError(
            f"cluster {cluster_name!r} has {len(nodes)} node(s); the task needs {num_nodes}, and exec never "
            f"adds nodes (a new node would run the job without its setup); {fix}"
        )
    if down and all(n.status in (NodeStatus.RUNNING, NodeStatus.STOPPED) for n in nodes):
        raise ClusterError(
            f"cluster {cluster_name!r} is stopped ({_states(down)}); start it first, with its disks and "
            f"setup as they were: airflow-sky start {shlex.quote(cluster_name)}; then run the exec again"
        )
    if down:
        raise ClusterError(
            f"cluster {cluster_name!r}: {_states(down)}; exec never replaces a node (the new one would run "
            f"the job without its setup); {fix}"
        )


def _states(nodes: list[Node]) -> str:
    return ", ".join(f"rank {n.rank} is {n.status.value}" for n in nodes)


def job_states(cluster: Cluster) -> js.JobStates:
    """The cluster's job states, in its infra's store."""
    return js.JobStates(cluster.state_store())


def register_job(
    cluster: Cluster,
    task: Task,
    nodes: list[Node],
    submit_key: str,
    pipeline_task_ids: tuple[str, ...] = (),
    pipeline_index: int = 0,
) -> JobHandle:
    """Allocate the job's id in the cluster's job state (a retried provision gets the same id and TASK_ID).

    A pipeline's task takes its SKYPILOT_TASK_ID from `pipeline_task_ids[pipeline_index]`. A git workdir's
    ref is resolved to a commit here, once: the job state keeps it (a retried provision, every sync and a
    recovery's replacement node clone that commit, even after the branch moved).
    """
    if len(nodes) < task.num_nodes:
        raise ClusterError(f"cluster {cluster.name} has {len(nodes)} nodes; the task needs {task.num_nodes}")
    states = job_states(cluster)
    try:
        state, _ = states.allocate(
            submit_key,
            {
                "name": task.name,
                "submitted_at": datetime.now(UTC).isoformat(),
                "submit_key": submit_key,
                "num_nodes": task.num_nodes,
                "cluster_name": cluster.name,
                "infra": cluster.infra,
                # Neither setup nor run (`launch -c C` alone): it holds the cluster while it is provisioned,
                # and is no job of the queue, as sky submits none.
                **({js.RUNS_NOTHING_KEY: True} if task.setup is None and task.run is None else {}),
                **lifecycle.hook_info(task),  # config.hooks: run by stop and down, which have no task
            },
        )
    except js.ClusterClosing:
        _wait_until_closed(states)
        raise
    if _all_vanished(cluster, nodes):
        # Ended by another run's teardown after this provision saw them (the teardown found no job then).
        raise js.ClusterClosing(
            0, 0.0, "the cluster was torn down since it was provisioned: provisioning again"
        )
    submitted_at = datetime.fromisoformat(state.info["submitted_at"])
    sky_task_id = state.info.get("sky_task_id") or (
        pipeline_task_ids[pipeline_index]
        if pipeline_task_ids
        else envs.make_task_id(cluster.name, state.job_id, submitted_at)
    )
    git_commit: str | None = state.info.get("git_commit")
    if git_commit is None and isinstance(task.workdir, GitWorkdir):
        git_commit = resolve_commit(task.workdir, task.envs_and_secrets)

    container_image = task.container.image if task.container is not None else _cluster_image(states)

    def registered(current: js.JobState) -> js.JobState:
        if current.nodes:
            raise js.Unchanged  # a retried provision: the job keeps its nodes, generation and commit
        pinned: dict[str, Any] = {"git_commit": git_commit} if git_commit is not None else {}
        if container_image is not None:
            pinned[CONTAINER_INFO_KEY] = container_image
        return dataclasses.replace(
            current,
            status=JobStatus.PENDING,
            info={
                **current.info,
                "sky_task_id": sky_task_id,
                "sky_task_ids": list(pipeline_task_ids),
                **pinned,
            },
            nodes=tuple(n.to_dict() for n in nodes),
        )

    state, _ = states.update(state.job_id, registered)
    return JobHandle(
        cluster_name=cluster.name,
        infra=cluster.infra,
        job_id=state.job_id,
        sky_task_id=sky_task_id,
        nodes=state.job_nodes,
        num_run_nodes=task.num_nodes,
        sky_task_ids=tuple(state.info.get("sky_task_ids") or pipeline_task_ids),
        git_commit=state.info.get("git_commit") or git_commit,
        container_image=state.info.get(CONTAINER_INFO_KEY),
    )


CONTAINER_INFO_KEY = "container_image"


def _cluster_image(states: js.JobStates) -> str | None:
    """The image the cluster's latest job with one runs in (None: its jobs run on the nodes themselves)."""
    for state in sorted(states.all(), key=lambda s: s.job_id, reverse=True):
        if state.info.get(CONTAINER_INFO_KEY):
            return str(state.info[CONTAINER_INFO_KEY])
    return None


def _wait_until_closed(states: js.JobStates, timeout_s: float = 600.0) -> None:
    """Wait (bounded) until the teardown that is ending the cluster is done: every driver removes the
    cluster's records last, so the job index going is the end of the teardown."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        index = states.index()
        if index is None or not index.data.get("closing"):
            return
        time.sleep(2.0)


def _all_vanished(cluster: Cluster, nodes: list[Node]) -> bool:
    """None of `nodes` is the cluster's any more (a teardown ended them; one lost node is recovery's)."""
    live = {n.instance_id for n in cluster.nodes()}
    return bool(nodes) and not any(n.instance_id in live for n in nodes)


def set_status(cluster: Cluster, handle: JobHandle, status: JobStatus) -> None:
    """Move the job's status forward in the job state (a terminal job stays as it ended)."""
    job_states(cluster).update(handle.job_id, lambda s: js.set_status(s, status, time.time()))


def check_run_nodes(cluster: Cluster, handle: JobHandle) -> None:
    """The run's nodes are the ones provisioned for the job (none vanished or was replaced meanwhile)."""
    current = {n.rank: n for n in cluster.nodes()}
    changed = [
        n.rank
        for n in handle.run_nodes
        if n.rank not in current or current[n.rank].instance_id != n.instance_id
    ]
    if changed:
        raise ClusterError(
            f"cluster {handle.cluster_name}: nodes of rank {changed} changed or vanished since provisioning"
        )


def start_rank(cluster: Cluster, task: Task, handle: JobHandle, phase: Phase, rank: int) -> StartResult:
    """Start the phase's script on `rank`'s node, detached; idempotent per job, phase and generation.

    A run start on a node the infra reports gone is left to recovery (`lost`); any other failure raises.
    """
    script = task.setup if phase == "setup" else task.run
    if script is None:
        return StartResult(rank, None, started=False)
    states = job_states(cluster)
    state = states.require(handle.job_id)
    if state.status.is_terminal or state.generation > handle.generation or state.relaunch is not None:
        # Ended, or relaunched: a relaunch's leader starts every rank of the new generation itself, and
        # a late start of an old generation must never run again next to it.
        return StartResult(
            rank,
            None,
            started=False,
            skipped=f"the job is {state.status.value}"
            if state.status.is_terminal
            else f"generation {state.generation} is led by its relaunch",
        )
    node = handle.node(rank)
    status = JobStatus.SETTING_UP if phase == "setup" else JobStatus.RUNNING
    if state.status is not status:
        states.update(handle.job_id, lambda s: js.set_status(s, status, time.time()))
    try:
        with cluster.client(node) as client:
            start = start_script(client, cluster, task, handle, phase)
    except RemoteError:
        if phase != "run" or rank not in cluster.unhealthy_ranks([node]):
            raise
        return StartResult(rank, None, started=False, lost=True)
    return StartResult(rank, start.pid, start.started)


def start_script(
    client: NodeClient, cluster: Cluster, task: Task, handle: JobHandle, phase: Phase
) -> jobs.JobStart:
    """Start the phase's script of `handle`'s generation on `client`'s node (idempotent per generation): the
    one start of a rank, for the start tasks and for a relaunch's new generation and replacement setup."""
    rank = client.node.rank
    # The verdict waits for the uploads of the mounts the sync attached for this job (its bucket record).
    record = (bucket_record(cluster, handle) or {}) if has_bucket_mounts(task) else {}
    return jobs.start_job(
        client,
        handle.remote_job_id(phase),
        (task.setup if phase == "setup" else task.run) or "",
        phase_env(cluster, task, handle, phase, rank),
        handle.generation,
        autostop=cluster.autostop_for(task.resources),
        flush=rclone.flushed_mounts([BucketMount.from_dict(m) for m in record.get("mounts") or []]),
        container=container_name(client.node) if handle.container_image is not None else None,
        **(lifecycle.notice_watch(cluster, task) if phase == "run" else {}),
    )


def start_ranks(
    cluster: Cluster, task: Task, handle: JobHandle, phase: Phase, ranks: list[int], threads: int = 16
) -> list[StartResult]:
    """`start_rank` for every one of `ranks`, side by side (each is one SSH round trip: threads wait, they do
    not compute). Every rank is tried; the first failure is raised once all have been tried, so a retry finds
    the others started and attaches to them."""
    script = task.setup if phase == "setup" else task.run
    if script is not None and ranks:
        # Once, not per rank: N threads would otherwise queue on the job state's lock to write the same status.
        set_status(cluster, handle, JobStatus.SETTING_UP if phase == "setup" else JobStatus.RUNNING)
    with ThreadPoolExecutor(
        max_workers=max(1, min(threads, len(ranks))), thread_name_prefix="airflow-sky-start"
    ) as pool:
        futures = [pool.submit(start_rank, cluster, task, handle, phase, rank) for rank in ranks]
        concurrent.futures.wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


def read_result(client: NodeClient, handle: JobHandle, redact: Callable[[str], str] = str) -> Any:
    """The JSON the run on `client`'s node wrote to $AIRFLOW_SKY_XCOM_DIR/return.json, or None.

    `redact` applies to every string in it: a secret the job echoed into its result stays out of XCom.
    """
    node = client.node
    job_id = handle.remote_job_id("run")
    try:
        raw = jobs.read_xcom(client, job_id, max_bytes=MAX_RESULT_BYTES)
    except FileTooLarge as e:
        raise JobFailed(
            f"rank {node.rank} ({node.internal_ip}): ~/{e.path} is {e.size} bytes; a result handed over as "
            f"XCom may be at most {MAX_RESULT_BYTES} bytes (it lives in the Airflow DB): write large "
            "outputs as artifacts (artifacts: in the task YAML) and return their paths",
            rank=node.rank,
        ) from e
    except UnsafeRemoteFile as e:
        raise JobFailed(
            f"rank {node.rank} ({node.internal_ip}): the job's result: {e}", rank=node.rank
        ) from e
    if raw is None:
        return None
    try:
        return redact_json(json.loads(raw), redact)
    except json.JSONDecodeError as e:
        path = f"~/{jobs.xcom_path(job_id)}"
        raise JobFailed(
            f"rank {node.rank} ({node.internal_ip}): {path} is not valid JSON: {e}", rank=node.rank
        ) from e


BUCKETS_INFO_KEY = (
    "buckets"  # the job state's record of the task's bucket mounts (node.buckets.plan_from_record)
)


def record_buckets(cluster: Cluster, handle: JobHandle, record: dict[str, Any]) -> None:
    """Keep the job's bucket record (mounts, connection ids, buckets created) in its job state: a relaunch
    mounts the buckets on a replacement node from it, and teardown deletes what the job created. Buckets a
    retried provision created before are kept in the record."""

    def recorded(current: js.JobState) -> js.JobState:
        before = current.info.get(BUCKETS_INFO_KEY) or {}
        created = list(dict.fromkeys([*before.get("created", []), *record.get("created", [])]))
        return dataclasses.replace(
            current, info={**current.info, BUCKETS_INFO_KEY: {**record, "created": created}}
        )

    job_states(cluster).update(handle.job_id, recorded)


def bucket_record(cluster: Cluster, handle: JobHandle) -> dict[str, Any] | None:
    """The job's bucket record (see record_buckets), or None when its task has no bucket mounts."""
    return job_bucket_record(cluster, handle.job_id)


def job_bucket_record(cluster: Cluster, job_id: int) -> dict[str, Any] | None:
    """Job `job_id`'s bucket record, or None (no bucket mounts, or no record)."""
    state = job_states(cluster).get(job_id)
    record = state.info.get(BUCKETS_INFO_KEY) if state is not None else None
    return record if isinstance(record, dict) else None
