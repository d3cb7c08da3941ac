"""The one authoritative record of a job: status, generations and their nodes, the relaunch claim,
the phase verdicts and who watches each phase. Kept in the infra's StateStore, changed only by
compare-and-swap.

Every change is a pure function `JobState -> JobState` (below, unit-tested as a table); `JobStates.update`
applies one against the store, re-reading and re-applying when another writer won the race. So whatever
each follower believes about node health, the first transition to a new generation wins and every other
follower reads the winner's decision.

    status      INIT -> PENDING -> SETTING_UP -> RUNNING -> SUCCEEDED | FAILED | FAILED_SETUP | CANCELLED
    generation  0, 1, ... : a relaunch (recovery or restart) moves the run to generation + 1
    relaunch    the claim on generation + 1: decision, leader (None: not led yet), the leader's fencing
                token and its renewal counter
    fences      the last fencing token issued: each taking of a relaunch's lead gets the next one
    phases      per "<phase>-<generation>": exit codes seen, verdict (SUCCEEDED / FAILED + cause), killed
    watchers    per "<phase>-<generation>": the lease of the one process that probes every rank (its holder
                and a renewal counter, judged by the others on their own clocks: gang.watch_lease)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.gang.job import JobStatus, Phase
from airflow_sky.gang.recovery import Action, Decision
from airflow_sky.gang.state_record import (
    CANCELLED_RANK,
    LEADER_LEASE_S,
    NOTICES_INFO_KEY,
    WATCH_LEASE_S,
    JobState,
    PhaseState,
    Relaunch,
    phase_key,
)
from airflow_sky.infra.state_store import StateStore, Versioned

__all__ = [
    "CANCELLED_RANK",
    "LEADER_LEASE_S",
    "NOTICES_INFO_KEY",
    "WATCH_LEASE_S",
    "JobState",
    "PhaseState",
    "Relaunch",
    "phase_key",
]


class Unchanged(Exception):
    """A transition that does not apply to the state as read (nothing to write)."""


# ---- transitions (pure) ------------------------------------------------------------------------------


def _stamped(state: JobState, status: JobStatus, now: float) -> JobState:
    info = dict(state.info)
    if status in (JobStatus.SETTING_UP, JobStatus.RUNNING):
        info.setdefault("started_at", now)
    if status.is_terminal:
        info.setdefault("ended_at", now)
    return dataclasses.replace(state, status=status, info=info)


def set_status(state: JobState, status: JobStatus, now: float) -> JobState:
    """Move the job forward; a terminal job stays as it ended, and a job never moves back."""
    order = list(JobStatus)
    if state.status.is_terminal or (
        not status.is_terminal and order.index(status) <= order.index(state.status)
    ):
        raise Unchanged
    return _stamped(state, status, now)


def record_exits(state: JobState, phase: Phase, generation: int, exit_codes: dict[int, int]) -> JobState:
    """Merge exit codes the watcher read (a code once recorded is kept)."""
    key = phase_key(phase, generation)
    current = state.phases.get(key, PhaseState())
    merged = {**exit_codes, **current.exit_codes}
    if merged == current.exit_codes:
        raise Unchanged
    return dataclasses.replace(
        state, phases={**state.phases, key: dataclasses.replace(current, exit_codes=merged)}
    )


def phase_succeeded(state: JobState, phase: Phase, generation: int, ranks: list[int], now: float) -> JobState:
    """Every rank of the phase exited 0: the verdict; a succeeded run is a succeeded job."""
    key = phase_key(phase, generation)
    current = state.phases.get(key, PhaseState())
    if current.verdict is not None or (generation != state.generation and phase == "run"):
        raise Unchanged
    if any(current.exit_codes.get(r) != 0 for r in ranks):
        raise Unchanged
    state = dataclasses.replace(
        state, phases={**state.phases, key: dataclasses.replace(current, verdict="SUCCEEDED")}
    )
    if phase == "run" and not state.status.is_terminal:
        state = _stamped(state, JobStatus.SUCCEEDED, now)
    return state


def phase_failed(
    state: JobState, phase: Phase, generation: int, rank: int, exit_code: int, reason: str, now: float
) -> JobState:
    """The first failure of the phase is its cause (later ones are the kills that followed); the job fails."""
    key = phase_key(phase, generation)
    current = state.phases.get(key, PhaseState())
    if current.verdict is not None:
        raise Unchanged
    failed = dataclasses.replace(
        current, verdict="FAILED", failed_rank=rank, failed_exit_code=exit_code, reason=reason
    )
    state = dataclasses.replace(state, phases={**state.phases, key: failed}, relaunch=None)
    if not state.status.is_terminal:
        state = _stamped(state, JobStatus.FAILED_SETUP if phase == "setup" else JobStatus.FAILED, now)
    return state


def phase_killed(state: JobState, phase: Phase, generation: int) -> JobState:
    key = phase_key(phase, generation)
    current = state.phases.get(key, PhaseState())
    if current.killed or current.verdict != "FAILED":
        raise Unchanged
    return dataclasses.replace(state, phases={**state.phases, key: dataclasses.replace(current, killed=True)})


def cancel(state: JobState, reason: str, now: float) -> JobState:
    """Cancelled: every phase of the current generation fails (so its watcher kills every rank), never relaunched."""
    if state.cancelled or state.status.is_terminal:
        raise Unchanged
    phases = dict(state.phases)
    for key in {
        phase_key("setup", 0),
        phase_key("setup", state.generation),
        phase_key("run", state.generation),
    }:
        current = phases.get(key, PhaseState())
        if current.verdict is None:
            phases[key] = dataclasses.replace(
                current, verdict="FAILED", failed_rank=CANCELLED_RANK, failed_exit_code=143, reason=reason
            )
    state = dataclasses.replace(state, phases=phases, relaunch=None, cancelled=True)
    return _stamped(state, JobStatus.CANCELLED, now)


def claim_relaunch(state: JobState, generation: int, decision: Decision, now: float) -> JobState:
    """A fault in run generation `generation` that the policy relaunches: claim generation + 1 (unled).

    Whoever's transition lands first decides RECOVER or RESTART; a fault seen in an older generation, or
    once a claim or verdict exists, changes nothing.
    """
    if decision.action is Action.FAIL:
        raise ValueError("a FAIL decision is a phase failure, not a relaunch")
    run = state.phase("run", generation)
    if (
        state.status.is_terminal
        or state.generation != generation
        or state.relaunch is not None
        or run.verdict
    ):
        raise Unchanged
    claim = Relaunch(target=generation + 1, action=decision.action, reason=decision.reason, claimed_at=now)
    return dataclasses.replace(state, relaunch=claim)


def lead_relaunch(state: JobState, leader: str, stale: tuple[str | None, int, int] | None = None) -> JobState:
    """Take the relaunch's lead with a new fencing token: when none leads, when `leader` leads already (a
    retried task: its earlier try, were it still alive, is fenced out by the new token), or when `stale` is
    the very lease the caller watched stand still for LEADER_LEASE_S on its own monotonic clock.

    Every step the leader then takes carries the token (`fenced`), and the record refuses it once a newer
    leader took over: two leaders never both change the cluster past a takeover.
    """
    claim = state.relaunch
    if claim is None or state.status.is_terminal:
        raise Unchanged
    if claim.leader not in (None, leader) and claim.lease != stale:
        raise Unchanged  # another leader, alive as far as the caller saw (or it renewed since)
    fence = state.fences + 1
    return dataclasses.replace(
        state, fences=fence, relaunch=dataclasses.replace(claim, leader=leader, fence=fence, beat=0)
    )


def fenced(state: JobState, fence: int) -> JobState:
    """A heartbeat, or the check before a step that changes the cluster: only the holder of the newest
    token passes (and renews its lease: the counter moves); anyone else is refused (Unchanged)."""
    claim = state.relaunch
    if claim is None or claim.fence != fence or state.status.is_terminal:
        raise Unchanged  # the lead moved on (or the job ended): the caller stops leading
    return dataclasses.replace(state, relaunch=dataclasses.replace(claim, beat=claim.beat + 1))


def noted_notices(state: JobState, generation: int, preempt_at: dict[int, float], now: float) -> JobState:
    """Record the preemption notices the infra reports for generation `generation`'s ranks (each once)."""
    notices = list(state.info.get(NOTICES_INFO_KEY) or [])
    known = {(n.get("generation"), n.get("rank")) for n in notices}
    new = [
        {"generation": generation, "rank": rank, "preempt_at": at, "seen_at": now}
        for rank, at in sorted(preempt_at.items())
        if (generation, rank) not in known
    ]
    if not new:
        raise Unchanged
    return dataclasses.replace(state, info={**state.info, NOTICES_INFO_KEY: notices + new})


def relaunched(
    state: JobState,
    fence: int,
    nodes: list[dict[str, Any]],
    replaced_ranks: list[int],
    now: float,
    replaced_at: dict[int, float] | None = None,
) -> JobState:
    """The leader holding token `fence` started generation + 1 on every rank: it is the job's generation now."""
    claim = state.relaunch
    if claim is None or claim.fence != fence or state.status.is_terminal:
        raise Unchanged
    recovered = claim.action is Action.RECOVER or bool(replaced_ranks)
    setup_generations = dict(state.setup_generations)
    for rank in replaced_ranks:
        setup_generations[rank] = claim.target
    entry: dict[str, Any] = {
        "generation": claim.target,
        "action": (Action.RECOVER if recovered else claim.action).value,
        "reason": claim.reason,
        "replaced_ranks": replaced_ranks,
        "claimed_at": claim.claimed_at,  # when the fault was seen: a recovery's cost counts from it
        "at": now,
    }
    if replaced_at:  # when each replacement node was up (before its predecessor's deadline, with a notice)
        entry["replaced_at"] = {str(rank): at for rank, at in sorted(replaced_at.items())}
    return dataclasses.replace(
        state,
        generation=claim.target,
        nodes=tuple(nodes),
        setup_generations=setup_generations,
        recoveries=state.recoveries + (1 if recovered else 0),
        restarts=state.restarts + (0 if recovered else 1),
        relaunch=None,
        history=(*state.history, entry),
        status=JobStatus.RUNNING,
    )


def take_watch(state: JobState, key: str, owner: str, stale: tuple[str, int] | None = None) -> JobState:
    """Hold (or renew: the counter moves) the watch on phase `key`: when nobody holds it, `owner` does, or
    `stale` is the very lease (holder, renewals) the caller watched stand still for WATCH_LEASE_S on its own
    clock. How often a holder renews is its own business (gang.watch_lease.WatchHold)."""
    current = state.watchers.get(key)
    if current is not None and current[0] not in ("", owner) and current != stale:
        raise Unchanged
    renewals = current[1] + 1 if current is not None else 1
    return dataclasses.replace(state, watchers={**state.watchers, key: (owner, renewals)})


def drop_watch(state: JobState, key: str, owner: str) -> JobState:
    if state.watchers.get(key, ("", 0))[0] != owner:
        raise Unchanged
    watchers = dict(state.watchers)
    del watchers[key]
    return dataclasses.replace(state, watchers=watchers)


# ---- the store -----------------------------------------------------------------------------------------

INDEX = "jobs-index"
# A job's info key: the launch had neither setup nor run (it provisioned only); not a job of the queue.
RUNS_NOTHING_KEY = "runs_nothing"
# A teardown's closing mark older than this (on the store's clock) is one whose teardown died midway.
CLOSING_STALE_S = 900.0


class ClusterClosing(ClusterError):
    """A teardown is ending the cluster (no job was left to keep it): provision again once it is gone."""

    def __init__(self, by_job: int, age_s: float, message: str | None = None) -> None:
        super().__init__(
            message
            or f"the cluster is being torn down by the teardown of job {by_job} (for {age_s:.0f}s): it is "
            "provisioned again once it is gone"
        )
        self.by_job = by_job


class JobStates:
    """The job states of one cluster in its infra's StateStore."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    @staticmethod
    def key(job_id: int) -> str:
        """The store key of job `job_id`'s record."""
        return f"jobs/{int(job_id)}"

    def get(self, job_id: int) -> JobState | None:
        record = self.store.get(self.key(job_id))
        return JobState.from_dict(record.data) if record else None

    def require(self, job_id: int) -> JobState:
        state = self.get(job_id)
        if state is None:
            raise ClusterError(f"job {job_id} has no record in the cluster's job state")
        return state

    def all(self) -> list[JobState]:
        """Every job, oldest first."""
        ids = sorted(int(key.rsplit("/", 1)[1]) for key in self.store.keys("jobs"))
        return [s for s in (self.get(i) for i in ids) if s is not None]

    def update(self, job_id: int, change: Callable[[JobState], JobState]) -> tuple[JobState, bool]:
        """Apply `change` by compare-and-swap; returns (the state now, whether this call changed it)."""
        key = self.key(job_id)
        for _ in range(200):
            record = self.store.get(key)
            if record is None:
                raise ClusterError(f"job {job_id} has no record in the cluster's job state")
            state = JobState.from_dict(record.data)
            try:
                new = change(state)
            except Unchanged:
                return state, False
            if self.store.put(key, new.to_dict(), record.version) is not None:
                return new, True
            time.sleep(0.005)
        raise ClusterError(f"job {job_id}: the job state kept changing under 200 attempts to update it")

    def index(self) -> Versioned | None:
        """The cluster's job index: ids by submit key, and the cluster's teardown marks (gang.cluster_down)."""
        return self.store.get(INDEX)

    def stamped(self) -> list[tuple[JobState, float | None]]:
        """Every job, oldest first, with when its record was last written (on the store's clock)."""
        ids = sorted(int(key.rsplit("/", 1)[1]) for key in self.store.keys("jobs"))
        records = [(i, self.store.get(self.key(i))) for i in ids]
        return [(JobState.from_dict(r.data), r.written_at) for _, r in records if r is not None]

    def allocate(self, submit_key: str, info: dict[str, Any]) -> tuple[JobState, bool]:
        """The job for `submit_key` (a retried provision gets the same one back), created when new.

        Every allocation writes the index, the record a teardown decides on by compare-and-swap: a job that
        joins the cluster while a teardown looks makes that teardown look again. Raises ClusterClosing while
        a teardown is ending the cluster.
        """
        for _ in range(200):
            index = self.store.get(INDEX)
            data: dict[str, Any] = dict(index.data) if index else {"next": 1, "keys": {}}
            closing = data.get("closing")
            if closing:
                age = self.store.now() - float(closing.get("at") or 0.0)
                if age < CLOSING_STALE_S:
                    raise ClusterClosing(int(closing.get("by") or 0), age)
                data.pop("closing")  # its teardown died before the cluster went: the cluster is usable again
            keys: dict[str, int] = data["keys"]
            job_id = int(keys.get(submit_key, data["next"]))
            new_index = {
                **data,
                "next": max(int(data["next"]), job_id + 1),
                "keys": {**keys, submit_key: job_id},
            }
            if self.store.put(INDEX, new_index, index.version if index else None) is not None:
                existing = self.get(job_id)
                if existing is not None:
                    return existing, False
                return self._create(job_id, info), True
        raise ClusterError("could not allocate a job id: the job index kept changing")

    def _create(self, job_id: int, info: dict[str, Any]) -> JobState:
        state = JobState(job_id=job_id, info=dict(info))
        written = self.store.put(self.key(job_id), state.to_dict(), None)
        if written is None:
            return self.require(job_id)
        return state
