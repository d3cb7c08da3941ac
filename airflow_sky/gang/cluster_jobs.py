"""A cluster's jobs as `sky queue / logs / cancel` see them: the queue on the head, processes on the nodes.

The queue record's status is written by the Airflow tasks of a job. A job whose launcher detached has no
task left to write its end, so reading the queue derives the status of unfinished jobs from the nodes'
exit codes and records it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.gang import queue
from airflow_sky.gang.follow import CANCELLED_RANK
from airflow_sky.gang.job import KILLED_EXIT_CODE, PHASES, JobStatus, Phase
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail
from airflow_sky.node.logs import node_prefix

_PHASE_FAILED = {"setup": JobStatus.FAILED_SETUP, "run": JobStatus.FAILED}


class ClusterJobs:
    """Jobs of one cluster. Opens one SSH connection per node, lazily; close() (or `with`) releases them."""

    # A job that stays INIT/PENDING this long while `logs` waits for it has no launcher left to start it.
    pending_limit_s: float = 900.0

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
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

    @property
    def head(self) -> NodeClient:
        return self.client(self.nodes[0].rank)

    # ---- queue -----------------------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """Every job of the cluster, oldest first, with unfinished statuses brought up to date."""
        return [self.refresh(record) for record in queue.list_records(self.head)]

    def record(self, job_id: int | None = None) -> dict[str, Any]:
        """One job's record (the latest job when `job_id` is None), status brought up to date."""
        if job_id is None:
            records = queue.list_records(self.head)
            if not records:
                raise ClusterError(f"cluster {self.cluster.name!r} has no jobs yet")
            return self.refresh(records[-1])
        record = queue.read_record(self.head, job_id)
        if record is None:
            raise ClusterError(f"cluster {self.cluster.name!r} has no job {job_id}")
        return self.refresh(record)

    def phase_ranks(self, record: dict[str, Any], phase: Phase) -> list[int]:
        ranks = [n.rank for n in self.nodes]
        return ranks if phase == "setup" else ranks[: int(record.get("num_nodes") or len(ranks))]

    def refresh(self, record: dict[str, Any]) -> dict[str, Any]:
        status = JobStatus(record.get("status", JobStatus.INIT))
        if status.is_terminal or status not in (JobStatus.SETTING_UP, JobStatus.RUNNING):
            return record
        phase: Phase = "setup" if status is JobStatus.SETTING_UP else "run"
        codes = self.exit_codes(record, phase)
        if any(code not in (None, 0) for code in codes.values()):
            failed = _PHASE_FAILED[phase]
            return queue.update_record(self.head, int(record["job_id"]), status=failed, exit_codes=codes)
        if phase == "run" and codes and all(code == 0 for code in codes.values()):
            return queue.update_record(
                self.head, int(record["job_id"]), status=JobStatus.SUCCEEDED, exit_codes=codes
            )
        return record

    def exit_codes(self, record: dict[str, Any], phase: Phase) -> dict[int, int | None]:
        """Each rank's exit code of the phase's current generation (None: running, or never started)."""
        job = f"{record['job_id']}-{phase}"
        return {rank: self.exit_code(rank, job) for rank in self.phase_ranks(record, phase)}

    def exit_code(self, rank: int, job: str, generation: int | None = None) -> int | None:
        """`rank`'s exit code of phase job `job` (its current generation unless given); lost counts as killed."""
        client = self.client(rank)
        if generation is None:
            generation = jobs.current_generation(client, job)
            if generation is None:
                return None
        poll = jobs.poll_job(client, job, generation, 0, max_bytes=0)
        return KILLED_EXIT_CODE if poll.lost else poll.exit_code

    def drop_client(self, rank: int) -> None:
        """Forget `rank`'s connection (it broke); the next call opens a new one."""
        client = self._clients.pop(rank, None)
        if client is not None:
            client.close()

    # ---- cancel ----------------------------------------------------------------------------------------

    def cancel(self, job_ids: list[int] | None = None, all_jobs: bool = False) -> list[int]:
        """Kill the jobs' process groups on every node and mark them CANCELLED; returns the ids cancelled."""
        records = queue.list_records(self.head)
        if all_jobs:
            targets = [r for r in records if not JobStatus(r.get("status", "INIT")).is_terminal]
        elif job_ids:
            known = {int(r["job_id"]): r for r in records}
            missing = [j for j in job_ids if j not in known]
            if missing:
                raise ClusterError(f"cluster {self.cluster.name!r} has no job {', '.join(map(str, missing))}")
            targets = [known[j] for j in job_ids]
        else:
            unfinished = [r for r in records if not JobStatus(r.get("status", "INIT")).is_terminal]
            targets = unfinished[-1:]
        cancelled = []
        for record in targets:
            if JobStatus(record.get("status", "INIT")).is_terminal:
                continue
            self._kill(record)
            queue.update_record(self.head, int(record["job_id"]), status=JobStatus.CANCELLED)
            cancelled.append(int(record["job_id"]))
        return cancelled

    def _kill(self, record: dict[str, Any]) -> None:
        for phase in PHASES:
            job = f"{record['job_id']}-{phase}"
            head_generation = jobs.current_generation(self.head, job)
            if head_generation is not None:
                jobs.record_failure(self.head, job, head_generation, CANCELLED_RANK, 128 + signal.SIGTERM)
            for rank in self.phase_ranks(record, phase):
                client = self.client(rank)
                generation = jobs.current_generation(client, job)
                if generation is not None:
                    jobs.kill_job(client, job, generation, sig=signal.SIGTERM, grace_s=5.0)

    # ---- logs ------------------------------------------------------------------------------------------

    def tail(
        self, job_id: int | None, emit: Callable[[int, str], None], follow: bool = True
    ) -> dict[str, Any]:
        """Print the job's setup then run logs, node-prefixed; with `follow`, until the job ends."""
        record = self.record(job_id)
        for phase in PHASES:
            ranks = self.phase_ranks(record, phase)
            threads = [
                threading.Thread(
                    target=self._tail_node, args=(record, phase, rank, emit, follow), daemon=True
                )
                for rank in ranks
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return self.record(int(record["job_id"]))

    def _tail_node(
        self, record: dict[str, Any], phase: Phase, rank: int, emit: Callable[[int, str], None], follow: bool
    ) -> None:
        job = f"{record['job_id']}-{phase}"
        node = next(n for n in self.nodes if n.rank == rank)
        client = self.cluster.client(node)  # its own connection: tails run in parallel threads
        tail: LogTail | None = None
        waiting_since = time.monotonic()
        try:
            while True:
                if tail is None:
                    generation = jobs.current_generation(client, job)
                    if (
                        generation is None
                    ):  # not started (yet, or never: exec has no setup, a failed setup no run)
                        status = self._status(record)
                        if not follow or _phase_over(status, phase):
                            return
                        if status in (JobStatus.INIT, JobStatus.PENDING):
                            if time.monotonic() - waiting_since > self.pending_limit_s:
                                emit(rank, self._stuck_message(record, node, phase, status))
                                return
                        else:
                            waiting_since = time.monotonic()
                        time.sleep(1.0)
                        continue
                    tail = LogTail(
                        client, job, generation, phase == "setup", lambda line: emit(rank, line), keep=0
                    )
                poll = tail.poll()
                if tail.ended or (not follow and poll.caught_up):
                    tail.flush()
                    return
                if poll.caught_up:
                    time.sleep(0.5)
        except RemoteError as e:
            emit(
                rank, f"{node_prefix(rank, None, node.internal_ip, phase == 'setup')} [log unavailable: {e}]"
            )
        finally:
            client.close()

    def _status(self, record: dict[str, Any]) -> JobStatus:
        current = queue.read_record(self.head, int(record["job_id"])) or record
        return JobStatus(current.get("status", "INIT"))

    def _stuck_message(self, record: dict[str, Any], node: Node, phase: Phase, status: JobStatus) -> str:
        job_id = record["job_id"]
        name = self.cluster.name
        return (
            f"{node_prefix(node.rank, None, node.internal_ip, phase == 'setup')} [job {job_id} has been "
            f"{status.value} for {self.pending_limit_s:.0f}s with nothing started on this node: its launcher "
            f"is gone? See `airflow-sky queue {name}`; end it with `airflow-sky cancel {name} {job_id}`]"
        )


def _phase_over(status: JobStatus, phase: Phase) -> bool:
    """Has the job moved past `phase` (so a phase that never started never will)?"""
    if phase == "setup":
        return status not in (JobStatus.INIT, JobStatus.PENDING, JobStatus.SETTING_UP)
    return status.is_terminal
