"""Drive a job to its end with no Airflow run behind it: what a launch hands over when its user detaches.

Ctrl-C in `airflow-sky launch` ends the in-process DAG run wherever it is: between two rank starts, while
setup runs, before the run started. SkyPilot's job goes on to its end on the cluster whatever phase it was
in, so the launcher hands the job to a background process that does what the DAG's remaining tasks would:
start every rank of each phase not yet started (starts are idempotent), wait for the phase on every rank,
stop the others when one fails (fail-fast) and record the job's end in the queue. Recovery from a lost
node needs the DAG run's follow tasks: a detached job that loses a node fails.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from typing import Any

from airflow_sky.errors import RemoteError
from airflow_sky.gang import queue
from airflow_sky.gang.cluster_jobs import ClusterJobs
from airflow_sky.gang.job import KILLED_EXIT_CODE, JobHandle, JobStatus, Phase
from airflow_sky.gang.phases import record_failure, start_rank
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.task import Task

log = logging.getLogger(__name__)

_FAILED = {"setup": JobStatus.FAILED_SETUP, "run": JobStatus.FAILED}
POLL_INTERVAL_S = 1.0
UNREACHABLE_S = 300.0  # a node that has not answered this long is taken for lost


def drive(
    cluster: Cluster,
    task: Task,
    handle: JobHandle,
    phases: Sequence[Phase],
    poll_interval_s: float = POLL_INTERVAL_S,
    unreachable_s: float = UNREACHABLE_S,
) -> JobStatus:
    """Run the job's remaining `phases` to their end; returns the status recorded in the queue."""
    with ClusterJobs(cluster) as cluster_jobs:
        return _Driver(cluster_jobs, handle, poll_interval_s, unreachable_s).run(task, phases)


class _Driver:
    def __init__(
        self, cluster_jobs: ClusterJobs, handle: JobHandle, poll_interval_s: float, unreachable_s: float
    ) -> None:
        self.jobs = cluster_jobs
        self.handle = handle
        self.poll_interval_s = poll_interval_s
        self.unreachable_s = unreachable_s

    def run(self, task: Task, phases: Sequence[Phase]) -> JobStatus:
        handle, head = self.handle, self.jobs.head
        record: dict[str, Any] = {"job_id": handle.job_id, "num_nodes": handle.num_run_nodes}
        for phase in phases:
            record = queue.read_record(head, handle.job_id) or record
            status = JobStatus(record.get("status", JobStatus.PENDING))
            if status.is_terminal:
                log.info("Job %s is %s already: nothing left to drive", handle.job_id, status.value)
                return status
            if (task.setup if phase == "setup" else task.run) is None:
                continue
            ranks = [n.rank for n in handle.phase_nodes(phase)]
            job = handle.remote_job_id(phase)
            if phase == "run" and status is not JobStatus.RUNNING:
                queue.update_record(head, handle.job_id, status=JobStatus.RUNNING)
            for rank in ranks:
                if jobs.current_generation(self.jobs.client(rank), job) is None:
                    log.info("Starting the %s on rank %d", phase, rank)
                    start_rank(self.jobs.cluster, task, handle, phase, rank)
            failed = self._wait(job, ranks)
            if failed is not None:
                rank, code = failed
                log.info("Rank %d's %s exited with %d: stopping the others", rank, phase, code)
                self._stop(job, [r for r in ranks if r != rank])
                record_failure(head, handle, _FAILED[phase], rank, code)
                queue.update_record(head, handle.job_id, exit_codes=self.jobs.exit_codes(record, phase))
                return _FAILED[phase]
        codes = self.jobs.exit_codes(record, "run")
        queue.update_record(head, handle.job_id, status=JobStatus.SUCCEEDED, exit_codes=codes)
        log.info("Job %s SUCCEEDED", handle.job_id)
        return JobStatus.SUCCEEDED

    def _wait(self, job: str, ranks: Sequence[int]) -> tuple[int, int] | None:
        """Wait until every rank ended: the first (rank, exit code) that failed, or None if all exited 0.

        A rank that cannot be polled for `unreachable_s` counts as killed.
        """
        unreachable_since: dict[int, float] = {}
        codes: dict[int, int | None] = dict.fromkeys(ranks)
        while True:
            for rank in ranks:
                if codes[rank] is not None:
                    continue
                try:
                    codes[rank] = self.jobs.exit_code(rank, job, self.handle.generation)
                except RemoteError as e:
                    self.jobs.drop_client(rank)
                    since = unreachable_since.setdefault(rank, time.monotonic())
                    log.warning("Rank %d did not answer (%s)", rank, e)
                    if time.monotonic() - since > self.unreachable_s:
                        return rank, KILLED_EXIT_CODE
                    continue
                unreachable_since.pop(rank, None)
                code = codes[rank]
                if code is not None and code != 0:
                    return rank, code
            if all(code == 0 for code in codes.values()):
                return None
            time.sleep(self.poll_interval_s)

    def _stop(self, job: str, ranks: Sequence[int]) -> None:
        for rank in ranks:
            try:
                jobs.kill_job(
                    self.jobs.client(rank), job, self.handle.generation, sig=signal.SIGTERM, grace_s=5.0
                )
            except RemoteError as e:
                log.warning("Could not stop rank %d: %s", rank, e)
