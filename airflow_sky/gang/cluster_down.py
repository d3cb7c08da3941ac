"""Whether a job's teardown may end its cluster, as SkyPilot's `--down` (autodown) decides: only once idle.

Two runs of a DAG with one `cluster_name`, or `jobs launch -c dev` while `dev` runs a job, share a cluster.
A teardown with `down` therefore ends the cluster only when no other job still holds it; otherwise it
releases its own job only and leaves a *down request* on the cluster, so that the last job's teardown
(whatever its own `down`) ends it.

A job holds the cluster while its record is not terminal and was written within its lease (JOB_LEASE_S,
on the state store's own clock: every write of the record renews it, and a running job's watcher writes
every few seconds). A record that was written recently may still belong to a run that just crashed, so a
teardown that finds holders waits until one of them proves alive by a write newer than the one it first
saw (seconds for a running job); that one's teardown ends the cluster later. A crashed run's record stays
non-terminal, but it is never written again: it stops holding the cluster one lease after its last write,
and then the waiting teardown ends the cluster. So a crashed run keeps a cluster up one lease at most.

The decision and its mark are one compare-and-swap on the cluster's job index, the record every
allocation writes: a job that joins while a teardown looks makes the teardown look again, and a job that
tries to join a cluster whose teardown decided to end it waits and provisions again (state.ClusterClosing).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow_sky.gang import state as js
from airflow_sky.infra.state_store import Versioned

JOB_LEASE_ENV = "AIRFLOW_SKY_JOB_LEASE_S"
DEFAULT_JOB_LEASE_S = 600.0  # a job with no sign of life for this long no longer holds its cluster
POLL_S = 2.0


def job_lease_s() -> float:
    """The job lease (AIRFLOW_SKY_JOB_LEASE_S on the worker, default 10 minutes)."""
    return float(os.environ.get(JOB_LEASE_ENV) or DEFAULT_JOB_LEASE_S)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Another job that keeps the cluster up."""

    job_id: int
    status: str
    owner: str  # who submitted it (dag/run/task, or the CLI's key)
    idle_s: float  # since its record was last written, on the store's clock
    written_at: float = 0.0  # when (the store's clock): a later write proves the job alive

    def describe(self) -> str:
        return f"job {self.job_id} ({self.status}, {self.owner}; last sign of life {self.idle_s:.0f}s ago)"


@dataclasses.dataclass(frozen=True)
class Release:
    """What the teardown of one job does to its cluster."""

    terminate: bool
    holders: tuple[Holder, ...] = ()  # the jobs that keep it up (when not terminating)
    deferred: tuple[int, ...] = ()  # earlier jobs whose teardown left their buckets to this one
    closing_by: int | None = None  # another teardown is already ending it
    down_requested: bool = False  # kept up, with a down request the last job's teardown carries out


def holders(
    jobs: Sequence[tuple[js.JobState, float | None]],
    index: dict[str, Any],
    index_written_at: float | None,
    own_job: int,
    now: float,
    lease_s: float,
) -> list[Holder]:
    """The other jobs holding the cluster: not terminal and written within `lease_s` (pure).

    A job in the index without a record yet is being registered: it holds the cluster for one lease after
    the index was written.
    """
    found: list[Holder] = []
    recorded = set()
    for state, written_at in jobs:
        recorded.add(state.job_id)
        stamp = now if written_at is None else written_at
        idle = now - stamp
        if state.job_id == own_job or state.status.is_terminal or idle >= lease_s:
            continue
        owner = str(state.info.get("submit_key") or state.info.get("name") or "?")
        found.append(Holder(state.job_id, state.status.value, owner, max(0.0, idle), stamp))
    stamp = now if index_written_at is None else index_written_at
    idle = now - stamp
    for owner, job_id in sorted((index.get("keys") or {}).items(), key=lambda kv: int(kv[1])):
        if int(job_id) not in recorded and int(job_id) != own_job and idle < lease_s:
            found.append(Holder(int(job_id), "REGISTERING", owner, max(0.0, idle), stamp))
    return found


def release_cluster(
    states: js.JobStates,
    job_id: int,
    down: bool,
    log: Callable[[str], None],
    lease_s: float | None = None,
    poll_s: float = POLL_S,
) -> Release:
    """Decide, by compare-and-swap on the job index, whether job `job_id`'s teardown ends the cluster.

    `down`: the job asked for it. A down request another job left counts as asked. Waits while the other
    jobs holding the cluster have not yet proven alive (at most one lease). Never deletes or changes
    another job's record.
    """
    lease_s = job_lease_s() if lease_s is None else lease_s
    first_seen: dict[int, float] = {}  # holder -> the write time it had when first seen
    announced = False
    while True:
        index: Versioned | None = states.index()
        data: dict[str, Any] = dict(index.data) if index else {"next": 1, "keys": {}}
        closing = data.get("closing")
        if closing:  # another teardown found the cluster idle already and is ending it
            return Release(True, closing_by=int(closing.get("by") or 0))
        requested = [int(j) for j in data.get("down_requested") or []]
        now = states.store.now()
        holding = holders(states.stamped(), data, index.written_at if index else None, job_id, now, lease_s)
        if not down and not requested:
            return Release(False, tuple(holding))
        alive = [h for h in holding if h.job_id in first_seen and h.written_at > first_seen[h.job_id]]
        for h in holding:
            first_seen.setdefault(h.job_id, h.written_at)
        if holding and not alive:
            if not announced:
                log(
                    "Before tearing the cluster down, waiting for a sign of life of "
                    + "; ".join(h.describe() for h in holding)
                    + f": a job that writes its record keeps the cluster (its teardown ends it); one "
                    f"silent for {lease_s:.0f}s is a crashed run and no longer holds it"
                )
                announced = True
            time.sleep(poll_s)
            continue
        deferred = sorted({int(j) for j in data.get("deferred_release") or []} - {job_id})
        if holding:
            new = data | {
                "down_requested": sorted({*requested, job_id} if down else set(requested)),
                "deferred_release": sorted({*deferred, job_id}),
            }
        else:
            new = data | {"closing": {"by": job_id, "at": now}}
        if states.store.put(js.INDEX, new, index.version if index else None) is None:
            continue  # a job joined (or another teardown decided) meanwhile: look again
        if holding:
            return Release(False, tuple(alive), down_requested=True)
        return Release(True, deferred=tuple(deferred))
