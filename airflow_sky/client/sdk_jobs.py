"""The SDK's calls on a cluster's jobs, mirroring SkyPilot's: tail_logs, download_logs, job_status, queue,
cancel; and job_progress (a job's progress, as its ranks report it). They read and act on the cluster itself (its job state, kept by the infra, and its nodes), never
Airflow; re-exported by client.sdk."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from airflow_sky.client.cluster_lookup import cluster_of
from airflow_sky.errors import ClusterError
from airflow_sky.gang.job import JobStatus

if TYPE_CHECKING:  # loads the SSH layer: only once the cluster is known
    from airflow_sky.gang.cluster_jobs import ClusterJobs


def _jobs(cluster_name: str, infra: str | None = None) -> ClusterJobs:
    cluster = cluster_of(cluster_name, infra)  # an unknown name fails here, before the SSH layer loads
    from airflow_sky.gang.cluster_jobs import ClusterJobs

    return ClusterJobs(cluster)


def tail_logs(
    cluster_name: str,
    job_id: int | None = None,
    follow: bool = True,
    output: TextIO | None = None,
    tail: int = 0,
    on_end: Callable[[dict[str, Any]], None] | None = None,
    raw: bool = False,
) -> int:
    """Print a job's node-prefixed logs (following until it ends); returns 0 if it SUCCEEDED, else 1.

    `tail` > 0: each node's run log from its last `tail` lines, as `sky logs --tail N`. `on_end` gets the
    job's record (its status) once the logs ended. `raw`: the logs as written, `@@airflow-sky-progress/1`
    report lines included (left out by default).
    """
    out = output or sys.stdout
    lock = threading.Lock()

    def emit(rank: int, line: str) -> None:
        with lock:
            print(line, file=out, flush=True)

    with _jobs(cluster_name) as cluster_jobs:
        record = cluster_jobs.tail(job_id, emit, follow=follow, tail_lines=tail, raw=raw)
    if on_end is not None:
        on_end(record)
    return 0 if record.get("status") == JobStatus.SUCCEEDED else 1


def tail_provision_logs(
    cluster_name: str,
    worker: int | None = None,
    follow: bool = True,
    tail: int = 0,
    output: TextIO | None = None,
) -> int:
    """Print the cluster's provision log, as SkyPilot's `sky.tail_provision_logs`: what its latest
    provisioning did (infra/provision_log.py), following it while that provisioning runs. `worker` (>= 1):
    only that node's lines. `tail` > 0: the last `tail` lines first. Returns 0."""
    from airflow_sky.infra import provision_log

    if worker is not None and worker < 1:
        raise ClusterError(
            f"--worker: must be a positive integer (a worker's rank; the head's is in the whole log), got {worker}"
        )
    cluster = cluster_of(cluster_name)
    if worker is not None:
        ranks = sorted(n.rank for n in cluster.nodes())
        if not ranks:
            raise ClusterError(f"cluster {cluster_name!r} does not exist on {cluster.infra}")
        if worker not in ranks:
            workers = ", ".join(map(str, ranks[1:])) or "none, it has only its head"
            raise ClusterError(f"cluster {cluster_name!r} has no worker {worker} (its workers: {workers})")
    out = output or sys.stdout
    store = cluster.state_store()

    def emit(line: str) -> None:
        print(line, file=out, flush=True)

    if provision_log.show(store, emit, worker=worker, follow=follow, tail=tail) is None:
        if not cluster.nodes():
            raise ClusterError(f"cluster {cluster_name!r} does not exist on {cluster.infra}")
        raise ClusterError(
            f"cluster {cluster_name!r} has no provision log: the launches since airflow-sky keeps one only "
            "reused its nodes; the next launch that creates or restarts nodes writes it"
        )
    return 0


def hook_logs(cluster_name: str) -> list[dict[str, Any]]:
    """The cluster's lifecycle hook runs as its state store keeps them (`logs --hook`), oldest first: each
    {event, at, job_id, results: [{hook, rank, exit_code, seconds, timed_out, output, error}]}."""
    from airflow_sky.gang.lifecycle import hook_runs

    return hook_runs(cluster_of(cluster_name))


def logs_dir() -> Path:
    """Where `download_logs` writes: ~/sky_logs, as SkyPilot's `sky logs --sync-down`."""
    return Path(os.path.expanduser("~/sky_logs"))


def download_logs(
    cluster_name: str, job_id: int | None = None, local_dir: str | os.PathLike[str] | None = None
) -> tuple[int, Path, list[Path]]:
    """Every node's log of a job (the latest by default) into `<local_dir>/<cluster>/<job id>-<name>/`:
    `<rank>-head.log`, `<rank>-worker<N>.log` (the run) and `setup-head.log`, ... (setup), as SkyPilot names
    them; returns (job id, that folder, the files)."""
    folder = Path(local_dir) if local_dir is not None else logs_dir()
    with _jobs(cluster_name) as cluster_jobs:
        return cluster_jobs.download(job_id, folder / cluster_name)


def job_status(cluster_name: str, job_ids: Sequence[int] | None = None) -> dict[int, JobStatus | None]:
    """{job_id: status} for the given jobs (the latest job when none are given); None for an unknown id."""
    with _jobs(cluster_name) as cluster_jobs:
        if not job_ids:
            record = cluster_jobs.record(None)
            return {int(record["job_id"]): JobStatus(record["status"])}
        result: dict[int, JobStatus | None] = {}
        for job_id in job_ids:
            try:
                result[job_id] = JobStatus(cluster_jobs.record(job_id)["status"])
            except ClusterError:
                result[job_id] = None
        return result


def queue(cluster_name: str) -> list[dict[str, Any]]:
    """Every job record of the cluster, oldest first (id, name, status, submitted/started/ended, exit codes,
    and `progress`: {"step", "total", "percent", "rate", "eta_s"} as its ranks report it, else None)."""
    with _jobs(cluster_name) as cluster_jobs:
        return list(cluster_jobs.records())


def job_progress(cluster_name: str, job_id: int | None = None, with_history: bool = True) -> dict[str, Any]:
    """A job's progress document (the latest job when `job_id` is None), as its ranks report it with
    `@@airflow-sky-progress/1` lines (airflow_sky.progress.report): the job's step (its slowest rank's),
    total, percent, rate and ETA, each rank's latest step, rate and metrics (with `with_history`, their
    history too), and the recoveries with the time each cost. The document's shape is documented in
    airflow_sky.gang.job_progress; a job that reported nothing has `reported_ranks` 0 and `step` None.
    An unknown cluster or job raises ClusterError."""
    with _jobs(cluster_name) as cluster_jobs:
        return cluster_jobs.progress(job_id, with_history=with_history)


def cancel(cluster_name: str, job_ids: Sequence[int] | None = None, all: bool = False) -> list[int]:
    """Kill jobs' processes on every node and mark them CANCELLED (default: the latest unfinished job)."""
    with _jobs(cluster_name) as cluster_jobs:
        return list(cluster_jobs.cancel(list(job_ids) if job_ids else None, all_jobs=all))
