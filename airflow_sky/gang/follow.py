"""Following one rank of a phase: its own node's log, and the job state for everything about the others.

A follower reads one node (its own rank's log, on one connection) and one record (the job state) per
round; it never polls its siblings. Whoever holds the phase's watch lease (see airflow_sky.gang.watcher)
reads every rank's exit and writes the verdict; when the lease is free, any follower takes it over. So the
blocking follow task, the deferred trigger and the detached driver run this same step.

`step()` returns None while there is nothing to act on, else why the follow task must act:
    DONE      every rank of the phase exited 0 (the verdict), and this rank's log is read to its end
    FAILED    the phase failed (a rank's exit, a lost node, a cancel); every rank was stopped
    RELAUNCH  the job is being (or was) relaunched as a newer generation: recovery, see gang.relaunch

In the run phase the follower also collects the rank's progress reports from the lines it reads anyway
(gang.progress_store: no extra connection or read), and the watch holder hands the job's progress document
to `on_progress` (Airflow's gauges, when metrics are on) at most every PROGRESS_SINK_S. The report lines
themselves never reach the task log: it gets the rank's compact progress line (gang.progress_line) instead,
at most every PROGRESS_LOG_S and once more when the rank's log ends.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang import state as js
from airflow_sky.gang.job import KILLED_EXIT_CODE, JobStatus, Phase, remote_job_id
from airflow_sky.gang.progress_line import LineThrottle, compact_line, rank_doc
from airflow_sky.gang.progress_store import ProgressCollector, ProgressRecords
from airflow_sky.gang.watcher import PhaseWatch
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import JobPoll
from airflow_sky.node.log_tail import LogTail

STATE_INTERVAL_S = 1.0  # how often a follower reads the job state (and, holding the watch, probes the ranks)
# How often a follow (task or trigger) asks Airflow whether a sibling was failed from outside (marked failed
# in the UI before it got going, so its on_kill had nothing to cancel): such a job is cancelled.
SIBLING_CHECK_S = 10.0
PROGRESS_SINK_S = 5.0  # how often the watch holder hands the job's progress to `on_progress`
PROGRESS_LOG_S = 30.0  # how often a follower logs its rank's compact progress line (while it changes)
ProgressSink = Callable[[dict[str, Any]], None]


def phase_tail(
    client: NodeClient,
    job_id: int,
    phase: Phase,
    generation: int,
    emit: Callable[[str], None],
    **options: Any,
) -> LogTail:
    """A reader of one node's log of a job's `phase` (options: see node.log_tail.LogTail): the one place a
    phase's log is opened (the follower, the job object and a relaunch's setup on a replacement)."""
    return LogTail(client, remote_job_id(job_id, phase), generation, phase == "setup", emit, **options)


def read_to_end(
    tail: LogTail, poll_interval_s: float = 0.5, until_caught_up: bool = False, deadline: float | None = None
) -> JobPoll | None:
    """Follow one rank's log until its job ended (with `until_caught_up`, only to the log's current end);
    the last poll, or None when `deadline` (monotonic) came first. The one loop over a single log."""
    while deadline is None or time.monotonic() < deadline:
        poll = tail.poll()
        if tail.ended or (until_caught_up and poll.caught_up):
            tail.flush()
            return poll
        if poll.caught_up:
            time.sleep(poll_interval_s)
    return None


@dataclasses.dataclass(frozen=True)
class Step:
    wake: Wake
    reason: str
    error: JobFailed | None = None


class Wake(enum.StrEnum):
    DONE = "DONE"
    FAILED = "FAILED"
    RELAUNCH = "RELAUNCH"


class RankFollower:
    """Follows rank `rank` of the phase `watch` watches: the rank's own log, and the job state; holding the
    phase's watch lease, it acts for every rank. gang.gang_job.GangJob.follower builds one."""

    def __init__(
        self,
        watch: PhaseWatch,
        rank: int,
        emit: Callable[[str], None],
        start_offset: int = 0,
        redact: Callable[[str], str] = str,
        state_interval_s: float = STATE_INTERVAL_S,
        keep_tail: int = 20,
        on_progress: ProgressSink | None = None,
    ) -> None:
        self.watcher = watcher = watch.watcher
        self.states = watcher.states
        self.job_id = watcher.job_id
        self.phase: Phase = watcher.phase
        self.generation = watcher.generation
        self.rank = rank
        self.owner = watch.owner
        self.redact = redact
        self.state_interval_s = state_interval_s
        self.own: NodeClient = watcher.cluster.client(watcher.nodes[rank], conn_retry_attempts=1)
        self.progress: ProgressCollector | None = None
        if self.phase == "run":
            records = ProgressRecords(self.states.store)
            self.progress = ProgressCollector(records, self.job_id, rank, self.generation)
        self._on_progress = on_progress
        self._next_sink = 0.0
        self._progress_log = LineThrottle(PROGRESS_LOG_S)
        self._logged: object = None  # the record the last progress line was made of
        self.tail = phase_tail(
            self.own,
            self.job_id,
            self.phase,
            self.generation,
            emit,
            offset=start_offset,
            keep=keep_tail,
            wait_for_start=True,
            on_report=self.progress.add if self.progress is not None else None,
        )
        self._watch = watch
        self.behind = False  # more of the own log to read than one poll returned
        self.state: js.JobState | None = None
        self._next_state_read = 0.0
        self._sibling_checked = time.monotonic()

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

    def sibling_check_due(self, interval_s: float = SIBLING_CHECK_S) -> bool:
        """Whether to ask Airflow now if a sibling follow task failed: only the watch holder asks (one
        request per phase), every `interval_s`."""
        now = time.monotonic()
        if not self.holds_watch or now - self._sibling_checked < interval_s:
            return False
        self._sibling_checked = now
        return True

    def close(self) -> None:
        self.flush_progress()
        self._watch.close()
        self.own.close()

    def flush_progress(self) -> None:
        """Write what this rank reported now (its log ended, or the follower stops): never raises."""
        if self.progress is not None:
            self.progress.flush(force=True)
            self._log_progress(final=True)

    def _log_progress(self, final: bool = False) -> None:
        """The rank's compact progress line to the task log (the watcher's log: a follow task's and a
        trigger's is their task log; the CLI's own followers keep it out of the terminal, which shows the
        job's line), when due (see LineThrottle)."""
        latest = self.progress.latest if self.progress is not None else None
        line = None
        if latest is not None and latest is not self._logged:
            self._logged = latest
            line = compact_line(rank_doc(latest))
        due = self._progress_log.offer(line, final=final)
        if due is not None:
            self.watcher.log(f"{self.tail.prefix} progress: {due}")

    def release_watch(self) -> None:
        """Give the lease up at once (this follower is done): another follower need not wait for it to lapse."""
        self._watch.release()

    def run(
        self, poll_interval_s: float = 0.5, each_round: Callable[[RankFollower], None] | None = None
    ) -> Step:
        """Step until there is something to act on: the one follow loop (the blocking follow task, the
        detached driver's tests). `each_round` runs after every round without news (a sibling check, a
        deferral: it may raise)."""
        while True:
            step = self.step()
            if step is not None:
                return step
            if each_round is not None:
                each_round(self)
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
            if self.progress is not None:
                self.progress.flush(force=self.tail.ended)  # returns at once when no write is due
                self._log_progress(final=self.tail.ended)
        now = time.monotonic()
        if now < self._next_state_read and ended_before == self.tail.ended:
            return None
        self._next_state_read = now + self.state_interval_s
        state = self.states.require(self.job_id)
        self.state = state
        step = self._judge(state)
        if step is None:
            state, held = self._watch.round(state)
            if not held:
                return None
            self.state = state
            step = self._judge(state)
        if self.holds_watch:  # the last values when the run ends; else when due
            self._sink_progress(state, now, final=step is not None and step.wake is not Wake.RELAUNCH)
        return step

    def _sink_progress(self, state: js.JobState, now: float, final: bool = False) -> None:
        """The watch holder's job-level progress to `on_progress`, when due (one reader per job)."""
        if self._on_progress is None or self.phase != "run" or (now < self._next_sink and not final):
            return
        self._next_sink = now + PROGRESS_SINK_S
        try:
            self._on_progress(ProgressRecords(self.states.store).summary(state, with_history=False))
        except Exception as error:  # gauges are never worth failing the job for
            self.watcher.log(f"job {self.job_id}: progress metrics not sent: {error}")

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
                self.flush_progress()
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
