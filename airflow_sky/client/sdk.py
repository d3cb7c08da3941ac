"""The Python SDK, mirroring SkyPilot's: launch, exec, tail_logs, job_status, queue, cancel, down, status.

Same engine as the CLI and the operators: launch/exec run the job's DAG in this process; the queue, logs
and cancel read and act on the cluster itself (its job state, kept by the infra, and its nodes).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from airflow_sky.client import ssh_config
from airflow_sky.client.engine import JobOutcome, LaunchOptions, bind_private_home
from airflow_sky.client.events import Event
from airflow_sky.errors import ClusterError
from airflow_sky.gang.job import JobHandle, JobStatus, sanitize_cluster_name
from airflow_sky.infra.home import sky_home
from airflow_sky.task import Task

if TYPE_CHECKING:  # these load Airflow, which engine.prepare_airflow must configure first
    from airflow_sky.gang.cluster_jobs import ClusterJobs
    from airflow_sky.infra.cluster import Cluster

__all__ = ["cancel", "down", "exec", "forget", "job_status", "launch", "queue", "status", "tail_logs"]


# ---- which infra a cluster lives on (a lookup hint; the infra itself is the source of truth) -------------


def _index_path() -> Any:
    return sky_home() / "clusters.json"


def _read_index() -> dict[str, str]:
    try:
        data: dict[str, str] = json.loads(_index_path().read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _remember(cluster_name: str, infra: str | None) -> None:
    index = _read_index()
    if infra is None:
        index.pop(cluster_name, None)
    else:
        index[cluster_name] = infra
    path = _index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(index, indent=1, sort_keys=True))


def infra_of(cluster_name: str, infra: str | None = None) -> str:
    return infra or _read_index().get(cluster_name, "local")


def cluster_of(cluster_name: str, infra: str | None = None) -> Cluster:
    """The cluster `cluster_name` on the infra it was launched on (or `infra`)."""
    bind_private_home()
    from airflow_sky.infra.registry import open_cluster

    return open_cluster(cluster_name, infra_of(cluster_name, infra))


def _jobs(cluster_name: str, infra: str | None = None) -> ClusterJobs:
    from airflow_sky.gang.cluster_jobs import ClusterJobs

    return ClusterJobs(cluster_of(cluster_name, infra))


# ---- launch / exec ---------------------------------------------------------------------------------------


def run(
    task: Task,
    options: LaunchOptions,
    listener: Callable[[Event], None] | None = None,
    task_file: str | None = None,
) -> JobOutcome:
    """Run a launch/exec to its end (or to its start with options.follow=False); the CLI's engine call."""
    from airflow_sky.client.engine_process import caller_runs_airflow, run_job_in_child

    in_child = caller_runs_airflow()  # an SDK call from inside Airflow (a task): never its DB or dags
    if not in_child:
        from airflow_sky.client.engine import prepare_airflow

        prepare_airflow()
    from airflow_sky.client.engine import run_job

    _preflight(task, options, task_file or "TASK.yaml")

    def on_event(event: Event) -> None:
        if event.kind == "job":
            handle = JobHandle.from_dict(event.data)
            _remember(handle.cluster_name, handle.infra)
            cluster = cluster_of(handle.cluster_name, handle.infra)
            ssh_config.write_entries(handle.cluster_name, handle.nodes, cluster.key_files(handle.nodes))
        if listener is not None:
            listener(event)

    outcome = (run_job_in_child if in_child else run_job)(task, options, listener=on_event)
    if (
        options.down
        and outcome.job_id is not None
        and not cluster_of(outcome.cluster_name, options.infra).nodes()
    ):
        forget(outcome.cluster_name)  # the DAG's teardown took it down
    return outcome


def _preflight(task: Task, options: LaunchOptions, task_file: str) -> None:
    """Refuse what cannot work before any Airflow run starts: an unknown infra, an exec that cannot run."""
    from airflow_sky.gang.phases import check_exec_nodes
    from airflow_sky.infra.registry import get_cloud

    get_cloud(options.infra).check_config()
    cluster_of(options.cluster_name, options.infra).autostop_for(task.resources)  # an infra without autostop
    if options.must_exist:
        nodes = cluster_of(options.cluster_name, options.infra).nodes()
        check_exec_nodes(options.cluster_name, options.infra, nodes, task.num_nodes, task_file)


def forget(cluster_name: str) -> None:
    """Drop what this machine keeps of a cluster that is gone: its ssh entries and infra hint."""
    ssh_config.remove_entries(cluster_name)
    _remember(cluster_name, None)


def _printing_listener(output: TextIO) -> Callable[[Event], None]:
    lock = threading.Lock()

    def listener(event: Event) -> None:
        if event.kind == "log":
            with lock:
                print(event.text, file=output, flush=True)

    return listener


def launch(
    task: Task | str,
    cluster_name: str | None = None,
    *,
    infra: str | None = None,
    down: bool = False,
    detach_run: bool = False,
    no_setup: bool = False,
    stream_logs: bool = True,
) -> tuple[int | None, JobHandle | None]:
    """Launch (or reuse) a cluster and run `task` on it, like `sky.launch`; returns (job_id, handle).

    The job's outcome is in `job_status(cluster_name, [job_id])`; a failure to provision raises.
    """
    if isinstance(task, str):
        task = Task.from_yaml(task)
    if detach_run and down:
        raise ClusterError(
            "down=True cannot be combined with detach_run=True: the cluster would go down under the job"
        )
    name = sanitize_cluster_name(cluster_name or f"sky-{task.name or 'job'}")
    options = LaunchOptions(
        cluster_name=name,
        infra=infra or task.resources.infra or "local",
        down=down,
        setup=not no_setup,
        follow=not detach_run,
    )
    return _handle_of(run(task, options, _printing_listener(sys.stdout) if stream_logs else None))


def exec(
    task: Task | str, cluster_name: str, *, detach_run: bool = False, stream_logs: bool = True
) -> tuple[int | None, JobHandle | None]:
    """Run `task` on an existing cluster without setup (workdir synced), like `sky.exec`."""
    if isinstance(task, str):
        task = Task.from_yaml(task)
    options = LaunchOptions(
        cluster_name=cluster_name,
        infra=infra_of(cluster_name, task.resources.infra),
        down=False,
        setup=False,
        must_exist=True,
        follow=not detach_run,
    )
    return _handle_of(run(task, options, _printing_listener(sys.stdout) if stream_logs else None))


def _handle_of(outcome: JobOutcome) -> tuple[int | None, JobHandle | None]:
    if outcome.job_id is None:
        reason = outcome.failures[0] if outcome.failures else f"DAG run {outcome.state}"
        raise ClusterError(
            f"the job never started on {outcome.cluster_name}: {reason} (log: {outcome.log_file})"
        )
    return outcome.job_id, outcome.handle


# ---- jobs on a cluster -----------------------------------------------------------------------------------


def tail_logs(
    cluster_name: str, job_id: int | None = None, follow: bool = True, output: TextIO | None = None
) -> int:
    """Print a job's node-prefixed logs (following until it ends); returns 0 if it SUCCEEDED, else 1."""
    out = output or sys.stdout
    lock = threading.Lock()

    def emit(rank: int, line: str) -> None:
        with lock:
            print(line, file=out, flush=True)

    with _jobs(cluster_name) as cluster_jobs:
        record = cluster_jobs.tail(job_id, emit, follow=follow)
    return 0 if record.get("status") == JobStatus.SUCCEEDED else 1


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
    """Every job record of the cluster, oldest first (id, name, status, submitted/started/ended, exit codes)."""
    with _jobs(cluster_name) as cluster_jobs:
        return list(cluster_jobs.records())


def cancel(cluster_name: str, job_ids: Sequence[int] | None = None, all: bool = False) -> list[int]:
    """Kill jobs' processes on every node and mark them CANCELLED (default: the latest unfinished job)."""
    with _jobs(cluster_name) as cluster_jobs:
        return list(cluster_jobs.cancel(list(job_ids) if job_ids else None, all_jobs=all))


def down(cluster_name: str) -> None:
    """Terminate every node of the cluster and forget its ssh entries."""
    cluster = cluster_of(cluster_name)
    if not cluster.nodes():
        forget(cluster_name)
        raise ClusterError(f"cluster {cluster_name!r} not found on {cluster.infra}")
    cluster.terminate()
    forget(cluster_name)


def status(cluster_names: Sequence[str] | None = None, infra: str = "local") -> list[dict[str, Any]]:
    """Clusters with their nodes: [{"name", "infra", "status": UP|...|NOT_FOUND, "nodes": [...]}]."""
    bind_private_home()
    from airflow_sky.infra.registry import get_cloud

    cloud = get_cloud(infra)
    result = []
    for name in cluster_names or list(cloud.clusters()):
        nodes = cloud.nodes(name)
        states = sorted({n.status.value for n in nodes})
        summary = "NOT_FOUND" if not nodes else "UP" if states == ["RUNNING"] else ",".join(states)
        result.append(
            {"name": name, "infra": infra, "status": summary, "nodes": [n.to_dict() for n in nodes]}
        )
    return result
