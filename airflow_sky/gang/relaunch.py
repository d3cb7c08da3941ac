"""The leader's side of a recovery: replace lost nodes, re-sync and set them up, relaunch every rank.

Exactly one task leads (the run follow task of the head rank); the others wait for the new generation
it announces through its `recovery` XCom. Same SKYPILOT_TASK_ID, new SKYPILOT_NODE_IPS, and
AIRFLOW_SKY_RECOVERY_COUNT = the new generation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang import queue
from airflow_sky.gang.follow import kill_ranks
from airflow_sky.gang.job import JobHandle, JobStatus
from airflow_sky.gang.phases import phase_env
from airflow_sky.gang.recovery import Action, Decision, RecoveryState, next_state
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs, shell
from airflow_sky.node.client import NodeClient
from airflow_sky.node.files import upload_task_files
from airflow_sky.node.log_tail import LogTail
from airflow_sky.task import Task

_SETUP_TIMEOUT_S = 3600.0


def current_nodes(handle: JobHandle, state: RecoveryState) -> tuple[Node, ...]:
    """The job's nodes as of the latest generation (the provisioned ones until a recovery replaced some)."""
    return tuple(Node.from_dict(n) for n in state.nodes) if state.nodes else handle.nodes


def claim_lead(cluster: Cluster, handle: JobHandle, state: RecoveryState, rank: int) -> bool:
    """Exactly one follower leads a relaunch, whatever order a runner starts them in.

    The claim is an atomic mkdir on the lowest-ranked node that is still up; when none is, the head rank's
    follower leads.
    """
    nodes = current_nodes(handle, state)
    run_ranks = {n.rank for n in handle.run_nodes}
    bad = set(cluster.unhealthy_ranks(nodes))
    healthy = [n for n in nodes if n.rank in run_ranks and n.rank not in bad]
    if not healthy:
        return rank == min(run_ranks)
    try:
        with cluster.client(healthy[0]) as client:
            rc, out, _ = client.exec(
                shell.claim_command(handle.remote_job_id("run"), state.generation + 1), timeout=60
            )
    except RemoteError:
        return rank == min(run_ranks)
    return rc == 0 and out.decode().strip() == "won"


def relaunch(
    cluster: Cluster,
    task: Task,
    handle: JobHandle,
    state: RecoveryState,
    decision: Decision,
    log: Callable[[str], None],
) -> RecoveryState:
    """Stop the current generation, replace lost nodes (RECOVER), start generation + 1 on every rank."""
    nodes = {n.rank: n for n in current_nodes(handle, state)}
    run_ranks = [n.rank for n in handle.run_nodes]
    job_id = handle.remote_job_id("run")
    log(f"Relaunching job {handle.job_id} ({decision.action.value}: {decision.reason})")
    with cluster.clients(list(nodes.values())) as clients:
        kill_ranks({r: clients[r] for r in run_ranks}, job_id, state.generation)

    replaced: list[Node] = []
    if decision.action is Action.RECOVER:
        for rank in cluster.unhealthy_ranks(list(nodes.values())):
            log(f"Replacing the node of rank {rank} ({nodes[rank].internal_ip}, {nodes[rank].instance_id})")
            new = cluster.replace(rank)
            log(f"rank {rank} is now {new.internal_ip} ({new.instance_id})")
            nodes[rank] = new
            replaced.append(new)
    new_state = next_state(state, decision.action, [nodes[r].to_dict() for r in sorted(nodes)])
    new_handle = dataclasses.replace(
        handle, nodes=tuple(nodes[r] for r in sorted(nodes)), generation=new_state.generation
    )

    for node in replaced:
        with cluster.client(node) as client:
            upload_task_files(client, task, log)
        if task.setup:
            _run_setup(cluster, task, new_handle, node, log)

    with cluster.clients(list(new_handle.run_nodes)) as clients:
        for node in new_handle.run_nodes:
            env = phase_env(cluster, task, new_handle, "run", node.rank)
            jobs.start_job(clients[node.rank], job_id, task.run or "", env, new_state.generation)
        _record(clients[new_handle.run_nodes[0].rank], new_handle, new_state, task)
    log(
        f"Job {handle.job_id} relaunched as generation {new_state.generation} on {', '.join(n.internal_ip for n in new_handle.run_nodes)}"
    )
    return new_state


def _run_setup(
    cluster: Cluster, task: Task, handle: JobHandle, node: Node, log: Callable[[str], None]
) -> None:
    """Run the task's setup on a replacement node, streaming its log; a failure ends the job as FAILED_SETUP."""
    job_id = handle.remote_job_id("setup")
    env = phase_env(cluster, task, handle, "setup", node.rank)
    with cluster.client(node) as client:
        jobs.start_job(client, job_id, task.setup or "", env, handle.generation)
        tail = LogTail(client, job_id, handle.generation, setup=True, emit=log)
        deadline = time.monotonic() + _SETUP_TIMEOUT_S
        while time.monotonic() < deadline:
            poll = tail.poll()
            if tail.ended:
                if poll.exit_code == 0:
                    return
                raise JobFailed(
                    f"setup on the replacement node of rank {node.rank} failed with exit code {poll.exit_code}",
                    status=JobStatus.FAILED_SETUP.value,
                    rank=node.rank,
                    exit_code=poll.exit_code,
                )
            if poll.caught_up:
                time.sleep(0.5)
    raise JobFailed(
        f"setup on the replacement node of rank {node.rank} timed out", status=JobStatus.FAILED_SETUP.value
    )


def _record(head: NodeClient, handle: JobHandle, state: RecoveryState, task: Task) -> None:
    """Bring the queue record up to date; a replaced head starts with an empty queue, so recreate it there."""
    try:
        existing = queue.read_record(head, handle.job_id)
        fields = {
            "status": JobStatus.RUNNING,
            "generation": state.generation,
            "recoveries": state.recoveries,
            "restarts": state.restarts,
        }
        if existing is None:
            fields.update(
                {"name": task.name, "num_nodes": handle.num_run_nodes, "sky_task_id": handle.sky_task_id}
            )
            queue.recreate_record(head, handle.job_id)
        queue.update_record(head, handle.job_id, **fields)
    except RemoteError:
        pass  # the record is informational; the job itself runs
