"""The leader's side of a recovery: replace lost nodes, re-sync and set them up, relaunch every rank.

Exactly one task leads (the run follow task of the head rank); the others wait for the new generation
it announces through its `recovery` XCom. Same SKYPILOT_TASK_ID, new SKYPILOT_NODE_IPS, and
AIRFLOW_SKY_RECOVERY_COUNT = the new generation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from airflow_sky.clouds.base import Node, NodeStatus
from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang import kill_ranks
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.job import JobHandle, JobStatus
from airflow_sky.logs import LineSplitter, node_prefix
from airflow_sky.recovery import Action, Decision, RecoveryState, next_state
from airflow_sky.remote import jobs, queue, shell
from airflow_sky.remote.client import NodeClient
from airflow_sky.spec import Task
from airflow_sky.task_files import upload_task_files

RECOVERY_COUNT_ENV = "AIRFLOW_SKY_RECOVERY_COUNT"
_SETUP_TIMEOUT_S = 3600.0


def current_nodes(handle: JobHandle, state: RecoveryState) -> tuple[Node, ...]:
    """The job's nodes as of the latest generation (the provisioned ones until a recovery replaced some)."""
    return tuple(Node.from_dict(n) for n in state.nodes) if state.nodes else handle.nodes


def unhealthy_ranks(hook: SkyClusterHook, nodes: Sequence[Node]) -> list[int]:
    """Ranks whose node the infra reports as not RUNNING, or as another instance than the job's."""
    live = {n.rank: n for n in hook.nodes()}
    return [
        n.rank
        for n in nodes
        if n.rank not in live
        or live[n.rank].status is not NodeStatus.RUNNING
        or live[n.rank].instance_id != n.instance_id
    ]


def claim_lead(hook: SkyClusterHook, handle: JobHandle, state: RecoveryState, rank: int) -> bool:
    """Exactly one follower leads a relaunch, whatever order a runner starts them in.

    The claim is an atomic mkdir on the lowest-ranked node that is still up; when none is, the head rank's
    follower leads.
    """
    nodes = current_nodes(handle, state)
    run_ranks = {n.rank for n in handle.run_nodes}
    bad = set(unhealthy_ranks(hook, nodes))
    healthy = [n for n in nodes if n.rank in run_ranks and n.rank not in bad]
    if not healthy:
        return rank == min(run_ranks)
    try:
        with hook.client(healthy[0]) as client:
            rc, out, _ = client.exec(
                shell.claim_command(handle.remote_job_id("run"), state.generation + 1), timeout=60
            )
    except RemoteError:
        return rank == min(run_ranks)
    return rc == 0 and out.decode().strip() == "won"


def relaunch(
    hook: SkyClusterHook,
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
    with hook.clients(list(nodes.values())) as clients:
        kill_ranks({r: clients[r] for r in run_ranks}, job_id, state.generation)

    replaced: list[Node] = []
    if decision.action is Action.RECOVER:
        for rank in unhealthy_ranks(hook, list(nodes.values())):
            log(f"Replacing the node of rank {rank} ({nodes[rank].internal_ip}, {nodes[rank].instance_id})")
            new = hook.cloud.replace(hook.cluster_name, rank)
            log(f"rank {rank} is now {new.internal_ip} ({new.instance_id})")
            nodes[rank] = new
            replaced.append(new)
    new_state = next_state(state, decision.action, [nodes[r].to_dict() for r in sorted(nodes)])
    new_handle = dataclasses.replace(
        handle, nodes=tuple(nodes[r] for r in sorted(nodes)), generation=new_state.generation
    )

    for node in replaced:
        with hook.client(node) as client:
            upload_task_files(client, task, log)
        if task.setup:
            _run_setup(hook, task, new_handle, node, log)

    with hook.clients(list(new_handle.run_nodes)) as clients:
        for node in new_handle.run_nodes:
            env = hook.phase_env(task, new_handle, "run", node.rank).env
            env[RECOVERY_COUNT_ENV] = str(new_state.generation)
            jobs.start_job(clients[node.rank], job_id, task.run or "", env, new_state.generation)
        _record(clients[new_handle.run_nodes[0].rank], new_handle, new_state, task)
    log(
        f"Job {handle.job_id} relaunched as generation {new_state.generation} on {', '.join(n.internal_ip for n in new_handle.run_nodes)}"
    )
    return new_state


def _run_setup(
    hook: SkyClusterHook, task: Task, handle: JobHandle, node: Node, log: Callable[[str], None]
) -> None:
    """Run the task's setup on a replacement node, streaming its log; a failure ends the job as FAILED_SETUP."""
    job_id = handle.remote_job_id("setup")
    env = hook.phase_env(task, handle, "setup", node.rank).env
    prefix = node_prefix(node.rank, None, node.internal_ip, setup=True)
    lines = LineSplitter(lambda line: log(f"{prefix} {line}"))
    with hook.client(node) as client:
        jobs.start_job(client, job_id, task.setup or "", env, handle.generation)
        offset, deadline = 0, time.monotonic() + _SETUP_TIMEOUT_S
        while time.monotonic() < deadline:
            poll = jobs.poll_job(client, job_id, handle.generation, offset)
            lines.feed(poll.data)
            offset = poll.next_offset
            if not poll.running and poll.caught_up:
                lines.flush()
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
            head.exec(f"mkdir -p {queue.QUEUE_DIR}/{int(handle.job_id)}", timeout=60)
            queue.write_record(head, handle.job_id, {"job_id": handle.job_id})
        queue.update_record(head, handle.job_id, **fields)
    except RemoteError:
        pass  # the record is informational; the job itself runs
