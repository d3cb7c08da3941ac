"""The job state's record: the job, its phases' verdicts, its relaunch claim and its watch leases, as
frozen dataclasses with their dict form (only gang.state's pure transitions make a new one); and a job's
handle moved to the generation and nodes the record has."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_sky.gang.job import JobHandle, JobStatus, Phase, nodes_of
from airflow_sky.gang.recovery import Action
from airflow_sky.infra.base import Node

WATCH_LEASE_S = 15.0  # a watcher whose renewals stood still this long (the observer's clock) is replaced
# A relaunch leader whose renewal counter has not moved for this long, on the observing follower's own
# monotonic clock, is taken over (no time written by one machine is compared with another's clock).
LEADER_LEASE_S = 45.0
CANCELLED_RANK = -1  # the "failing rank" of a cancelled phase
NOTICES_INFO_KEY = "notices"  # in a job's info: the preemption notices its nodes got (the infra's word)


@dataclasses.dataclass(frozen=True)
class PhaseState:
    """One phase of one generation: what the watcher saw, and the verdict once there is one."""

    exit_codes: dict[int, int] = dataclasses.field(default_factory=dict)
    verdict: str | None = None  # "SUCCEEDED" | "FAILED"
    failed_rank: int | None = None
    failed_exit_code: int | None = None
    reason: str | None = None
    killed: bool = False  # every rank of a failed phase was stopped

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_codes": {str(r): c for r, c in sorted(self.exit_codes.items())},
            "verdict": self.verdict,
            "failed_rank": self.failed_rank,
            "failed_exit_code": self.failed_exit_code,
            "reason": self.reason,
            "killed": self.killed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseState:
        return cls(
            exit_codes={int(r): int(c) for r, c in (data.get("exit_codes") or {}).items()},
            verdict=data.get("verdict"),
            failed_rank=data.get("failed_rank"),
            failed_exit_code=data.get("failed_exit_code"),
            reason=data.get("reason"),
            killed=bool(data.get("killed")),
        )


@dataclasses.dataclass(frozen=True)
class Relaunch:
    """The claim on generation `target`: what to do, and who does it."""

    target: int
    action: Action
    reason: str
    leader: str | None = None
    fence: int = 0  # the leader's fencing token (JobState.fences when it took the lead); 0: not led
    beat: int = 0  # the leader's renewal counter: bumped by each heartbeat and each fenced step
    claimed_at: float = 0.0  # for people reading the record; no lease is judged from it

    @property
    def lease(self) -> tuple[str | None, int, int]:
        """What a follower watches for change: while it stays the same, the leader shows no life."""
        return (self.leader, self.fence, self.beat)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"action": self.action.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Relaunch:
        return cls(
            target=int(data["target"]),
            action=Action(data["action"]),
            reason=str(data.get("reason", "")),
            leader=data.get("leader"),
            fence=int(data.get("fence") or 0),
            beat=int(data.get("beat") or 0),
            claimed_at=float(data.get("claimed_at") or 0.0),
        )


@dataclasses.dataclass(frozen=True)
class JobState:
    job_id: int
    status: JobStatus = JobStatus.INIT
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # name, submitted_at, sky_task_id, ...
    generation: int = 0
    nodes: tuple[dict[str, Any], ...] = ()  # every node of the job (Node.to_dict()), this generation's
    setup_generations: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> its setup's
    recoveries: int = 0
    restarts: int = 0
    relaunch: Relaunch | None = None
    phases: dict[str, PhaseState] = dataclasses.field(default_factory=dict)
    watchers: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)  # key -> (owner, renewals)
    history: tuple[dict[str, Any], ...] = ()  # one entry per relaunch
    cancelled: bool = False
    fences: int = 0  # the last fencing token issued (monotonic over the job's life)

    # ---- reading -----------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return int(self.info.get("num_nodes") or len(self.nodes))

    @property
    def job_nodes(self) -> tuple[Node, ...]:
        """Every node of the job as of its current generation, typed (the record keeps their dicts)."""
        return nodes_of(self.nodes)

    def phase(self, phase: Phase, generation: int | None = None) -> PhaseState:
        return self.phases.get(
            phase_key(phase, self.generation if generation is None else generation), PhaseState()
        )

    def setup_generation(self, rank: int) -> int:
        return self.setup_generations.get(rank, 0)

    def watcher(self, key: str) -> str | None:
        """Who holds the watch on `key` (alive or not: see gang.watch_lease), or None."""
        owner = self.watchers.get(key, ("", 0))[0]
        return owner or None

    def to_record(self) -> dict[str, Any]:
        """The `airflow-sky queue` view: flat fields, as SkyPilot's job table has them."""
        record = dict(self.info)
        record.update(
            job_id=self.job_id,
            status=self.status.value,
            generation=self.generation,
            recoveries=self.recoveries,
            restarts=self.restarts,
        )
        run = self.phase("run")
        setup = self.phase("setup", 0)
        failed = run if run.verdict == "FAILED" else setup if setup.verdict == "FAILED" else None
        if failed is not None:
            record.update(failed_rank=failed.failed_rank, failed_exit_code=failed.failed_exit_code)
        if run.exit_codes:
            record["exit_codes"] = [run.exit_codes.get(r) for r in range(self.num_nodes)]
        return record

    # ---- serialization -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status.value,
            "info": self.info,
            "generation": self.generation,
            "nodes": list(self.nodes),
            "setup_generations": {str(r): g for r, g in self.setup_generations.items()},
            "recoveries": self.recoveries,
            "restarts": self.restarts,
            "relaunch": self.relaunch.to_dict() if self.relaunch else None,
            "phases": {k: v.to_dict() for k, v in self.phases.items()},
            "watchers": {k: list(v) for k, v in self.watchers.items()},
            "history": list(self.history),
            "cancelled": self.cancelled,
            "fences": self.fences,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobState:
        return cls(
            job_id=int(data["job_id"]),
            status=JobStatus(data.get("status", JobStatus.INIT)),
            info=dict(data.get("info") or {}),
            generation=int(data.get("generation", 0)),
            nodes=tuple(data.get("nodes") or ()),
            setup_generations={int(r): int(g) for r, g in (data.get("setup_generations") or {}).items()},
            recoveries=int(data.get("recoveries", 0)),
            restarts=int(data.get("restarts", 0)),
            relaunch=Relaunch.from_dict(data["relaunch"]) if data.get("relaunch") else None,
            phases={k: PhaseState.from_dict(v) for k, v in (data.get("phases") or {}).items()},
            watchers={k: (str(v[0]), int(v[1])) for k, v in (data.get("watchers") or {}).items()},
            history=tuple(data.get("history") or ()),
            cancelled=bool(data.get("cancelled")),
            fences=int(data.get("fences") or 0),
        )


def phase_key(phase: Phase, generation: int) -> str:
    return f"{phase}-{int(generation)}"


def job_nodes(handle: JobHandle, state: JobState | None) -> tuple[Node, ...]:
    """The job's nodes as of its current generation (the provisioned ones until a recovery replaced some)."""
    if state is not None and state.nodes:
        return state.job_nodes
    return handle.nodes


def current_handle(handle: JobHandle, state: JobState | None) -> JobHandle:
    """`handle` moved to the job's current generation and nodes."""
    if state is None:
        return handle
    return dataclasses.replace(handle, nodes=job_nodes(handle, state), generation=state.generation)
