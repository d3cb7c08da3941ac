"""Pools from this machine: `jobs pool apply/status/down` (SkyPilot's `sky jobs pool ...`).

`apply` launches (or updates) each worker as a kept cluster `<pool>-<i>` with the pool file's setup,
workdir and file mounts — the workers side by side, each through the engine in a process of its own — then
writes the pool's record (gang.pool) into the infra's state store, where every Airflow worker that runs a
job for the pool finds it. Applying again re-runs the setup on every worker (a changed pool file takes
effect) and scales the pool: new workers are launched, workers beyond the count are torn down once idle.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from airflow_sky.client import sdk
from airflow_sky.client.cluster_lookup import infra_of
from airflow_sky.client.engine import LaunchOptions
from airflow_sky.client.events import Event
from airflow_sky.errors import ClusterError
from airflow_sky.gang import state as js
from airflow_sky.gang.pool import (
    PoolQueue,
    PoolRecord,
    pool_missing,
    pool_store_name,
    read_pool,
    write_pool,
)
from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.registry import get_cloud
from airflow_sky.task import Task
from airflow_sky.task.pool import check_pool_name, pool_task, pool_task_record, worker_cluster_name

MAX_PARALLEL_LAUNCHES = 8


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    cluster: str
    status: str  # UP, or what its nodes say (NOT_FOUND: no node)
    nodes: int
    job: dict[str, Any] | None  # the job that holds it: id, name, status


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    record: PoolRecord
    workers: list[WorkerStatus]
    pending: list[str]  # the labels of the jobs waiting for a worker, oldest first

    @property
    def busy(self) -> int:
        return sum(1 for w in self.workers if w.job is not None)


def apply(
    pool: str,
    task: Task,
    source: str,
    say: Callable[[str], None],
    workers: int | None = None,
) -> PoolRecord:
    """Create or update `pool` from a pool file's `task`; `workers` overrides the file's `pool.workers`."""
    check_pool_name(pool)
    task, spec = pool_task(task, source)
    count = workers if workers is not None else spec.workers
    infra = task.resources.infra or "local"
    cloud = get_cloud(infra)
    store = cloud.state_store(pool_store_name(pool))
    before = read_pool(store)
    if before is not None and before.infra != infra:
        raise ClusterError(
            f"pool {pool!r} lives on {before.infra}; its pool file now says {infra}: down it first"
        )
    names = [worker_cluster_name(pool, i) for i in range(count)]
    say(
        f"Applying pool {pool!r} on {infra}: {count} worker(s) of {task.num_nodes} node(s) ({', '.join(names)})"
    )
    from airflow_sky.client.engine import prepare_airflow

    prepare_airflow()  # once here, not by each worker's launch at the same moment
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(min(MAX_PARALLEL_LAUNCHES, count)) as launches:
        futures = {name: launches.submit(_launch_worker, task, name, infra, say) for name in names}
    failed = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
    if failed:
        lines = "\n".join(f"  {name}: {error}" for name, error in failed.items())
        raise ClusterError(
            f"pool {pool!r}: {len(failed)} of {count} worker(s) could not be set up; fix the pool file and "
            f"apply again, or `airflow-sky jobs pool down {pool}` (its workers stay up until then):\n{lines}"
        )
    record = PoolRecord(
        name=pool,
        infra=infra,
        workers=tuple(names),
        num_nodes=task.num_nodes,
        task=pool_task_record(task),
        applied_at=time.time(),
    )
    write_pool(store, record)
    say(f"Pool {pool!r}: {count} worker(s) set up in {time.monotonic() - started:.1f}s")
    if before is not None:
        for name in before.workers[count:]:
            say(f"Worker {name} is beyond {count} worker(s): tearing it down")
            _down_worker(name, say)
    return record


def _launch_worker(task: Task, cluster: str, infra: str, say: Callable[[str], None]) -> None:
    options = LaunchOptions(cluster_name=cluster, infra=infra, down=False, setup=True, follow=True)

    def relay(event: Event) -> None:
        if event.kind == "task_failed":
            say(f"[{cluster}] {event.step} failed{': ' + event.text if event.text else ''}")

    outcome = sdk.run(task, options, relay, in_child=True)
    if not outcome.succeeded:
        why = outcome.failures[0].splitlines()[0] if outcome.failures else outcome.state
        raise ClusterError(f"{why} (log: {outcome.log_file})")
    say(f"Worker {cluster}: up and set up (job {outcome.job_id})")


def open_queue(pool: str, infra: str) -> tuple[PoolRecord, PoolQueue]:
    cloud = get_cloud(infra)
    store = cloud.state_store(pool_store_name(pool))
    record = read_pool(store)
    if record is None:
        raise pool_missing(pool, infra)
    return record, PoolQueue(store, lambda worker: js.JobStates(cloud.state_store(worker)))


def pool_infra(pool: str, infra: str | None = None) -> str:
    """Where `pool` is: `infra` when given, else where this machine launched its first worker (the cluster
    index apply fills), else local."""
    return infra_of(worker_cluster_name(check_pool_name(pool), 0), infra)


def status(pool: str, infra: str | None = None) -> PoolStatus:
    """Each worker's state and job, and the jobs waiting for one."""
    infra = pool_infra(pool, infra)
    record, queue = open_queue(pool, infra)
    cloud = get_cloud(infra)
    now = queue.store.now()
    workers = []
    for name in record.workers:
        nodes = cloud.nodes(name)
        states = {n.status for n in nodes}
        shown = (
            "NOT_FOUND"
            if not nodes
            else "UP"
            if states == {NodeStatus.RUNNING}
            else "/".join(sorted(s.value.upper() for s in states))
        )
        job = None
        if queue.busy(name, now):
            live = [s for s in js.JobStates(cloud.state_store(name)).all() if not s.status.is_terminal]
            if live:
                job = {"id": live[0].job_id, "name": live[0].info.get("name"), "status": live[0].status.value}
        workers.append(WorkerStatus(name, shown, len(nodes), job))
    pending = [str(entry.get("label") or entry.get("key")) for _, entry in queue.waiting(now)]
    return PoolStatus(record, workers, pending)


def pools(infra: str = "local") -> list[str]:
    """The pools on `infra` (their workers' clusters are `<pool>-<i>`)."""
    cloud = get_cloud(infra)
    found = []
    for cluster in cloud.clusters():
        base, _, index = cluster.rpartition("-")
        if (
            index == "0"
            and base
            and base not in found
            and read_pool(cloud.state_store(pool_store_name(base)))
        ):
            found.append(base)
    return sorted(found)


def down(pool: str, say: Callable[[str], None], infra: str | None = None) -> None:
    """Forget `pool` (a job still waiting for a worker fails, saying so), cancel the jobs on its workers,
    then tear every worker down (its `down` hooks first)."""
    record, queue = open_queue(pool, pool_infra(pool, infra))
    write_pool(queue.store, None)  # no job takes a worker from now on
    now = queue.store.now()
    for name in record.workers:
        if queue.busy(name, now):
            cancelled = sdk.cancel(name, all=True)
            if cancelled:
                say(f"Worker {name}: cancelled job(s) {', '.join(map(str, cancelled))}")
    for name in record.workers:
        _down_worker(name, say)
    say(f"Pool {pool!r} is down ({len(record.workers)} worker(s) terminated)")


def _down_worker(name: str, say: Callable[[str], None]) -> None:
    try:
        sdk.down(name, log=say)
        say(f"Worker {name}: terminated")
    except ClusterError as e:
        say(f"Worker {name}: {e}")
