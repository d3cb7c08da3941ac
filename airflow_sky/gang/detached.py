"""Drive a job to its end with no Airflow run behind it: what a launch hands over when its user detaches.

Ctrl-C in `airflow-sky launch` ends the in-process DAG run wherever it is: between two rank starts, while
setup runs, before the run started. SkyPilot's job goes on to its end on the cluster whatever phase it was
in, so the launcher hands the job to a background process that does what the DAG's remaining tasks would:
start every rank of each phase not yet started (starts are idempotent), and watch each phase to its verdict
(the same watcher as the follow tasks': fail-fast, and the job's end written into the job state). Recovery
from a lost node needs the DAG run's follow tasks: a detached job that loses a node fails. With no follow
task reading the ranks' logs, the driver collects their progress reports itself (RunProgress), over the
watcher's connections.

A run started with `exec -d` / `launch -d` has no follow task and no driver: collect_unfollowed reads its
ranks' latest reports whenever its progress is read (`airflow-sky progress`, the SDK's job_progress).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence

from airflow_sky.errors import RemoteError
from airflow_sky.gang import state as js
from airflow_sky.gang.follow import phase_tail, read_to_end
from airflow_sky.gang.gang_job import GangJob, phase_ranks
from airflow_sky.gang.job import JobHandle, JobStatus, Phase, remote_job_id
from airflow_sky.gang.progress_store import WRITE_INTERVAL_S, ProgressCollector, ProgressRecords
from airflow_sky.gang.state_record import WATCH_LEASE_S, current_handle
from airflow_sky.gang.watcher import PhaseWatch, parallel
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.node.log_tail import LogTail
from airflow_sky.task import Task

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


def drive(
    cluster: Cluster,
    task: Task,
    handle: JobHandle,
    phases: Sequence[Phase],
    poll_interval_s: float = POLL_INTERVAL_S,
) -> JobStatus:
    """Run the job's remaining `phases` to their end; returns the job's status as the job state has it."""
    job = GangJob.of(cluster, handle)
    owner = f"detached-{os.getpid()}"
    for phase in phases:
        state = job.require()
        if state.status.is_terminal:
            log.info("Job %s is %s already: nothing left to drive", handle.job_id, state.status.value)
            return state.status
        if (task.setup if phase == "setup" else task.run) is None:
            continue
        current = GangJob.of(cluster, current_handle(handle, state), job.states)
        if phase == "run" and state.status is not JobStatus.RUNNING:
            job.set_status(JobStatus.RUNNING)
        nodes = list(current.handle.phase_nodes(phase))
        for node in nodes:
            if current.start(task, phase, node.rank).started:
                log.info("Started the %s on rank %d", phase, node.rank)
        generation = current.handle.generation if phase == "run" else handle.generation
        watch = job.watch(phase, generation, nodes, owner, log=log.info)
        progress = RunProgress(job, watch) if phase == "run" else None
        try:
            verdict = _watch(job, watch, poll_interval_s, progress)
        finally:
            if progress is not None:
                progress.read(to_end=True)
            watch.close()
        if verdict != "SUCCEEDED":
            break
    final = job.require()
    log.info("Job %s %s", handle.job_id, final.status.value)
    return final.status


def _watch(job: GangJob, watch: PhaseWatch, poll_interval_s: float, progress: RunProgress | None) -> str:
    """Hold the phase's watch until it has a verdict (a follow task left running may hold it meanwhile)."""
    phase_name, generation = watch.watcher.phase, watch.watcher.generation
    while True:
        if progress is not None:
            progress.read()
        state, _ = watch.round(job.require())
        phase = state.phase(phase_name, generation)
        if phase.verdict == "SUCCEEDED" or (phase.verdict == "FAILED" and phase.killed):
            return phase.verdict
        if (state.status.is_terminal and phase.verdict is None) or state.relaunch is not None:
            return state.status.value
        time.sleep(poll_interval_s)


class RunProgress:
    """Every run rank's progress reports, read from its log (the lines themselves are dropped: no task log
    shows them) every WRITE_INTERVAL_S, into the rank's record (gang.progress_store)."""

    def __init__(self, job: GangJob, watch: PhaseWatch) -> None:
        watcher = watch.watcher
        records = ProgressRecords(job.states.store)
        self._next = 0.0
        self._ranks: list[tuple[LogTail, ProgressCollector]] = []
        for rank in sorted(watcher.nodes):
            collector = ProgressCollector(records, job.job_id, rank, watcher.generation)
            tail = phase_tail(
                watcher.client(rank),
                job.job_id,
                "run",
                watcher.generation,
                lambda line: None,
                keep=0,
                wait_for_start=True,
                on_report=collector.add,
            )
            self._ranks.append((tail, collector))

    def read(self, to_end: bool = False) -> None:
        """One read of each rank's new log bytes when due (`to_end`: all that is there now, and write)."""
        now = time.monotonic()
        if not to_end and now < self._next:
            return
        self._next = now + WRITE_INTERVAL_S
        parallel([lambda t=tail, c=collector: _read(t, c, to_end) for tail, collector in self._ranks])  # type: ignore[misc]


def _read(tail: LogTail, collector: ProgressCollector, to_end: bool) -> None:
    for _ in range(50 if to_end else 1):
        if tail.ended:
            break
        try:
            poll = tail.poll()
        except RemoteError:
            break  # the watcher decides about the node
        if poll.caught_up:
            break
    if to_end:
        tail.flush()
    collector.flush(force=to_end or tail.ended)


# ---- a run nobody follows (`exec -d`): its progress collected by whoever reads it -------------------------

READ_WINDOW_BYTES = 64 * 1024  # a read collects the reports of each rank's last 64 KiB of log
UNFOLLOWED_KEY = "progress_unfollowed"  # job info: a read found the run with no follower (`exec -d`)
FINAL_KEY = "progress_final"  # job info: the reports of the ended run were read once more, for good


def collect_unfollowed(job: GangJob, state: js.JobState) -> None:
    """Collect the run's progress reports into the rank records when no follower reads its logs: a job run
    with `exec -d` / `launch -d` (no follow task; a Ctrl-C detach has the driver's RunProgress instead).

    While the run goes on with its watch lease free or lapsed, each read (`airflow-sky progress`, the SDK's
    job_progress) reads the last READ_WINDOW_BYTES of every rank's run log; once the job ended, one last
    read, then never again. A finished job that was followed is not read (its followers recorded it),
    unless it has no record at all (it may have run unfollowed, unread). Never raises.
    """
    try:
        if not state.nodes or state.status not in _RUN_STATUSES:
            return
        ended = state.status.is_terminal
        if ended:
            done = state.info.get(FINAL_KEY)
            if done or not (state.info.get(UNFOLLOWED_KEY) or not _has_records(job, state)):
                return
        elif not _run_unwatched(job, state):
            return
        ranks = set(phase_ranks(state, "run"))
        _read_windows(job, state, [n for n in state.job_nodes if n.rank in ranks])
        key = FINAL_KEY if ended else UNFOLLOWED_KEY
        job.states.update(job.job_id, lambda s: dataclasses.replace(s, info={**s.info, key: True}))
    except Exception as error:  # the progress shown is then what the records hold
        log.debug("progress of job %s not collected: %s", job.job_id, error)


_RUN_STATUSES = (JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def _has_records(job: GangJob, state: js.JobState) -> bool:
    records = ProgressRecords(job.states.store)
    return bool(records.read_all(state.job_id, range(state.num_nodes) if state.num_nodes else None))


def _run_unwatched(job: GangJob, state: js.JobState) -> bool:
    """No follower holds the run's watch lease (free, or its record not written for WATCH_LEASE_S)."""
    if state.watcher(js.phase_key("run", state.generation)) is None:
        return True
    store = job.states.store
    record = store.get(job.states.key(state.job_id))
    return (
        record is not None
        and record.written_at is not None
        and store.now() - record.written_at >= WATCH_LEASE_S
    )


def _read_windows(job: GangJob, state: js.JobState, nodes: Sequence[Node]) -> None:
    records = ProgressRecords(job.states.store)

    def one(node: Node) -> None:
        client = job.cluster.client(node, conn_retry_attempts=1)
        try:
            remote = remote_job_id(state.job_id, "run")
            size = jobs.read_job(client, remote, state.generation, 0, max_bytes=0, want_pid=False).log_size
            collector = ProgressCollector(records, state.job_id, node.rank, state.generation)
            tail = phase_tail(
                client,
                state.job_id,
                "run",
                state.generation,
                lambda line: None,
                offset=max(0, size - READ_WINDOW_BYTES),
                keep=0,
                on_report=collector.add,
            )
            read_to_end(tail, until_caught_up=True, deadline=time.monotonic() + 10)
            collector.flush(force=True)
        except RemoteError:
            pass  # a node that does not answer: its record stays as it is
        finally:
            client.close()

    parallel([lambda n=node: one(n) for node in nodes])  # type: ignore[misc]
