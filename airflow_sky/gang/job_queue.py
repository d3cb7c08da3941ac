"""A cluster's job queue, as `sky exec` has it: a job waits PENDING until the nodes it needs are free.

What a job holds (SkyPilot `reference/job-queue.rst`, for the fields airflow-sky schedules on):
- its nodes: every node of the cluster while its setup runs (a launch), else the first `num_nodes` (the run's);
- on each, its `accelerators` count when it names one: jobs whose counts together fit a node's GPUs share
  it (`L4:0.5` twice on a 1-GPU node); any other job takes each of its nodes whole (a CPU-only job too,
  unlike SkyPilot's small default CPU demand: its ports and processes would meet the other job's, as
  torchrun's fixed port does). A node that reports no GPUs is never shared.

Order is submission order (job ids are given out in it): a job waits behind an earlier pending job that
needs the same nodes, even when it would fit beside the running ones. The decision to start is one
compare-and-swap on the cluster's job index (`admitted`): two jobs deciding at once cannot both start on
the same nodes, since the loser reads the winner's admission and looks again.

A job leaves the queue when its record is terminal (follow, teardown, cancel), or when whoever waits for
it is gone: a pending job's waiter renews its record every few seconds, an admitted job that never
started is released after ADMITTED_STALE_S. The rules are pure functions; `wait_for_turn` is the loop.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_sky.errors import ClusterError, JobFailed
from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobStatus
from airflow_sky.infra.base import Node
from airflow_sky.task import Task

QUEUE_INFO_KEY = "queue"  # a job state's info entry: its demand, while waiting its renewal counter
ADMITTED_KEY = "admitted"  # the job index's entry: job id -> the demand it was admitted with
WAITING_STALE_S = 60.0  # a pending job whose waiter did not renew it for this long (store clock) is gone
ADMITTED_STALE_S = 900.0  # an admitted job that never started, unwritten this long, died before its start
POLL_S = 2.0


@dataclasses.dataclass(frozen=True)
class Demand:
    """What a job needs of the cluster: node ranks, and per node a GPU count (None: the whole node)."""

    ranks: tuple[int, ...]
    gpus: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "gpus": self.gpus}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Demand:
        gpus = data.get("gpus")
        return cls(tuple(int(r) for r in data.get("ranks") or ()), None if gpus is None else float(gpus))


@dataclasses.dataclass(frozen=True)
class Claim:
    """A live job's demand: admitted (it holds its nodes) or waiting (it is ahead of later jobs)."""

    job_id: int
    demand: Demand
    admitted: bool


def demand_of(task: Task, nodes: Sequence[Node], runs_setup: bool) -> Demand:
    """The demand of `task` over the cluster's `nodes` (pure): see the module's docstring."""
    ranks = sorted(n.rank for n in nodes)
    accelerators = task.resources.accelerators
    gpus = float(next(iter(accelerators.values()))) if accelerators else None
    return Demand(tuple(ranks if runs_setup else ranks[: task.num_nodes]), gpus)


def conflicts(
    me: Claim, others: Sequence[Claim], capacity: Mapping[int, float]
) -> dict[int, tuple[int, ...]]:
    """The jobs `me` must wait for, each with the ranks they share (pure; empty: it may start).

    Admitted jobs and earlier pending ones count; a later pending job never holds an earlier one up.
    """
    ahead = [c for c in others if c.job_id != me.job_id and (c.admitted or c.job_id < me.job_id)]
    waiting: dict[int, list[int]] = {}
    for rank in me.demand.ranks:
        on_rank = [c for c in ahead if rank in c.demand.ranks]
        if on_rank and not _fits(me.demand, [c.demand for c in on_rank], capacity.get(rank, 0.0)):
            for claim in on_rank:
                waiting.setdefault(claim.job_id, []).append(rank)
    return {job_id: tuple(ranks) for job_id, ranks in sorted(waiting.items())}


def _fits(mine: Demand, theirs: Sequence[Demand], gpus: float) -> bool:
    if mine.gpus is None or gpus <= 0 or any(d.gpus is None for d in theirs):
        return False
    return mine.gpus + sum(d.gpus or 0.0 for d in theirs) <= gpus + 1e-9


def live_claims(
    jobs: Sequence[tuple[js.JobState, float | None]], admitted: Mapping[str, Any], now: float
) -> list[Claim]:
    """Every job that holds nodes or waits for them (pure), from the job records and the index's admissions.

    A job running from before the queue existed (no admission) holds its nodes whole.
    """
    claims: list[Claim] = []
    for state, written_at in jobs:
        if state.status.is_terminal:
            continue
        idle = now - (now if written_at is None else written_at)
        entry = admitted.get(str(state.job_id))
        queued = state.info.get(QUEUE_INFO_KEY)
        started = state.status in (JobStatus.SETTING_UP, JobStatus.RUNNING)
        if entry is not None:
            if started or idle < ADMITTED_STALE_S:
                claims.append(Claim(state.job_id, Demand.from_dict(entry), admitted=True))
        elif started:
            ranks = sorted(int(n["rank"]) for n in state.nodes)
            if state.status is JobStatus.RUNNING:
                ranks = ranks[: state.num_nodes]
            claims.append(Claim(state.job_id, Demand(tuple(ranks)), admitted=True))
        elif isinstance(queued, dict) and idle < WAITING_STALE_S:
            claims.append(Claim(state.job_id, Demand.from_dict(queued), admitted=False))
    return claims


def describe_wait(blockers: Mapping[int, tuple[int, ...]], statuses: Mapping[int, str]) -> str:
    """'waiting for job 1 to free nodes 0-1 (RUNNING)' (pure)."""
    parts = [
        f"job {job_id} to free node{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} "
        f"({statuses.get(job_id, '?')})"
        for job_id, ranks in blockers.items()
    ]
    return "waiting for " + "; ".join(parts)


def _ranks(ranks: Sequence[int]) -> str:
    ordered = sorted(set(ranks))
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


# ---- the store -----------------------------------------------------------------------------------------


def enqueue(states: js.JobStates, job_id: int, demand: Demand) -> None:
    """Put the job in the queue with its demand (a retried provision keeps its place)."""

    def queued(state: js.JobState) -> js.JobState:
        current = state.info.get(QUEUE_INFO_KEY)
        if isinstance(current, dict) and current.get("ranks") == list(demand.ranks):
            raise js.Unchanged
        entry = {**demand.to_dict(), "beat": 0}
        return dataclasses.replace(state, info={**state.info, QUEUE_INFO_KEY: entry})

    states.update(job_id, queued)


def try_admit(
    states: js.JobStates, job_id: int, capacity: Mapping[int, float]
) -> tuple[bool, dict[int, tuple[int, ...]], dict[int, js.JobState]]:
    """One look: admit the job when nothing ahead of it needs its nodes (compare-and-swap on the index).

    Returns (admitted, the jobs it waits for with their shared ranks, every live job's state by id).
    """
    for _ in range(200):
        index = states.index()
        data: dict[str, Any] = dict(index.data) if index else {"next": 1, "keys": {}}
        if data.get("closing"):
            raise ClusterError(f"job {job_id}: the cluster is being torn down; it will not run there")
        admitted: dict[str, Any] = dict(data.get(ADMITTED_KEY) or {})
        if str(job_id) in admitted:
            return True, {}, {}
        jobs = states.stamped()
        by_id = {state.job_id: state for state, _ in jobs}
        mine = by_id.get(job_id)
        if mine is None:
            raise ClusterError(f"job {job_id} has no record in the cluster's job state")
        if mine.status.is_terminal:
            raise _never_started(mine)
        claims = live_claims(jobs, admitted, states.store.now())
        queued = mine.info.get(QUEUE_INFO_KEY) or {}
        me = Claim(job_id, Demand.from_dict(queued), admitted=False)
        blockers = conflicts(me, claims, capacity)
        if blockers:
            return False, blockers, by_id
        # Admissions of jobs that ended (or were released as stale) go with this write.
        live = {str(c.job_id) for c in claims if c.admitted}
        kept = {k: v for k, v in admitted.items() if k in live}
        new = data | {ADMITTED_KEY: {**kept, str(job_id): me.demand.to_dict()}}
        if states.store.put(js.INDEX, new, index.version if index else None) is not None:
            return True, {}, by_id
        time.sleep(0.01)  # a job joined, was admitted or a teardown decided meanwhile: look again
    raise ClusterError(f"job {job_id}: the job index kept changing under 200 attempts to admit it")


def ahead_of_new_job(
    states: js.JobStates, demand: Demand, capacity: Mapping[int, float]
) -> dict[int, tuple[int, ...]]:
    """The jobs a job submitted now would wait for (empty: it would start at once). A look, no write
    but the store's clock: the decision itself is try_admit's."""
    index = states.index()
    admitted = dict((index.data if index else {}).get(ADMITTED_KEY) or {})
    jobs = states.stamped()
    newest = max((state.job_id for state, _ in jobs), default=0) + 1
    claims = live_claims(jobs, admitted, states.store.now())
    return conflicts(Claim(newest, demand, admitted=False), claims, capacity)


def _never_started(state: js.JobState) -> JobFailed:
    return JobFailed(
        f"job {state.job_id} was {state.status.value.lower()} while it waited in the queue (PENDING): "
        "it never started",
        status=state.status.value,
    )


def _renew(state: js.JobState, reason: str | None) -> js.JobState:
    """The waiter's sign of life: the queue entry's counter moves (and the record's write time with it),
    with what it waits for (None: admitted), which the launcher's progress and `queue` show."""
    entry = dict(state.info.get(QUEUE_INFO_KEY) or {})
    if state.status.is_terminal or not entry:
        raise js.Unchanged
    entry["beat"] = int(entry.get("beat") or 0) + 1
    entry.pop("reason", None)
    entry.update({"reason": reason} if reason else {"admitted": True})
    return dataclasses.replace(state, info={**state.info, QUEUE_INFO_KEY: entry})


def wait_for_turn(
    states: js.JobStates,
    job_id: int,
    demand: Demand,
    capacity: Mapping[int, float],
    say: Callable[[str], None],
    refresh: Callable[[js.JobState], object] = lambda state: None,
    poll_s: float = POLL_S,
) -> None:
    """Queue the job and return once it may start (admitted); raises JobFailed when it is cancelled first.

    `refresh(state)` is called on each running job it waits for: a job whose launcher is gone has no one
    to write its end, and one look at its nodes (gang.cluster_jobs) does. `say` hears each new reason.
    """
    enqueue(states, job_id, demand)
    said = ""
    while True:
        admitted, blockers, by_id = try_admit(states, job_id, capacity)
        if admitted:
            state, _ = states.update(job_id, functools.partial(_renew, reason=None))
            if state.status.is_terminal:  # cancelled as it was admitted: its starts would skip it anyway
                raise _never_started(state)
            if said:
                say(f"job {job_id} starts: the nodes it needs are free")
            return
        statuses = {j: by_id[j].status.value if j in by_id else "?" for j in blockers}
        reason = describe_wait(blockers, statuses)
        states.update(job_id, functools.partial(_renew, reason=reason))  # first: what `say` tells is recorded
        if reason != said:
            say(f"job {job_id} is PENDING, {reason}")
            said = reason
        for blocker in blockers:
            held = by_id.get(blocker)
            if held is not None and held.status in (JobStatus.SETTING_UP, JobStatus.RUNNING):
                refresh(held)
        time.sleep(poll_s)


def waiting_reason(state: js.JobState) -> str | None:
    """What a pending job waits for, as its waiter last wrote it (None: not waiting in the queue)."""
    entry = state.info.get(QUEUE_INFO_KEY)
    if state.status not in (JobStatus.INIT, JobStatus.PENDING) or not isinstance(entry, dict):
        return None
    reason = entry.get("reason")
    return str(reason) if reason else None


def is_admitted(state: js.JobState) -> bool:
    """Has the job's waiter seen it admitted (its queue entry says so)?"""
    entry = state.info.get(QUEUE_INFO_KEY)
    return isinstance(entry, dict) and bool(entry.get("admitted"))
