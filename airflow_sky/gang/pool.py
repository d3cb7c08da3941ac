"""A pool's record and its queue: which warm worker runs which job, one job per worker, in submission order.

A pool's records live in the infra's state store under a store of its own (`sky-pool-<name>`), beside its
workers' clusters (`<name>-0`, `<name>-1`, ...), never on an Airflow worker:

    pool            the pool: its infra, workers, node count, and the pool file's task (secrets without values)
    queue           {"next": next ticket, "first": oldest ticket that may still wait,
                     "assigned": {worker: {"ticket", "key", "at"}}}
    waiting/<t>     ticket t's waiter, renewed every POLL_S while it waits (`done` once it has a worker or gave up)

A job takes a ticket, then waits until its place among the live waiters (older tickets whose waiter renewed
within WAITING_STALE_S) is smaller than the number of free workers, and takes the free worker at that place
by one compare-and-swap on `queue`: two jobs can never take one worker. A worker is free when no job of its
cluster's own queue is live (gang.job_queue) and no job took it without handing over yet: a job hands over
once it is registered in the worker's cluster (its cluster queue then holds the worker), and a taking whose
job died before that expires after ASSIGNED_STALE_S. So a worker is free again as soon as its job ends,
whoever ended it (its follow, a cancel, a teardown).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.gang import state as js
from airflow_sky.gang.job_queue import ADMITTED_KEY, live_claims
from airflow_sky.infra.state_store import StateStore
from airflow_sky.task.pool import POOL_TASK_INFO_KEY

POOL_KEY = "pool"
QUEUE_KEY = "queue"
WAITING_STALE_S = 60.0  # a waiter that did not renew its ticket for this long (store clock) is gone
ASSIGNED_STALE_S = 600.0  # a job that took a worker and never registered on it died before it could
POLL_S = 2.0
RECENT_JOBS = 32  # how far back a worker's jobs are read to know whether one still holds it


def pool_store_name(pool: str) -> str:
    """The name the pool's records are kept under in its infra (a store beside its workers' clusters)."""
    return f"sky-pool-{pool}"


@dataclasses.dataclass(frozen=True)
class PoolRecord:
    name: str
    infra: str
    workers: tuple[str, ...]  # the workers' cluster names, in order
    num_nodes: int
    task: dict[str, Any]  # the pool file's task (Task.to_dict with secret references, never values)
    applied_at: float

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "workers": list(self.workers)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolRecord:
        return cls(
            name=str(data["name"]),
            infra=str(data["infra"]),
            workers=tuple(str(w) for w in data.get("workers") or ()),
            num_nodes=int(data.get("num_nodes") or 1),
            task=dict(data.get("task") or {}),
            applied_at=float(data.get("applied_at") or 0.0),
        )


def read_pool(store: StateStore) -> PoolRecord | None:
    record = store.get(POOL_KEY)
    return PoolRecord.from_dict(record.data) if record and record.data.get("workers") else None


def write_pool(store: StateStore, pool: PoolRecord | None) -> None:
    """Write (None: remove) the pool's record, whatever was there."""
    for _ in range(200):
        current = store.get(POOL_KEY)
        data = pool.to_dict() if pool is not None else {}
        if store.put(POOL_KEY, data, current.version if current else None) is not None:
            return
        time.sleep(0.01)
    raise ClusterError("the pool's record kept changing under 200 attempts to write it")


# ---- pure rules ---------------------------------------------------------------------------------------------


def fresh_assignments(assigned: Mapping[str, Any], now: float) -> dict[str, dict[str, Any]]:
    """The takings that still hold their worker: not handed over, not older than ASSIGNED_STALE_S."""
    return {
        worker: dict(entry)
        for worker, entry in assigned.items()
        if isinstance(entry, Mapping) and now - float(entry.get("at") or 0.0) < ASSIGNED_STALE_S
    }


def free_workers(
    workers: Sequence[str], busy: Callable[[str], bool], taken: Mapping[str, Any], enough: int | None = None
) -> list[str]:
    """The workers no job holds, in the pool's order (pure given `busy`); with `enough`, the first that many
    (a waiter needs to know only whether its place has one: each `busy` is a read of a worker's jobs)."""
    free: list[str] = []
    for worker in workers:
        if enough is not None and len(free) >= enough:
            break
        if worker not in taken and not busy(worker):
            free.append(worker)
    return free


def place_in_line(ticket: int, live_tickets: Sequence[int]) -> int:
    """How many live waiters are ahead of `ticket`: it may take a worker when this is below the free count."""
    return sum(1 for t in live_tickets if t < ticket)


def worker_is_busy(
    jobs: Sequence[tuple[js.JobState, float | None]], admitted: Mapping[str, Any], now: float
) -> bool:
    """A worker cluster holds a job that is not over, or waits for its nodes (its own job queue's rule)."""
    return bool(live_claims(jobs, admitted, now))


# ---- the queue ----------------------------------------------------------------------------------------------


class PoolQueue:
    """A pool's queue in its store; `worker_jobs(worker)` opens the JobStates of a worker's cluster."""

    def __init__(self, store: StateStore, worker_jobs: Callable[[str], js.JobStates]) -> None:
        self.store = store
        self.worker_jobs = worker_jobs

    def _change_queue(
        self, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply `change` to the queue record by compare-and-swap (`change` returns None: leave it)."""
        for _ in range(400):
            record = self.store.get(QUEUE_KEY)
            data: dict[str, Any] = dict(record.data) if record else {"next": 1, "first": 1, "assigned": {}}
            new = change(data)
            if new is None:
                return None
            if self.store.put(QUEUE_KEY, new, record.version if record else None) is not None:
                return new
            time.sleep(0.01)
        raise ClusterError("the pool's queue kept changing under 400 attempts to update it")

    def take_ticket(self, key: str, label: str) -> int:
        """A place in line for the job `key` (shown as `label`)."""
        taken: dict[str, int] = {}

        def next_ticket(data: dict[str, Any]) -> dict[str, Any]:
            taken["ticket"] = int(data.get("next") or 1)
            return {**data, "next": taken["ticket"] + 1}

        self._change_queue(next_ticket)
        ticket = taken["ticket"]
        self.store.put(f"waiting/{ticket}", {"key": key, "label": label, "renewals": 0}, None)
        return ticket

    def _renew(self, ticket: int) -> float:
        """Renew the waiter's ticket; returns the store's clock now (the renewal's write time)."""
        key = f"waiting/{ticket}"
        for _ in range(50):
            record = self.store.get(key)
            data = dict(record.data) if record else {}
            data["renewals"] = int(data.get("renewals") or 0) + 1
            written = self.store.put(key, data, record.version if record else None)
            if written is not None:
                return written.written_at if written.written_at is not None else time.time()
        raise ClusterError(f"pool ticket {ticket}: its record kept changing")

    def _finish_ticket(self, ticket: int) -> None:
        key = f"waiting/{ticket}"
        record = self.store.get(key)
        if record is not None and not record.data.get("done"):
            self.store.put(key, {**record.data, "done": True}, record.version)

    def waiting(self, now: float) -> list[tuple[int, dict[str, Any]]]:
        """The live waiters, oldest ticket first (reads the tickets from the oldest that may still wait)."""
        record = self.store.get(QUEUE_KEY)
        if record is None:
            return []
        live = []
        for ticket in range(int(record.data.get("first") or 1), int(record.data.get("next") or 1)):
            entry = self.store.get(f"waiting/{ticket}")
            if entry is None or entry.data.get("done"):
                continue
            written = entry.written_at if entry.written_at is not None else now
            if now - written < WAITING_STALE_S:
                live.append((ticket, dict(entry.data)))
        return live

    def busy(self, worker: str, now: float) -> bool:
        """Whether a job holds `worker`: its cluster's newest RECENT_JOBS jobs are read, not its whole history
        (a worker runs one job at a time, so a job still live is among its latest; a long-lived pool's
        workers gather thousands of records, and every waiter asks every POLL_S)."""
        jobs = self.worker_jobs(worker)
        index = jobs.index()
        data = index.data if index else {}
        admitted = data.get(ADMITTED_KEY) or {}
        newest = int(data.get("next") or 1)
        recent = []
        for job_id in range(max(1, newest - RECENT_JOBS), newest):
            record = jobs.store.get(jobs.key(job_id))
            if record is not None:
                recent.append((js.JobState.from_dict(record.data), record.written_at))
        return worker_is_busy(recent, admitted, now)

    def try_take(self, ticket: int, key: str, workers: Sequence[str], now: float) -> str | None:
        """Take a free worker if `ticket`'s turn has come; None: wait on."""
        live = [t for t, _ in self.waiting(now)]
        place = place_in_line(ticket, live)
        record = self.store.get(QUEUE_KEY)
        taken = fresh_assignments((record.data.get("assigned") or {}) if record else {}, now)
        free = free_workers(workers, lambda w: self.busy(w, now), taken, enough=place + 1)
        if place >= len(free):
            return None
        chosen = free[place]
        others = [t for t in live if t != ticket]
        first = min(others) if others else ticket + 1  # no older ticket waits: later reads start here

        def assign(data: dict[str, Any]) -> dict[str, Any] | None:
            assigned = fresh_assignments(data.get("assigned") or {}, now)
            if chosen in assigned:
                return None  # another job took it since: look again
            assigned[chosen] = {"ticket": ticket, "key": key, "at": now}
            return {**data, "assigned": assigned, "first": min(first, int(data.get("next") or 1))}

        if self._change_queue(assign) is None:
            return None
        self._finish_ticket(ticket)
        return chosen

    def hand_over(self, worker: str, ticket: int) -> None:
        """The job of `ticket` is registered on `worker`'s cluster: its cluster queue holds the worker now."""

        def release(data: dict[str, Any]) -> dict[str, Any] | None:
            assigned = dict(data.get("assigned") or {})
            entry = assigned.get(worker)
            if not isinstance(entry, Mapping) or int(entry.get("ticket") or 0) != ticket:
                return None
            del assigned[worker]
            return {**data, "assigned": assigned}

        self._change_queue(release)

    def give_up(self, ticket: int, worker: str | None) -> None:
        """The job of `ticket` will not run (it failed or was cancelled): its place and its worker go."""
        self._finish_ticket(ticket)
        if worker is not None:
            self.hand_over(worker, ticket)

    def wait_for_worker(
        self,
        key: str,
        label: str,
        workers: Sequence[str],
        say: Callable[[str], None],
        ticket: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> tuple[str, int]:
        """Wait (PENDING) until a worker is free for the job `key`; returns (the worker, the job's ticket)."""
        ticket = self.take_ticket(key, label) if ticket is None else ticket
        said = ""
        try:
            while True:
                now = self._renew(ticket)
                if read_pool(self.store) is None:  # `jobs pool down` while this job waited
                    raise ClusterError("the pool was taken down while this job waited for a worker")
                chosen = self.try_take(ticket, key, workers, now)
                if chosen is not None:
                    say(f"Pool worker {chosen} runs this job (ticket {ticket})")
                    return chosen, ticket
                ahead = place_in_line(ticket, [t for t, _ in self.waiting(now)])
                line = f"PENDING: every worker of the pool is busy; {ahead} job(s) ahead in line (ticket {ticket})"
                if line != said:
                    say(line)
                    said = line
                sleep(POLL_S)
        except BaseException:
            self._finish_ticket(ticket)
            raise


def record_pool_task(states: js.JobStates, job_id: int, task: dict[str, Any]) -> None:
    """Keep the pool's task in its job's state: a replacement node of the worker gets its setup from it."""
    states.update(job_id, lambda s: dataclasses.replace(s, info={**s.info, POOL_TASK_INFO_KEY: task}))


def pool_missing(pool: str, infra: str) -> ClusterError:
    return ClusterError(
        f"pool {pool!r}: no such pool on {infra}; create it with `airflow-sky jobs pool apply -p {pool} "
        "pool.yaml` (`airflow-sky jobs pool status` lists the pools)"
    )


def open_pool(pool: str, infra: str, conn_id: str | None = None) -> tuple[PoolRecord, PoolQueue]:
    """The pool's record and queue on `infra`; a pool that is not there raises ClusterError saying so."""
    from airflow_sky.infra.registry import get_cloud

    cloud = get_cloud(infra, conn_id)
    store = cloud.state_store(pool_store_name(pool))
    record = read_pool(store)
    if record is None:
        raise pool_missing(pool, infra)
    return record, PoolQueue(store, lambda worker: js.JobStates(cloud.state_store(worker)))
