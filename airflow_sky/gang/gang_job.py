"""One job on its cluster: the object every caller of the gang core goes through.

A GangJob is bound to a Cluster, the cluster's job states (gang.state) and the job (its id; its JobHandle
once provisioned). It owns what is done to a job on its nodes: start a rank, follow one
(gang.follow.RankFollower), a watch round behind the phase's lease (gang.watcher.PhaseWatch), lead or wait
for a relaunch, cancel, kill, read a rank's log and result; the ids of its records on the nodes come from
gang.job.remote_job_id. The follow operator and its trigger (through SkyClusterHook.job), the CLI's live
view (client.live), the detached driver (gang.detached) and `airflow-sky queue / logs / cancel`
(gang.cluster_jobs) call it, so none of them writes these loops again.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.gang import job_queue
from airflow_sky.gang import state as js
from airflow_sky.gang.follow import RankFollower, Step, Wake, phase_tail
from airflow_sky.gang.job import PHASES, JobHandle, JobStatus, Phase, remote_job_id
from airflow_sky.gang.phases import (
    StartResult,
    check_run_nodes,
    job_states,
    read_result,
    set_status,
    start_rank,
    start_ranks,
)
from airflow_sky.gang.progress_store import ProgressRecords
from airflow_sky.gang.recovery import DEFAULT_MAX_RECOVERIES
from airflow_sky.gang.state_record import current_handle
from airflow_sky.gang.watcher import (
    PhaseWatch,
    PhaseWatcher,
    Triage,
    fail_always,
    kill_ranks,
    recovery_triage,
)
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail
from airflow_sky.task import JobRecovery, Task

__all__ = ["GangJob", "RankFollower", "Step", "Triage", "Wake", "phase_ranks"]  # what a follow task acts on

SIBLING_FAILED = "a follow task of the job was failed in Airflow (marked failed, or out of retries)"


class GangJob:
    """Job `job_id` on `cluster`, its record in `states`; `handle` (from provision) for what needs its task."""

    def __init__(
        self,
        cluster: Cluster,
        job_id: int,
        handle: JobHandle | None = None,
        states: js.JobStates | None = None,
    ) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self._handle = handle
        self.states = states if states is not None else job_states(cluster)

    @classmethod
    def of(cls, cluster: Cluster, handle: JobHandle, states: js.JobStates | None = None) -> GangJob:
        return cls(cluster, handle.job_id, handle, states)

    @property
    def handle(self) -> JobHandle:
        if self._handle is None:
            raise ClusterError(f"job {self.job_id}: no handle (this view knows only the job's id)")
        return self._handle

    def remote_id(self, phase: Phase) -> str:
        return remote_job_id(self.job_id, phase)

    # ---- the record --------------------------------------------------------------------------------

    def state(self) -> js.JobState | None:
        return self.states.get(self.job_id)

    def require(self) -> js.JobState:
        return self.states.require(self.job_id)

    def progress(self, with_history: bool = True) -> dict[str, Any] | None:
        """The job's progress document (gang.job_progress.summarize), read now; None when it has no record."""
        state = self.state()
        if state is None:
            return None
        return ProgressRecords(self.states.store).summary(state, with_history=with_history)

    def current(self) -> JobHandle:
        """The handle moved to the job's current generation and nodes (a recovery may have replaced some)."""
        return current_handle(self.handle, self.state())

    def generation(self, phase: Phase) -> int:
        """The generation to follow: setup has one; the run is at the job state's (a relaunch moves it)."""
        if phase != "run":
            return self.handle.generation
        state = self.state()
        return max(state.generation, self.handle.generation) if state else self.handle.generation

    def phase_nodes(self, phase: Phase, state: js.JobState | None) -> list[Node]:
        """The phase's nodes as of the job's current generation."""
        ranks = {n.rank for n in self.handle.phase_nodes(phase)}
        return [n for n in current_handle(self.handle, state).nodes if n.rank in ranks]

    def check_run_nodes(self) -> None:
        """The run's nodes are the provisioned ones (none vanished or was replaced since)."""
        check_run_nodes(self.cluster, self.handle)

    def set_status(self, status: JobStatus) -> None:
        set_status(self.cluster, self.handle, status)

    # ---- start -------------------------------------------------------------------------------------

    def start(self, task: Task, phase: Phase, rank: int) -> StartResult:
        return start_rank(self.cluster, task, self.handle, phase, rank)

    def start_all(self, task: Task, phase: Phase, ranks: list[int]) -> list[StartResult]:
        return start_ranks(self.cluster, task, self.handle, phase, ranks)

    # ---- follow and watch --------------------------------------------------------------------------

    def follower(
        self,
        phase: Phase,
        generation: int,
        rank: int,
        nodes: Sequence[Node],
        owner: str,
        emit: Callable[[str], None],
        triage: Triage = fail_always,
        log: Callable[[str], None] | None = None,
        **options: Any,
    ) -> RankFollower:
        """Follows `rank`'s log and the job state (gang.follow: `options` are RankFollower's); holding the
        phase's watch, it acts for every rank of `nodes` (the phase's, this generation's)."""
        watch = self.watch(phase, generation, nodes, owner, triage, log or emit)
        return RankFollower(watch, rank, emit, **options)

    @staticmethod
    def triage(policy: JobRecovery | None, max_recoveries: int = DEFAULT_MAX_RECOVERIES) -> Triage:
        """What a fault leads to: the run's job_recovery `policy` (relaunch or fail); without one, fail."""
        return fail_always if policy is None else recovery_triage(policy, max_recoveries)

    def watch(
        self,
        phase: Phase,
        generation: int,
        nodes: Sequence[Node],
        owner: str,
        triage: Triage = fail_always,
        log: Callable[[str], None] = lambda message: None,
    ) -> PhaseWatch:
        watcher = PhaseWatcher(self.cluster, self.states, self.job_id, phase, generation, nodes, triage, log)
        return PhaseWatch(watcher, owner)

    def relaunch(self, task: Task, generation: int, owner: str, log: Callable[[str], None]) -> js.JobState:
        """Lead or wait for the relaunch past `generation` (gang.relaunch); the state of the one to follow."""
        # Imported here: a relaunch mounts buckets (node.buckets -> Airflow's object storage), and
        # `airflow-sky queue` reaches this module without Airflow (tests/cli/test_cli_imports.py).
        from airflow_sky.gang.relaunch import follow_relaunch

        return follow_relaunch(self.cluster, self.states, task, self.handle, generation, owner, log)

    def refresh(self, state: js.JobState, owner: str) -> js.JobState:
        """A running job nobody watches (its launcher is gone): one watch round writes the nodes' truth."""
        if state.status not in (JobStatus.SETTING_UP, JobStatus.RUNNING) or not state.nodes:
            return state
        phase: Phase = "setup" if state.status is JobStatus.SETTING_UP else "run"
        ranks = set(phase_ranks(state, phase))
        watch = self.watch(
            phase,
            state.generation if phase == "run" else 0,
            [n for n in state.job_nodes if n.rank in ranks],
            owner,
        )
        try:
            return watch.round_once(state)
        finally:
            watch.close()

    # ---- cancel and kill ---------------------------------------------------------------------------

    def cancel(self, reason: str) -> tuple[js.JobState, bool]:
        """Mark the job CANCELLED (its watcher then stops every rank); (the state, whether this call did)."""
        return self.states.update(self.job_id, lambda s: js.cancel(s, reason, time.time()))

    def cancel_if_a_sibling_failed(
        self, count_failed: Callable[[], int], log: Callable[[str], object]
    ) -> None:
        """One sibling check of a follow task or its trigger: ask Airflow how many of the phase's follow tasks
        failed (`count_failed`: marked failed in the UI before their on_kill could act, or out of retries),
        and cancel the job if any did, so that its watcher stops every rank. A failed question is logged and
        never fails the caller: the next round asks again."""
        try:
            failed = count_failed()
        except Exception as e:  # Airflow could not answer: following goes on
            log(f"Could not ask Airflow for failed sibling tasks: {e}")
            return
        if failed and self.cancel(SIBLING_FAILED)[1]:
            log(f"Cancelling job {self.job_id}: {SIBLING_FAILED}")

    def cancel_and_kill(
        self, reason: str, phase: Phase, rank: int, nodes: Iterable[Node], generation: int
    ) -> None:
        """A follow task killed: the job is cancelled (never relaunched), and its own rank stopped at once."""
        with contextlib.suppress(Exception):
            self.cancel(reason)
        node = next((n for n in nodes if n.rank == rank), None)
        if node is not None:
            with self.cluster.client(node) as client:
                jobs.kill_job(client, self.remote_id(phase), generation, sig=signal.SIGTERM, grace_s=5.0)

    def cancel_everywhere(self, reason: str) -> bool:
        """Cancel, and kill every rank of every phase now; a job still waiting in the cluster's queue is only
        marked (it never starts, and its waiter ends). Whether this call cancelled it."""
        state, changed = self.cancel(reason)
        if changed and _ever_admitted(state):
            self.kill_everywhere(state)
        return changed

    def kill_everywhere(self, state: js.JobState) -> None:
        """Every rank of every phase, whoever else watches: a cancel must not wait for a watcher round."""
        nodes = {n.rank: n for n in state.job_nodes}
        for phase in PHASES:
            ranks = phase_ranks(state, phase)
            with self.cluster.clients(
                [nodes[r] for r in ranks if r in nodes], conn_retry_attempts=1
            ) as clients:
                for generation in sorted({0, state.generation}):
                    kill_ranks(
                        clients,
                        self.remote_id(phase),
                        generation,
                        sig=signal.SIGTERM,
                        grace_s=5.0,
                        record_exit_code=128 + signal.SIGTERM,
                    )
                    self.states.update(
                        self.job_id, functools.partial(js.phase_killed, phase=phase, generation=generation)
                    )

    # ---- logs and results --------------------------------------------------------------------------

    def started(self, client: NodeClient, phase: Phase, generation: int) -> bool:
        """Whether `phase` of `generation` has started on `client`'s node (its record is there)."""
        return not jobs.read_job(client, self.remote_id(phase), generation, 0, max_bytes=0).missing

    def log_tail(
        self, client: NodeClient, phase: Phase, generation: int, emit: Callable[[str], None], **options: Any
    ) -> LogTail:
        """A reader of `client`'s node's log of `phase` (see node.log_tail.LogTail for the options)."""
        return phase_tail(client, self.job_id, phase, generation, emit, **options)

    def read_result(self, client: NodeClient, redact: Callable[[str], str] = str) -> Any:
        return read_result(client, self.handle, redact)


def phase_ranks(state: js.JobState, phase: Phase) -> list[int]:
    """The ranks `phase` runs on: setup on every node, the run on the first `num_nodes`."""
    ranks = sorted(n.rank for n in state.job_nodes)
    return ranks if phase == "setup" else ranks[: state.num_nodes]


def _ever_admitted(state: js.JobState) -> bool:
    """Could the job have started anything on its nodes? A job that waited in the queue until its cancel
    did not (its start reads the CANCELLED status first), so there is nothing to kill."""
    entry = state.info.get(job_queue.QUEUE_INFO_KEY)
    return not isinstance(entry, dict) or job_queue.is_admitted(state) or "reason" not in entry
