"""The Cloud interface every infra implements, and the records it exchanges.

The cloud is the source of truth: membership and ranks are read back from the infra (instance tags, or the
local state dir), never from a file on an Airflow worker.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any


class NodeStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    UNREACHABLE = "UNREACHABLE"


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a cluster as the infra reports it. Rank 0 is the head."""

    rank: int
    internal_ip: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    instance_id: str
    status: NodeStatus = NodeStatus.RUNNING
    gpus: float = 0
    host_key: str | None = None  # "<type> <base64>", pinned at provision time

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["status"] = NodeStatus(values.get("status", NodeStatus.RUNNING.value))
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What SKYPILOT_CLUSTER_INFO carries."""

    cluster_name: str
    cloud: str
    region: str | None = None
    zone: str | None = None


@dataclasses.dataclass(frozen=True)
class ProvisionRequest:
    """What a cloud needs to bring up nodes: the task's resources, already validated."""

    cluster_name: str
    num_nodes: int
    resources: Any = None  # airflow_sky.spec.Resources; Any keeps this module free of spec imports


class Cloud(abc.ABC):
    """One infra. Implementations are registered in airflow_sky.clouds.registry."""

    name: str

    @abc.abstractmethod
    def provision(self, request: ProvisionRequest) -> list[Node]:
        """Bring the cluster to `num_nodes` running nodes (idempotent: count what exists, create the rest).

        On failure, everything this call created is removed before the error propagates.
        """

    @abc.abstractmethod
    def nodes(self, cluster_name: str) -> list[Node]:
        """The cluster's nodes ordered by rank, each with its current status. No side effects."""

    @abc.abstractmethod
    def replace(self, cluster_name: str, rank: int) -> Node:
        """Bring up a fresh node that takes over `rank` (a new address, an empty disk)."""

    @abc.abstractmethod
    def terminate(self, cluster_name: str) -> None:
        """Remove every node of the cluster; a no-op for an unknown cluster."""

    @abc.abstractmethod
    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        """Cloud, region and zone for SKYPILOT_CLUSTER_INFO."""

    @abc.abstractmethod
    def ssh_private_key(self, cluster_name: str) -> str:
        """Path of the private key that opens the cluster's nodes."""

    def clusters(self) -> Sequence[str]:
        """Names of the clusters this infra knows about."""
        return []
