"""Following one rank of a phase: its own node's log, and the job state for everything about the others.

A follower reads one node (its own rank's log, on one connection) and one record (the job state) per
round; it never polls its siblings. Whoever holds the phase's watch lease (see airflow_sky.gang.watcher)
reads every rank's exit and writes the verdict; when the lease is free, any follower takes it over. So the
blocking follow task, the deferred trigger and the detached driver run this same step.

`step()` returns None while there is nothing to act on, else why the follow task must act:
    DONE      every rank of the phase exited 0 (the verdict), and this rank's log is read to its end
    FAILED    the phase failed (a rank's exit, a lost node, a cancel); every rank was stopped
    RELAUNCH  the job is being (or was) relaunched as a newer generation: recovery, see gang.relaunch
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import time
from collections.abc import Callable, Sequence

from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang import state as js
from airflow_sky.gang.job import KILLED_EXIT_CODE, JobStatus, Phase, remote_job_id
from airflow_sky.gang.watch_lease import WatchHold
from airflow_sky.gang.watcher import PhaseWatcher, Triage, fail_always
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail

STATE_INTERVAL_S = 1.0  # how often a follower reads the job state (and, holding the watch, probes the ranks)


class Wake(enum.StrEnum):
    DONE = "DONE"
    FAILED = "FAILED"
    RELAUNCH = "RELAUNCH"


@dataclasses.dataclass(frozen=True)
class Step:
    wake: Wake
    reason: str
    error: JobFailed | None = None


class RankFollower:
    """Follows `rank` of phase `phase` (generation `generation`) of job `job_id`; `nodes` are the phase's."""

    def __init__(
        self,
        cluster: Cluster,
        states: js.JobStates,
        job_id: int,
        phase: Phase,
        generation: int,
        rank: int,
        nodes: Sequence[Node],
        owner: str,
        emit: Callable[[str], None],
        triage: Triage = fail_always,
        start_offset: int = 0,
        redact: Callable[[str], str] = str,
        log: Callable[[str], None] | None = None,
        state_interval_s: float = STATE_INTERVAL_S,
        watch: bool = True,
        keep_tail: int = 20,
    ) -> None:
        self.cluster = cluster
        self.states = states
        self.job_id = job_id
        self.phase: Phase = phase
        self.generation = generation
        self.rank = rank
        self.owner = owner
        self.redact = redact
        self.state_interval_s = state_interval_s
        self.watch = watch
        node = next(n for n in nodes if n.rank == rank)
        self.own: NodeClient = cluster.client(node, conn_retry_attempts=1)
        self.tail = LogTail(
            self.own,
            remote_job_id(job_id, phase),
            generation,
            phase == "setup",
            emit,
            offset=start_offset,
            keep=keep_tail,
            wait_for_start=True,
        )
        self.watcher = PhaseWatcher(
            cluster, states, job_id, phase, generation, nodes, triage, log=log or emit
        )
        self._watch = WatchHold(states, job_id, self.watcher.key, owner)
        self.behind = False  # more of the own log to read than one poll returned
        self.state: js.JobState | None = None
        self._next_state_read = 0.0

    @property
    def line_offset(self) -> int:
        return self.tail.line_offset

    @property
    def failed_status(self) -> JobStatus:
        return JobStatus.FAILED_SETUP if self.phase == "setup" else JobStatus.FAILED

    @property
    def holds_watch(self) -> bool:
        """Whether this follower held the phase's watch lease at its last state read (it acts for them all)."""
        return self.state is not None and self.state.watcher(self.watcher.key) == self.owner

    def close(self) -> None:
        self.watcher.close()
        self.own.close()

    def release_watch(self) -> None:
        """Give the lease up at once (this follower is done): another follower need not wait for it to lapse."""
        with contextlib.suppress(Exception):  # the lease lapses on its own
            self.states.update(self.job_id, lambda s: js.drop_watch(s, self.watcher.key, self.owner))

    def run(self, poll_interval_s: float = 0.5) -> Step:
        """Step until there is something to act on (the blocking follow, and tests)."""
        while True:
            step = self.step()
            if step is not None:
                return step
            if not self.behind:
                time.sleep(poll_interval_s)

    # ---- one round ---------------------------------------------------------------------------------

    def step(self) -> Step | None:
        ended_before = self.tail.ended
        if not self.tail.ended:
            try:
                poll = self.tail.poll()
                self.behind = not poll.caught_up
            except RemoteError:
                self.own.reset()  # the watcher decides whether the node is gone; reconnect next round
                self.behind = False
        now = time.monotonic()
        if now < self._next_state_read and ended_before == self.tail.ended:
            return None
        self._next_state_read = now + self.state_interval_s
        state = self.states.require(self.job_id)
        self.state = state
        step = self._judge(state)
        if step is not None or not self.watch:
            return step
        state, held = self._watch.hold(state)
        if held:
            state = self.watcher.round(state)
            self.state = state
            return self._judge(state)
        return None

    def _judge(self, state: js.JobState) -> Step | None:
        relaunched = state.generation > self.generation or (
            state.relaunch is not None and state.relaunch.target > self.generation
        )
        if self.phase == "run" and relaunched and not state.status.is_terminal:
            claim = state.relaunch
            why = f"{claim.action.value}: {claim.reason}" if claim else f"generation {state.generation} runs"
            return Step(Wake.RELAUNCH, f"the job is relaunched ({why})")
        phase = state.phase(self.phase, self.generation)
        if phase.verdict == "FAILED" or (state.status.is_terminal and phase.verdict is None):
            if not (phase.killed or self.tail.ended):
                return None  # the watcher stops every rank first; this rank's last lines are read then
            self._drain()
            return Step(Wake.FAILED, "the phase failed", self._error(state, phase))
        if phase.verdict == "SUCCEEDED" and self.tail.ended:
            return Step(Wake.DONE, "every rank exited 0")
        return None

    def _drain(self) -> None:
        """Read what is left of this rank's log (a killed rank's last lines belong in its task log)."""
        for _ in range(50):
            try:
                poll = self.tail.poll()
            except RemoteError:
                return
            if self.tail.ended or poll.caught_up:
                self.tail.flush()
                return

    def _error(self, state: js.JobState, phase: js.PhaseState) -> JobFailed:
        status = self.failed_status.value
        cause, code = phase.failed_rank, phase.failed_exit_code
        if state.cancelled or cause == js.CANCELLED_RANK:
            # The reason the canceller gave: `airflow-sky cancel`, a killed follow task, a failed sibling.
            why = phase.reason if cause == js.CANCELLED_RANK and phase.reason else "airflow-sky cancel"
            return JobFailed(f"cancelled ({why})", status="CANCELLED", rank=self.rank, exit_code=code)
        if cause is None:
            return JobFailed(f"job {self.job_id} is {state.status.value}", status=status, rank=self.rank)
        reason = phase.reason or ""
        if cause == self.rank:
            if not reason.startswith("exit code"):
                return JobFailed(f"rank {cause}: {reason}", status=status, rank=cause, exit_code=code)
            message = f"rank {cause} failed with exit code {code}; killed the processes on the other nodes"
            if self.tail.tail:
                message += "\nlast log lines:\n" + "\n".join(self.redact(line) for line in self.tail.tail)
            return JobFailed(message, status=status, rank=cause, exit_code=code)
        what = f"failed with exit code {code}" if reason.startswith("exit code") else reason
        return JobFailed(
            f"killed: rank {cause} {what}", status=status, rank=cause, exit_code=KILLED_EXIT_CODE
        )
