"""The relaunch of a job as generation + 1: who leads it, and what the leader does.

A fault the recovery policy relaunches leaves a claim in the job state (gang.state.claim_relaunch). Every
run follower that sees it calls `follow_relaunch`: one of them becomes the leader by compare-and-swap and
does the work; the others wait for the new generation. Taking the lead issues a fencing token (the job
state's next `fences`). The leader renews by moving a counter; a follower that sees the counter stand
still for LEADER_LEASE_S on its own monotonic clock takes over with a newer token (gang.lease: no time one
machine wrote is compared with another's clock). Every step of the leader that changes the cluster
(killing the old generation, replacing a node, setting a replacement up, starting the new generation,
recording it) first passes its token through the job state by compare-and-swap (`Fence.check`), which
refuses it once a newer leader exists: a leader that was paused, or whose writes stopped landing, stops at
its next step and follows instead. Every step is idempotent (starts per generation, replacement of
whatever is down, setup on whatever was replaced), so the new leader finishes what the old one began. A
retried leader task has the same owner name and resumes its own claim at once, with a new token.

Same SKYPILOT_TASK_ID, new SKYPILOT_NODE_IPS, and AIRFLOW_SKY_RECOVERY_COUNT = the new generation.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import threading
import time
from collections.abc import Callable

from airflow_sky.errors import ClusterError, JobFailed, RemoteError
from airflow_sky.gang import state as js
from airflow_sky.gang.follow import phase_tail, read_to_end
from airflow_sky.gang.job import JobHandle, JobStatus
from airflow_sky.gang.lease import LeaseObserver
from airflow_sky.gang.lifecycle import keep_preemption_hooks
from airflow_sky.gang.phases import BUCKETS_INFO_KEY, start_script
from airflow_sky.gang.state_record import job_nodes
from airflow_sky.gang.watcher import kill_ranks, parallel
from airflow_sky.infra.base import Node, NodeStatus
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.buckets import plan_from_record
from airflow_sky.node.files import upload_task_files
from airflow_sky.task import Task
from airflow_sky.task.container import cluster_container
from airflow_sky.task.pool import POOL_TASK_INFO_KEY, worker_setup_task

_SETUP_TIMEOUT_S = 3600.0
# After a preemption notice the other ranks get SIGTERM and this long to checkpoint before SIGKILL.
NOTICE_GRACE_S = 30.0
HEARTBEAT_S = 5.0
WAIT_POLL_S = 1.0
RELAUNCH_ATTEMPTS = 3
RELAUNCH_RETRY_DELAY_S = 5.0


class LeadLost(Exception):
    """A newer leader took over this relaunch: this one stops changing the cluster and follows."""


@dataclasses.dataclass(frozen=True)
class Fence:
    """A leader's fencing token, passed through the job state before each step that changes the cluster."""

    states: js.JobStates
    job_id: int
    token: int

    def check(self, step: str) -> None:
        """Renew the lead and allow `step`; raises LeadLost (or JobFailed when the job ended) otherwise."""
        state, allowed = self.states.update(self.job_id, lambda s: js.fenced(s, self.token))
        if allowed:
            return
        if state.status.is_terminal:
            raise JobFailed(
                f"job {self.job_id} is {state.status.value}: the relaunch stops before {step}",
                status="CANCELLED" if state.cancelled else state.status.value,
            )
        leader = state.relaunch.leader if state.relaunch else None
        raise LeadLost(
            f"Refused to {step}: the job state names a newer leader of the relaunch ({leader or 'none'}, "
            f"token {state.relaunch.fence if state.relaunch else '-'}; this one held token {self.token})"
        )


def follow_relaunch(
    cluster: Cluster,
    states: js.JobStates,
    task: Task,
    handle: JobHandle,
    generation: int,
    owner: str,
    log: Callable[[str], None],
) -> js.JobState:
    """Lead or wait for the relaunch past `generation`; returns the state of the generation to follow.

    Raises JobFailed when the job ended instead (cancelled, or the relaunch failed).
    """
    announced = False
    leader_lease = LeaseObserver(js.LEADER_LEASE_S)
    while True:
        state = states.require(handle.job_id)
        if state.generation > generation and state.relaunch is None:
            return state  # relaunched: follow the new generation, even one that has ended already
        if state.status.is_terminal:
            raise JobFailed(
                f"job {handle.job_id} is {state.status.value} (while relaunching)",
                status="CANCELLED" if state.cancelled else state.status.value,
            )
        claim = state.relaunch
        if claim is not None:
            free = claim.leader in (None, owner)
            lapsed = not free and leader_lease.lapsed(claim.lease)
            if free or lapsed:
                stale = claim.lease if lapsed else None
                state, won = states.update(
                    handle.job_id, functools.partial(js.lead_relaunch, leader=owner, stale=stale)
                )
                if won and state.relaunch is not None:
                    if lapsed:
                        log(
                            f"Taking over the relaunch from {claim.leader}: its lease stood still for "
                            f"{leader_lease.quiet_for():.0f}s (token {state.relaunch.fence} now)"
                        )
                    try:
                        return _lead(cluster, states, task, handle, state, owner, log)
                    except LeadLost as e:
                        log(f"{e}; following the new leader")
                        announced = False
                        continue
            if not announced and state.relaunch is not None and state.relaunch.leader not in (None, owner):
                log(f"Waiting for the relaunch led by {state.relaunch.leader}")
                announced = True
        time.sleep(WAIT_POLL_S)


def _lead(
    cluster: Cluster,
    states: js.JobStates,
    task: Task,
    handle: JobHandle,
    state: js.JobState,
    owner: str,
    log: Callable[[str], None],
) -> js.JobState:
    claim = state.relaunch
    assert claim is not None and claim.leader == owner
    fence = Fence(states, handle.job_id, claim.fence)
    stop = threading.Event()
    beating = threading.Thread(target=_beat, args=(fence, stop), daemon=True)
    beating.start()
    try:
        replaced_at: dict[int, float] = {}
        nodes = _with_retries(
            lambda: _relaunch(cluster, task, handle, state, claim, fence, log, replaced_at), log
        )
    except JobFailed as e:
        failure, now = e, time.time()
        # Only the newest leader's failure is the job's verdict (a deposed one's is not).
        states.update(
            handle.job_id,
            lambda s: js.phase_failed(
                js.fenced(s, fence.token),
                "run",
                state.generation,
                failure.rank or 0,
                failure.exit_code or 1,
                str(failure),
                now,
            ),
        )
        raise
    finally:
        stop.set()
        beating.join(timeout=10)
    replaced = [
        n.rank for n in nodes if n.instance_id != _by_rank(job_nodes(handle, state))[n.rank].instance_id
    ]
    new, won = states.update(
        handle.job_id,
        lambda s: js.relaunched(
            s, fence.token, [n.to_dict() for n in nodes], replaced, time.time(), replaced_at
        ),
    )
    if not won and not new.status.is_terminal:
        # Taken over after this leader's last step: the newer leader owns generation claim.target now
        # (and started it, or will: starts are idempotent per generation), so nothing of it is touched.
        raise LeadLost(f"The relaunch to generation {claim.target} was taken over before it was recorded")
    if not won:
        # Cancelled while this leader worked: what it started must not run on.
        with cluster.clients(nodes[: handle.num_run_nodes], conn_retry_attempts=1) as clients:
            kill_ranks(clients, handle.remote_job_id("run"), claim.target)
        raise JobFailed(
            f"job {handle.job_id} is {new.status.value}: the relaunch to generation {claim.target} was ended",
            status="CANCELLED" if new.cancelled else new.status.value,
        )
    log(
        f"Job {handle.job_id} relaunched as generation {claim.target} on "
        + ", ".join(n.internal_ip for n in nodes[: handle.num_run_nodes])
    )
    return new


def _beat(fence: Fence, stop: threading.Event) -> None:
    """Renew the lead every HEARTBEAT_S until stopped or refused (the steps then find out themselves)."""
    while not stop.wait(HEARTBEAT_S):
        try:
            fence.check("renew the lead")
        except (LeadLost, JobFailed):
            return
        except Exception:
            continue  # a store hiccup: the next beat tries again; followers may take over meanwhile


def _by_rank(nodes: tuple[Node, ...] | list[Node]) -> dict[int, Node]:
    return {n.rank: n for n in nodes}


def _with_retries(relaunch: Callable[[], list[Node]], log: Callable[[str], None]) -> list[Node]:
    """`relaunch`, tried again after an SSH or infra error (a replacement node slow to accept connections
    on a loaded host, a dropped connection): every step is idempotent, so a retry finishes what the failed
    try began. Out of tries, the error becomes the job's verdict (JobFailed) instead of failing only this
    follow task and leaving the claim to a takeover that would meet the same error."""
    for attempt in range(1, RELAUNCH_ATTEMPTS + 1):
        try:
            return relaunch()
        except (RemoteError, ClusterError, OSError) as e:
            if attempt == RELAUNCH_ATTEMPTS:
                raise JobFailed(f"the relaunch failed {attempt} times, last: {e}") from e
            log(f"The relaunch failed (try {attempt} of {RELAUNCH_ATTEMPTS}): {e}; trying again")
            time.sleep(RELAUNCH_RETRY_DELAY_S * attempt)
    raise AssertionError("unreachable")


def _relaunch(
    cluster: Cluster,
    task: Task,
    handle: JobHandle,
    state: js.JobState,
    claim: js.Relaunch,
    fence: Fence,
    log: Callable[[str], None],
    replaced_at: dict[int, float],
) -> list[Node]:
    """Stop generation g, replace nodes that are down, set the new ones up, start g + 1 on every rank.
    When each replacement was up goes into `replaced_at`.

    Each step that changes the cluster passes `fence` first: a newer leader's existence stops it there.
    """
    old = _by_rank(job_nodes(handle, state))
    run_ranks = [n.rank for n in handle.run_nodes]
    job_id = handle.remote_job_id("run")
    log(
        f"Relaunching job {handle.job_id} as generation {claim.target} ({claim.action.value}: {claim.reason}; "
        f"token {fence.token})"
    )
    fence.check(f"stop generation {state.generation}")
    noticed = [
        n for n in state.info.get(js.NOTICES_INFO_KEY) or () if n.get("generation") == state.generation
    ]
    with cluster.clients([old[r] for r in run_ranks], conn_retry_attempts=1) as clients:
        if noticed:  # a preemption with notice: every rank may checkpoint, as the noticed one could
            kill_ranks(
                clients, job_id, state.generation, signal.SIGTERM, NOTICE_GRACE_S, 128 + signal.SIGTERM
            )
        else:
            kill_ranks(clients, job_id, state.generation)

    live = _by_rank(cluster.nodes())
    nodes = dict(old)
    for rank, node in old.items():
        current = live.get(rank)
        if current is None or current.status is not NodeStatus.RUNNING:
            fence.check(f"replace the node of rank {rank}")
            # Read again right after the fence: a node an earlier leader replaced meanwhile is RUNNING, and
            # replacing it twice would end that leader's replacement.
            current = _by_rank(cluster.nodes()).get(rank)
        if current is not None and current.status is NodeStatus.RUNNING:
            nodes[rank] = current  # replaced already by a leader before this one, or never down
            continue
        if current is not None and current.status is NodeStatus.PREEMPTING:
            # Still up until its deadline: what its preemption hooks printed is kept before it goes.
            keep_preemption_hooks(cluster, current, task, handle, state.generation)
            log(f"The node of rank {rank} got a preemption notice: replacing it before it goes")
        with_notice = (current is not None and current.status is NodeStatus.PREEMPTING) or any(
            n.get("rank") == rank for n in noticed
        )
        gone = "gone" if current is None else current.status.value
        cluster.record_event(
            "preempted",
            f"rank {rank} ({node.instance_id}): {gone}, "
            + ("after a preemption notice" if with_notice else "without a notice"),
            rank,
        )
        log(f"Replacing the node of rank {rank} ({node.internal_ip}, {node.instance_id})")
        try:
            nodes[rank] = cluster.replace(rank)
            replaced_at[rank] = time.time()
        except ClusterError as e:
            # The infra has no node to give (an ssh pool without a spare host, say): the job ends here
            # with that reason, rather than every follower taking the lead in turn to fail the same way.
            raise JobFailed(str(e), rank=rank) from e
        log(f"rank {rank} is now {nodes[rank].internal_ip} ({nodes[rank].instance_id})")
    new_handle = dataclasses.replace(
        handle, nodes=tuple(nodes[r] for r in sorted(nodes)), generation=claim.target
    )
    replaced = [nodes[r] for r in sorted(nodes) if nodes[r].instance_id != old[r].instance_id]
    # A pool's worker: a replacement gets the pool's workdir, file mounts and setup, as its worker had them.
    pool_task = state.info.get(POOL_TASK_INFO_KEY)
    setup_task = worker_setup_task(task, pool_task) if replaced and pool_task else task
    # A replacement node mounts the job's buckets again (a checkpoint bucket is where the job resumes from).
    buckets = plan_from_record(state.info.get(BUCKETS_INFO_KEY)) if replaced else None
    for node in replaced:
        fence.check(f"set up the replacement node of rank {node.rank}")
        with cluster.client(node) as client:
            commit = state.info.get("git_commit") or handle.git_commit  # the job's one commit
            upload_task_files(
                client,
                setup_task,
                log,
                buckets,
                git_commit=commit,
                container=cluster_container(handle),
                cluster_name=cluster.name,
            )
        if setup_task.setup:
            _run_setup(cluster, setup_task, new_handle, node, log)

    run_nodes = list(new_handle.run_nodes)
    fence.check(f"start generation {claim.target}")
    with cluster.clients(run_nodes) as clients:
        parallel([lambda c=c: start_script(c, cluster, task, new_handle, "run") for c in clients.values()])  # type: ignore[misc]
    return list(new_handle.nodes)


def _run_setup(
    cluster: Cluster, task: Task, handle: JobHandle, node: Node, log: Callable[[str], None]
) -> None:
    """Run the task's setup on a replacement node, streaming its log; a failure ends the job as FAILED_SETUP."""
    with cluster.client(node) as client:
        start_script(client, cluster, task, handle, "setup")
        tail = phase_tail(client, handle.job_id, "setup", handle.generation, log)
        poll = read_to_end(tail, deadline=time.monotonic() + _SETUP_TIMEOUT_S)
    if poll is not None:
        if poll.exit_code == 0:
            return
        raise JobFailed(
            f"setup on the replacement node of rank {node.rank} failed with exit code {poll.exit_code}",
            status=JobStatus.FAILED_SETUP.value,
            rank=node.rank,
            exit_code=poll.exit_code,
        )
    raise JobFailed(
        f"setup on the replacement node of rank {node.rank} timed out", status=JobStatus.FAILED_SETUP.value
    )
