"""What every task of a job needs to know about it, handed from provision to the others through XCom."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from airflow_sky.infra.base import Node

Phase = Literal["setup", "run"]
PHASES: tuple[Phase, ...] = ("setup", "run")

# The exit code recorded for a rank killed because another failed (SIGKILL), as SkyPilot reports it.
KILLED_EXIT_CODE = 137


def remote_job_id(job_id: int, phase: Phase) -> str:
    """The directory name of a job's phase record on each node, e.g. `3-run` (built here, nowhere else)."""
    return f"{int(job_id)}-{phase}"


def nodes_of(records: Iterable[Mapping[str, Any]]) -> tuple[Node, ...]:
    """Nodes from their dict form (Node.to_dict()), as the job state, XCom and trigger kwargs carry them."""
    return tuple(Node.from_dict(dict(record)) for record in records)


class JobStatus(enum.StrEnum):
    INIT = "INIT"
    PENDING = "PENDING"
    SETTING_UP = "SETTING_UP"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.FAILED_SETUP, JobStatus.CANCELLED)


@dataclasses.dataclass(frozen=True)
class JobHandle:
    """A job on a cluster: its id in the cluster's queue, SkyPilot's TASK_ID, and the nodes it uses.

    `nodes` are all of the cluster's nodes (setup runs on each); the run uses the first `num_run_nodes`.
    """

    cluster_name: str
    infra: str
    job_id: int
    sky_task_id: str
    nodes: tuple[Node, ...]
    num_run_nodes: int
    generation: int = 0
    sky_task_ids: tuple[str, ...] = ()  # in a pipeline: every task's SKYPILOT_TASK_ID (SKYPILOT_TASK_IDS)
    # A git workdir's commit, pinned once for the job: every node, and a recovery's replacement, checks it out.
    git_commit: str | None = None
    # The cluster's container image (`image_id: docker:`), pinned when the job was registered: the task's,
    # or, for a task that names none, the one an earlier job on the cluster runs in (SkyPilot: every job on
    # a kept cluster runs in its container).
    container_image: str | None = None

    @property
    def run_nodes(self) -> tuple[Node, ...]:
        return self.nodes[: self.num_run_nodes]

    def phase_nodes(self, phase: Phase) -> tuple[Node, ...]:
        return self.nodes if phase == "setup" else self.run_nodes

    def remote_job_id(self, phase: Phase) -> str:
        """The job record's directory name on each node, e.g. `3-run`."""
        return remote_job_id(self.job_id, phase)

    def node(self, rank: int) -> Node:
        return next(n for n in self.nodes if n.rank == rank)

    def to_dict(self, nodes: bool = True) -> dict[str, Any]:
        """As a dict; without `nodes`, only what names the job (the job state holds its nodes)."""
        data: dict[str, Any] = {
            "cluster_name": self.cluster_name,
            "infra": self.infra,
            "job_id": self.job_id,
            "sky_task_id": self.sky_task_id,
            "num_run_nodes": self.num_run_nodes,
            "generation": self.generation,
        }
        if self.sky_task_ids:
            data["sky_task_ids"] = list(self.sky_task_ids)
        if self.git_commit is not None:
            data["git_commit"] = self.git_commit
        if self.container_image is not None:
            data["container_image"] = self.container_image
        if nodes:
            data["nodes"] = [n.to_dict() for n in self.nodes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobHandle:
        return cls(
            cluster_name=data["cluster_name"],
            infra=data["infra"],
            job_id=int(data["job_id"]),
            sky_task_id=data["sky_task_id"],
            nodes=nodes_of(data.get("nodes") or ()),
            num_run_nodes=int(data["num_run_nodes"]),
            generation=int(data.get("generation", 0)),
            sky_task_ids=tuple(data.get("sky_task_ids") or ()),
            git_commit=data.get("git_commit"),
            container_image=data.get("container_image"),
        )


_UNSAFE = re.compile(r"[^a-z0-9-]+")


def sanitize_cluster_name(name: str, max_len: int = 40) -> str:
    """A cluster name that is a valid hostname label and directory name (lowercase, digits, '-')."""
    cleaned = _UNSAFE.sub("-", name.lower()).strip("-")
    cleaned = cleaned[:max_len].rstrip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"sky-{cleaned}".rstrip("-")
    return cleaned
