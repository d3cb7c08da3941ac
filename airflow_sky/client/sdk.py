"""The Python SDK, mirroring SkyPilot's: launch, exec, tail_logs, job_status, queue, cancel, down, status
(and job_progress: a job's progress as its ranks report it).

Same engine as the CLI and the operators: launch/exec run the job's DAG in this process; the queue, logs
and cancel read and act on the cluster itself (its job state, kept by the infra, and its nodes).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from airflow_sky.client import ssh_config
from airflow_sky.client.cluster_lookup import cluster_of, forget, infra_of, remember
from airflow_sky.client.cluster_names import (
    check_cluster_name,
    cluster_name_here,
    cluster_name_note,
    task_cluster_name,
)
from airflow_sky.client.engine import JobOutcome, Launch, LaunchOptions, bind_private_home
from airflow_sky.client.events import Event
from airflow_sky.client.sdk_jobs import (
    cancel,
    download_logs,
    hook_logs,
    job_progress,
    job_status,
    logs_dir,
    queue,
    tail_logs,
    tail_provision_logs,
)
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.gang.job import JobHandle
from airflow_sky.task import Task

_hooks_log = logging.getLogger("airflow_sky.hooks")  # lifecycle hooks' output where no caller takes it
if TYPE_CHECKING:  # these load Airflow, which engine.prepare_airflow must configure first
    from airflow_sky.infra.base import Node
    from airflow_sky.infra.cluster import Cluster

__all__ = [
    "autostop",
    "cancel",
    "check_cluster_name",
    "cluster_name_note",
    "cluster_of",
    "down",
    "download_logs",
    "endpoints",
    "exec",
    "forget",
    "hook_logs",
    "infra_of",
    "job_progress",
    "job_status",
    "launch",
    "logs_dir",
    "queue",
    "start",
    "status",
    "stop",
    "tail_logs",
    "tail_provision_logs",
]

# ---- which infra a cluster lives on (a lookup hint; the infra itself is the source of truth) -------------


def _existing(cluster_name: str) -> tuple[Cluster, list[Node]]:
    """The cluster and its nodes; when the infra the index names no longer has it, the others are asked."""
    from airflow_sky.client.cluster_search import ClusterNotFound, locate
    from airflow_sky.infra.registry import open_cluster

    try:
        cluster = cluster_of(cluster_name)
    except ClusterNotFound:
        ssh_config.remove_entries(cluster_name)  # gone everywhere: its ssh entries lead nowhere
        raise
    nodes = cluster.nodes()
    if nodes:
        return cluster, nodes
    forget(cluster_name)  # the record was stale: its ssh entries lead nowhere
    cluster = open_cluster(cluster_name, locate(cluster_name, already_searched=[cluster.infra]))
    return cluster, cluster.nodes()


# ---- launch / exec ---------------------------------------------------------------------------------------


def run(
    task: Task,
    options: LaunchOptions,
    listener: Callable[[Event], None] | None = None,
    task_file: str | None = None,
    launch_command: str | None = None,
    in_child: bool = False,
) -> JobOutcome:
    """Run a launch/exec to its end (or to its start with options.follow=False); the CLI's engine call.

    `launch_command`: for an exec whose cluster cannot take it, the launch to suggest (the CLI's, with
    the flags the user gave); by default one of `task_file`. `in_child`: the engine in a process of its own."""
    from airflow_sky.client.engine_process import caller_runs_airflow, run_job_in_child

    # An SDK call from inside Airflow (a task) never uses its DB or dags: always a child there.
    in_child = in_child or caller_runs_airflow()
    if not in_child:
        from airflow_sky.client.engine import prepare_airflow

        prepare_airflow()
    from airflow_sky.client.engine import run_job

    cluster = _preflight(task, options, task_file or "TASK.yaml", launch_command)

    def this_cluster(name: str, infra: str) -> Cluster:
        """The launch's one Cluster (its cloud session too); another only for a name the engine changed."""
        return cluster if (name, infra) == (cluster.name, cluster.infra) else cluster_of(name, infra)

    def on_event(event: Event) -> None:
        if event.kind == "job":
            handle = JobHandle.from_dict(event.data)
            remember(handle.cluster_name, handle.infra)
            key_files = this_cluster(handle.cluster_name, handle.infra).key_files(handle.nodes)
            ssh_config.write_entries(handle.cluster_name, handle.nodes, key_files)
        if listener is not None:
            listener(event)

    if not options.follow and options.must_exist and not in_child:
        from airflow_sky.gang.cluster_jobs import queue_blockers

        if queue_blockers(cluster, task):
            # `exec -d` on a busy cluster returns once its job is queued: a background engine waits its turn.
            from airflow_sky.client.detach import queue_in_background

            return queue_in_background(task, options, on_event)
    outcome = (run_job_in_child if in_child else run_job)(Launch(task, options), listener=on_event)
    if outcome.job_id is not None:
        _after_the_job(this_cluster(outcome.cluster_name, options.infra), options.down)
    return outcome


def _after_the_job(cluster: Cluster, down: bool) -> None:
    """The cluster as the job left it: gone (the DAG's teardown took it down: forget it), or up, maybe on
    nodes that replaced preempted ones: `ssh C-workerN` must reach those, with their host keys."""
    from airflow_sky.infra.base import NodeStatus

    nodes = cluster.nodes()
    if not nodes:
        if down:
            forget(cluster.name)
        return
    if all(n.status is NodeStatus.RUNNING for n in nodes):
        ssh_config.write_entries(cluster.name, nodes, cluster.key_files(nodes))


def _preflight(task: Task, options: LaunchOptions, task_file: str, launch_command: str | None) -> Cluster:
    """Refuse what cannot work before any Airflow run starts: an unknown infra, an exec that cannot run.
    Returns the launch's cluster (opened once: every later step of this launch here uses it)."""
    from airflow_sky.gang.phases import check_exec_nodes

    cluster = cluster_of(options.cluster_name, options.infra)  # an unknown infra is refused here
    cluster.cloud.check_config()
    cluster.autostop_for(task.resources)  # an infra without autostop
    if not options.must_exist:
        cluster.cloud.check_resources(task.resources, task.num_nodes)  # e.g. GPUs this machine lacks
    if options.must_exist:
        from airflow_sky.client.cluster_search import known_cluster_names

        nodes = cluster.nodes()
        check_exec_nodes(
            options.cluster_name,
            options.infra,
            nodes,
            task.num_nodes,
            task_file,
            launch_command=launch_command,
            known_clusters=() if nodes else known_cluster_names(),
        )
    return cluster


def _printing_listener(output: TextIO | None = None) -> Callable[[Event], None]:
    """Node log lines to `output`, by default this process's stdout as it is now: while the engine runs the
    DAG, fd 1 is redirected to the launch's Airflow log, so the lines go to a duplicate of the real one."""
    lock = threading.Lock()
    if output is None:
        sys.stdout.flush()
        output = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")

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
    name = check_cluster_name(cluster_name) if cluster_name else task_cluster_name(task.name)
    options = LaunchOptions(
        cluster_name=name,
        infra=infra or task.resources.infra or "local",
        down=down,
        setup=not no_setup,
        follow=not detach_run,
    )
    return _handle_of(run(task, options, _printing_listener() if stream_logs else None))


def exec(
    task: Task | str, cluster_name: str, *, detach_run: bool = False, stream_logs: bool = True
) -> tuple[int | None, JobHandle | None]:
    """Run `task` on an existing cluster without setup (workdir synced), like `sky.exec`."""
    if isinstance(task, str):
        task = Task.from_yaml(task)
    cluster_name = cluster_name_here(cluster_name)
    options = LaunchOptions(
        cluster_name=cluster_name,
        infra=infra_of(cluster_name, task.resources.infra),
        down=False,
        setup=False,
        must_exist=True,
        follow=not detach_run,
    )
    return _handle_of(run(task, options, _printing_listener() if stream_logs else None))


def _handle_of(outcome: JobOutcome) -> tuple[int | None, JobHandle | None]:
    if outcome.job_id is None:
        reason = outcome.failures[0] if outcome.failures else f"DAG run {outcome.state}"
        raise ClusterError(
            f"the job never started on {outcome.cluster_name}: {reason} (log: {outcome.log_file})"
        )
    return outcome.job_id, outcome.handle


def down(cluster_name: str, log: Callable[[str], None] = _hooks_log.info) -> None:
    """Terminate every node of the cluster, its `down` hooks first (output to `log`); forget its ssh entries."""
    from airflow_sky.gang.lifecycle import run_hooks

    cluster, _ = _existing(cluster_name)
    run_hooks(cluster, "down", log)
    cluster.terminate()
    forget(cluster_name)


def stop(cluster_name: str, log: Callable[[str], None] = _hooks_log.info) -> bool:
    """Stop every node of a cluster, keeping its disks (`sky stop`), its `stop` hooks first (output to
    `log`); `start` or a launch starts it again. False when every node was stopped already (nothing done).
    The nodes stop themselves as autostop stops them: only infras with autostop can (local, aws, gcp)."""
    from airflow_sky.gang import fleet

    cluster, _ = _existing(cluster_name)
    return fleet.stop(cluster, log, wait_s=_STOP_WAIT_S)


def start(cluster_name: str) -> None:
    """Start a stopped cluster again (same disks), as `sky start`; its nodes may get new addresses."""
    from airflow_sky.infra.base import NodeStatus, ProvisionRequest

    cluster, nodes = _existing(cluster_name)
    if all(n.status is NodeStatus.RUNNING for n in nodes):
        return
    if not any(n.status is NodeStatus.STOPPED for n in nodes):
        states = ", ".join(sorted({n.status.value for n in nodes}))
        raise ClusterError(f"cluster {cluster_name!r} is not stopped ({states}); nothing to start")
    cluster.record_autostop(None)  # its nodes come back without their watchers (`autostop -i` re-arms)
    started = cluster.cloud.provision(ProvisionRequest(cluster_name=cluster_name, num_nodes=len(nodes)))
    cluster.record_provisioned(started, None, f"{len(started)} node(s) started again", kind="started")
    cluster_again = cluster_of(cluster_name)
    ssh_config.write_entries(cluster_name, started, cluster_again.key_files(started))


def autostop(cluster_name: str, idle_minutes: int | None, down: bool = False) -> None:
    """Arm every node's autostop watcher (`sky autostop -i N [--down]`); idle_minutes None cancels it."""
    from airflow_sky.task import Resources

    cluster, nodes = _existing(cluster_name)
    if idle_minutes is not None and idle_minutes < 0:
        raise SpecError(f"-i/--idle-minutes: must be >= 0, got {idle_minutes}")
    config: dict[str, Any] | bool = (
        False if idle_minutes is None else {"idle_minutes": idle_minutes, "down": down}
    )
    cluster.arm_autostop(nodes, Resources().copy(autostop=config))


_STOP_WAIT_S = 600.0  # a cloud VM takes minutes to stop


def status(
    cluster_names: Sequence[str] | None = None, infra: str | None = None, refresh: bool = False
) -> list[dict[str, Any]]:
    """Clusters with their nodes: [{"name", "infra", "status": UP|...|NOT_FOUND, "nodes": [...],
    "autostop": {"idle_minutes", "down"} or None}].

    Named clusters without `infra` are found as `down` finds them (the index, else every infra configured
    here); a NOT_FOUND one has the search's message under "note". With `infra`, that infra is asked and a
    named cluster found there is recorded. Without names: every cluster of `infra` (default local).
    `refresh` (sky's `status -r`): every infra configured here is asked (client/cluster_status.py).
    """
    bind_private_home()
    if refresh and infra is None:
        from airflow_sky.client.cluster_status import refreshed_status

        return refreshed_status(cluster_names)
    if cluster_names and infra is None:
        return [_status_of(name) for name in cluster_names]
    from airflow_sky.client.cluster_status import status_row
    from airflow_sky.infra.cluster import Cluster
    from airflow_sky.infra.registry import get_cloud

    infra = infra or "local"
    cloud = get_cloud(infra)
    result = []
    for name in cluster_names or list(cloud.clusters()):
        nodes = cloud.nodes(name)
        if cluster_names and nodes:
            remember(name, infra)  # `status --infra I NAME` is how a user says where an ambiguous name lives
        result.append(status_row(Cluster(name, infra, cloud), nodes))
    return result


def endpoints(cluster: str, port: int | None = None) -> dict[int, str]:
    """`sky.endpoints`: each opened port (resources.ports) of `cluster` -> `host:port` on its head node;
    with `port`, that one only (a ClusterError when it was not opened)."""
    bind_private_home()
    found, _ = _existing(cluster)
    return found.endpoints(port)


def _status_of(cluster_name: str) -> dict[str, Any]:
    from airflow_sky.client.cluster_search import AmbiguousCluster, ClusterNotFound
    from airflow_sky.client.cluster_status import not_found_row, status_row

    try:
        cluster, nodes = _existing(cluster_name)
    except (ClusterNotFound, AmbiguousCluster) as e:
        return not_found_row(cluster_name) | {"note": str(e)}
    return status_row(cluster, nodes)
