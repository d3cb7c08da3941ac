"""A cluster's jobs as `sky queue / logs / cancel` see them: the job state, and the processes on the nodes.

The job state (gang.state) is the one record of every job. A job whose launcher went away (a detached
launch whose driver was killed) has no watcher left to write its end: reading the queue then takes the
phase's watch for one round, so the status shown is the nodes' truth.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.gang import job_queue
from airflow_sky.gang import state as js
from airflow_sky.gang.detached import collect_unfollowed
from airflow_sky.gang.follow import read_to_end
from airflow_sky.gang.gang_job import GangJob, phase_ranks
from airflow_sky.gang.job import PHASES, JobHandle, JobStatus, Phase, remote_job_id
from airflow_sky.gang.log_files import LogCopy, copy_logs, last_lines_offset
from airflow_sky.gang.phases import job_states
from airflow_sky.gang.queue_progress import queue_progress
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.client import NodeClient
from airflow_sky.node.logs import node_prefix
from airflow_sky.task import Task

log = logging.getLogger(__name__)
# A job in these has run nothing yet: its progress is not read (a queue of many jobs reads only the others').
_NOT_STARTED = (JobStatus.INIT, JobStatus.PENDING, JobStatus.SETTING_UP)


class ClusterJobs:
    """Jobs of one cluster. Node connections are opened lazily; close() (or `with`) releases them."""

    # A job that stays INIT/PENDING this long while `logs` waits for it has no launcher left to start it.
    pending_limit_s: float = 900.0
    verdict_wait_s: float = 60.0  # after the logs ended, how long `logs` waits for the job's verdict

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.states = job_states(cluster)
        self.owner = f"cli-{os.getpid()}-{threading.get_ident()}"
        self._nodes: list[Node] | None = None
        self._clients: dict[int, NodeClient] = {}

    def __enter__(self) -> ClusterJobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    @property
    def nodes(self) -> list[Node]:
        if self._nodes is None:
            nodes = self.cluster.nodes()
            if not nodes:
                raise ClusterError(f"cluster {self.cluster.name!r} does not exist on {self.cluster.infra}")
            self._nodes = nodes
        return self._nodes

    def client(self, rank: int) -> NodeClient:
        if rank not in self._clients:
            self._clients[rank] = self.cluster.client(next(n for n in self.nodes if n.rank == rank))
        return self._clients[rank]

    # ---- queue -----------------------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """Every job of the cluster, oldest first, with unfinished statuses brought up to date; each with
        its `progress` (gang.queue_progress: step, total, percent, rate, eta_s; None when it reports none)."""
        self.nodes  # noqa: B018 - a cluster that does not exist is an error, not an empty queue
        return [self._with_progress(self.refresh(state)) for state in self._shown()]

    def _shown(self) -> list[js.JobState]:
        """The jobs a user sees, oldest first: not the launches that only provisioned (sky submits none)."""
        return [s for s in self.states.all() if not s.info.get(js.RUNS_NOTHING_KEY)]

    def _with_progress(self, state: js.JobState) -> dict[str, Any]:
        record = state.to_record()
        record["progress"] = None
        if state.status in _NOT_STARTED:
            return record
        try:
            record["progress"] = queue_progress(self.job(state.job_id).progress(with_history=False))
        except Exception as error:  # the queue is still worth showing without a job's progress
            log.warning("progress of job %s not read: %s", state.job_id, error)
        return record

    def progress(self, job_id: int | None = None, with_history: bool = True) -> dict[str, Any]:
        """The progress document of a job (the latest when `job_id` is None), read now."""
        state = self.state(job_id)
        collect_unfollowed(self.job(state.job_id), state)  # a run nobody follows (`exec -d`): read it now
        doc = self.job(state.job_id).progress(with_history=with_history)
        if doc is None:  # removed between the two reads (a cluster going down)
            raise ClusterError(f"cluster {self.cluster.name!r} has no job {state.job_id}")
        return doc

    def state(self, job_id: int | None = None) -> js.JobState:
        """One job's state (the latest job when `job_id` is None), brought up to date."""
        self.nodes  # noqa: B018
        if job_id is None:
            every = self._shown()
            if not every:
                raise ClusterError(f"cluster {self.cluster.name!r} has no jobs yet")
            return self.refresh(every[-1])
        state = self.states.get(job_id)
        if state is None:
            raise ClusterError(f"cluster {self.cluster.name!r} has no job {job_id}")
        return self.refresh(state)

    def record(self, job_id: int | None = None) -> dict[str, Any]:
        return self.state(job_id).to_record()

    def job(self, job_id: int) -> GangJob:
        return GangJob(self.cluster, job_id, states=self.states)

    def refresh(self, state: js.JobState) -> js.JobState:
        """A running job nobody watches (its launcher is gone): one watch round writes the nodes' truth."""
        try:
            return self.job(state.job_id).refresh(state, self.owner)
        except RemoteError:
            return state  # the status stays as recorded

    # ---- cancel ----------------------------------------------------------------------------------------

    def cancel(
        self, job_ids: list[int] | None = None, all_jobs: bool = False, reason: str = "airflow-sky cancel"
    ) -> list[int]:
        """Mark the jobs CANCELLED and kill their process groups on every node; returns the ids cancelled.

        A job still waiting in the queue (PENDING) is only marked: it never starts, and its waiter ends.
        """
        self.nodes  # noqa: B018 - a cluster that does not exist is an error, not a job it lacks
        every = self.states.all()
        if all_jobs:
            targets = [s for s in every if not s.status.is_terminal]
        elif job_ids:
            known = {s.job_id: s for s in every}
            missing = [j for j in job_ids if j not in known]
            if missing:
                raise ClusterError(f"cluster {self.cluster.name!r} has no job {', '.join(map(str, missing))}")
            targets = [known[j] for j in job_ids]
        else:
            targets = [s for s in every if not s.status.is_terminal][-1:]
        cancelled = []
        for target in targets:
            if self.job(target.job_id).cancel_everywhere(reason):
                cancelled.append(target.job_id)
        return cancelled

    # ---- logs ------------------------------------------------------------------------------------------

    def tail(
        self,
        job_id: int | None,
        emit: Callable[[int, str], None],
        follow: bool = True,
        tail_lines: int = 0,
        raw: bool = False,
    ) -> dict[str, Any]:
        """Print the job's setup then run logs, node-prefixed; with `follow`, until the job ends.

        `tail_lines` > 0: each node's log from its last `tail_lines` lines (the run only, as `sky logs --tail`).
        Progress report lines are left out unless `raw` (the log as written).
        """
        state = self.state(job_id)
        for phase in PHASES if tail_lines <= 0 else ("run",):
            ranks = phase_ranks(state, phase)
            # Without follow, each rank's lines are kept and printed head first, then worker1, ...: the
            # threads finish in whatever order their nodes answer.
            kept: dict[int, list[str]] = {rank: [] for rank in ranks}
            threads = [
                threading.Thread(
                    target=self._tail_node,
                    args=(state, phase, rank, emit if follow else _keep(kept[rank]), follow, tail_lines, raw),
                    daemon=True,
                )
                for rank in ranks
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for rank in ranks:
                for line in kept[rank]:
                    emit(rank, line)
        if follow:
            # Every node's log ended; the job's verdict follows within a watcher's round (the launcher or
            # a detached driver writes it): wait for it rather than report a job still RUNNING.
            deadline = time.monotonic() + self.verdict_wait_s
            # A job nobody follows (`exec -d`) gets it from a look at its nodes (refresh).
            while (
                not self.refresh(self.states.get(state.job_id) or state).status.is_terminal
                and time.monotonic() < deadline
            ):
                time.sleep(0.5)
        return self.record(state.job_id)

    def _tail_node(
        self,
        state: js.JobState,
        phase: Phase,
        rank: int,
        emit: Callable[[int, str], None],
        follow: bool,
        tail_lines: int = 0,
        raw: bool = False,
    ) -> None:
        job = self.job(state.job_id)
        node = next((n for n in state.job_nodes if n.rank == rank), None) or next(
            n for n in self.nodes if n.rank == rank
        )
        client = self.cluster.client(node)
        waiting_since = time.monotonic()
        try:
            while (generation := self._started_generation(job, state, phase, rank, client)) is None:
                # Not started (yet, or never: exec has no setup, a failed setup no run).
                status = self._status(state)
                if not follow or _phase_over(status, phase):
                    return
                if status not in (JobStatus.INIT, JobStatus.PENDING):
                    waiting_since = time.monotonic()
                elif time.monotonic() - waiting_since > self.pending_limit_s:
                    emit(rank, self._stuck_message(state, node, phase, status))
                    return
                time.sleep(1.0)
            offset = last_lines_offset(client, job.remote_id(phase), generation, tail_lines)
            tail = job.log_tail(
                client, phase, generation, lambda line: emit(rank, line), offset=offset, keep=0, raw=raw
            )
            read_to_end(tail, until_caught_up=not follow)
        except RemoteError as e:
            emit(
                rank, f"{node_prefix(rank, None, node.internal_ip, phase == 'setup')} [log unavailable: {e}]"
            )
        finally:
            client.close()

    def download(self, job_id: int | None, folder: Path) -> tuple[int, Path, list[Path]]:
        """Every node's setup and run log of a job into `folder/<job id>-<name>/`, as `sky logs --sync-down`.

        Run logs are named as SkyPilot names them on a multi-node cluster, `<rank>-head.log` and
        `<rank>-worker<N>.log`; setup logs `setup-head.log`, `setup-worker<N>.log`. Returns the job id, the
        folder and the files written. All or nothing: a node that does not answer (a recovered job's node
        gone since) fails at once, naming it, and leaves no file behind (gang.log_files.copy_logs).
        """
        state = self.state(job_id)
        name = str(state.info.get("name") or "job")
        nodes = {n.rank: n for n in state.job_nodes}
        wanted: list[LogCopy] = []
        for phase in PHASES:
            for rank in phase_ranks(state, phase):
                role = "head" if rank == 0 else f"worker{rank}"
                generation = state.generation if phase == "run" else state.setup_generation(rank)
                wanted.append(
                    LogCopy(
                        nodes.get(rank) or next(n for n in self.nodes if n.rank == rank),
                        remote_job_id(state.job_id, phase),
                        generation,
                        f"setup-{role}.log" if phase == "setup" else f"{rank}-{role}.log",
                    )
                )
        target = folder / f"{state.job_id}-{name}"
        return state.job_id, target, copy_logs(self.cluster, wanted, target)

    def _status(self, state: js.JobState) -> JobStatus:
        current = self.states.get(state.job_id)
        return current.status if current else state.status

    def _started_generation(
        self, job: GangJob, state: js.JobState, phase: Phase, rank: int, client: NodeClient
    ) -> int | None:
        """The generation of `rank`'s phase job to show (the job state's), once it has started on the node."""
        current = self.states.get(state.job_id) or state
        generation = current.generation if phase == "run" else current.setup_generation(rank)
        return generation if job.started(client, phase, generation) else None

    def _stuck_message(self, state: js.JobState, node: Node, phase: Phase, status: JobStatus) -> str:
        job_id = state.job_id
        name = self.cluster.name
        return (
            f"{node_prefix(node.rank, None, node.internal_ip, phase == 'setup')} [job {job_id} has been "
            f"{status.value} for {self.pending_limit_s:.0f}s with nothing started on this node: its launcher "
            f"is gone? See `airflow-sky queue {name}`; end it with `airflow-sky cancel {name} {job_id}`]"
        )


def _keep(lines: list[str]) -> Callable[[int, str], None]:
    return lambda rank, line: lines.append(line)


def _phase_over(status: JobStatus, phase: Phase) -> bool:
    """Has the job moved past `phase` (so a phase that never started never will)?"""
    if phase == "setup":
        return status not in (JobStatus.INIT, JobStatus.PENDING, JobStatus.SETTING_UP)
    return status.is_terminal


def wait_in_queue(
    cluster: Cluster, task: Task, handle: JobHandle, runs_setup: bool, say: Callable[[str], None]
) -> None:
    """Wait in the cluster's job queue until the nodes `task` needs are free (gang.job_queue); a running
    job it waits for whose launcher is gone gets its end written by a look at its nodes (refresh)."""
    demand = job_queue.demand_of(task, handle.nodes, runs_setup)
    capacity = {n.rank: float(n.gpus) for n in handle.nodes}
    with ClusterJobs(cluster) as view:
        job_queue.wait_for_turn(view.states, handle.job_id, demand, capacity, say, refresh=view.refresh)


def queue_blockers(cluster: Cluster, task: Task) -> dict[int, tuple[int, ...]]:
    """The jobs an exec of `task` submitted now would wait for, with the ranks they share (a look)."""
    nodes = cluster.nodes()
    demand = job_queue.demand_of(task, nodes, runs_setup=False)
    capacity = {n.rank: float(n.gpus) for n in nodes}
    return job_queue.ahead_of_new_job(job_states(cluster), demand, capacity)
