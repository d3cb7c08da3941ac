"""The rules of handing out pool hosts to a cluster (pure): which GPUs a request needs, how many of a host's
GPUs a node gets, what to say when the pool has no host for a rank, and a cluster's membership record."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from airflow_sky.infra import gpus as gpu_rules
from airflow_sky.infra.base import ProvisionRequest


def accelerators_of(request: ProvisionRequest) -> dict[str, float] | None:
    """The accelerators any of the request's candidate resources asks for (the first count of each)."""
    resources = request.resources
    if resources is None:
        return None
    merged: dict[str, float] = {}
    for candidate in resources.candidates():
        for name, count in (candidate.accelerators or {}).items():
            merged.setdefault(name, float(count))
    return merged or None


def gpu_count(gpus: gpu_rules.Gpus, accelerators: dict[str, float] | None) -> int:
    chosen = gpu_rules.satisfies(gpus, accelerators)
    return gpu_rules.matching_count(gpus, chosen) if chosen else gpus.count


def no_host_message(
    pool_name: str,
    cluster: str,
    pending: Sequence[int],
    num_nodes: int,
    held: list[str],
    unsuitable: list[tuple[str, gpu_rules.Gpus]],
    down: list[str],
    accelerators: dict[str, float] | None,
    replacing: str | None,
) -> str:
    """Why ranks `pending` found no host: the hosts held by others, without the GPUs, or down."""
    if replacing is not None:
        head = (
            f"ssh/{pool_name}: host {replacing} (rank {pending[0]} of cluster {cluster!r}) is lost "
            "and the pool has no free host to replace it"
        )
    else:
        head = (
            f"ssh/{pool_name}: not enough free hosts for cluster {cluster!r} "
            f"({len(pending)} more needed of {num_nodes})"
        )
    parts = [head]
    if unsuitable and all(gpu_rules.satisfies(g, accelerators) is None for _, g in unsuitable) and not held:
        parts.append(
            f"no host has {gpu_rules.requested_summary(accelerators)} ({gpu_rules.describe_hosts(unsuitable)})"
        )
    elif unsuitable:
        parts.append(
            f"without {gpu_rules.requested_summary(accelerators)}: {gpu_rules.describe_hosts(unsuitable)}"
        )
    if held:
        parts.append("held: " + "; ".join(held))
    if down:
        parts.append("cannot be used: " + "; ".join(down))
    return ". ".join(parts)


@dataclasses.dataclass(frozen=True)
class Member:
    """One entry of a cluster's membership record."""

    rank: int
    host: str  # PoolHost.label
    token: str
    gpus: int
    ip: str  # the internal IP the other nodes reach it at (SKYPILOT_NODE_IPS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def members_of(data: dict[str, Any] | None) -> dict[int, Member]:
    if not data:
        return {}
    return {
        int(m["rank"]): Member(
            int(m["rank"]), str(m["host"]), str(m["token"]), int(m.get("gpus") or 0), str(m["ip"])
        )
        for m in data.get("nodes", [])
    }
