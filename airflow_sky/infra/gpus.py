"""GPUs of a machine, as `nvidia-smi` reports them, matched against a task's `accelerators`.

One detection for every infra that runs on machines it did not create: the hosts of an ssh pool, and this
machine for the local infra's nodes (each gets its share). Pure functions over nvidia-smi's CSV output.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Mapping, Sequence

from airflow_sky.errors import ClusterError

# `count` is the machine's number of GPUs, repeated on every line; the names tell the model.
QUERY_COMMAND = "nvidia-smi --query-gpu=name,count --format=csv,noheader 2>/dev/null"
_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO", "RTX"}


@dataclasses.dataclass(frozen=True)
class Gpus:
    """What a machine has: GPU model names as nvidia-smi prints them, one per device."""

    names: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.names)

    def describe(self) -> str:
        if not self.names:
            return "no GPUs"
        by_name: dict[str, int] = {}
        for name in self.names:
            by_name[name] = by_name.get(name, 0) + 1
        return ", ".join(f"{count}x {name}" for name, count in by_name.items())


def parse_nvidia_smi(output: str) -> Gpus:
    """`NVIDIA L4, 4` lines (csv, noheader) -> Gpus; empty output (no nvidia-smi, no driver) -> no GPUs."""
    names = [row[0].strip() for row in csv.reader(io.StringIO(output)) if row and row[0].strip()]
    return Gpus(tuple(names))


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[\s_/-]+", name.upper()) if t]


def model_matches(requested: str, reported: str) -> bool:
    """Does a device nvidia-smi calls `reported` (`NVIDIA A100-SXM4-80GB`) satisfy `requested` (`A100-80GB`)?

    Every word of the requested name must appear among the reported name's words (vendor words ignored),
    so `A100` takes any A100 and `A100-80GB` only the 80 GB ones; `L4` does not match `L40S`.
    """
    wanted = [t for t in _tokens(requested) if t not in _VENDOR_WORDS]
    have = set(_tokens(reported))
    return bool(wanted) and all(t in have for t in wanted)


def matching_count(gpus: Gpus, requested: str) -> int:
    return sum(1 for name in gpus.names if model_matches(requested, name))


def satisfies(gpus: Gpus, accelerators: Mapping[str, float] | None) -> str | None:
    """The first accelerator candidate `gpus` satisfies (name), None if none does. No request: ''."""
    if not accelerators:
        return ""
    for name, count in accelerators.items():
        if matching_count(gpus, name) >= math.ceil(float(count)):
            return name
    return None


def share(total: int, num_nodes: int, per_node: int) -> list[list[int]]:
    """Device indices for each of `num_nodes` nodes taking `per_node` GPUs each out of `total`.

    A clear error when the machine has too few; nodes never share a device.
    """
    if per_node <= 0:
        return [[] for _ in range(num_nodes)]
    needed = per_node * num_nodes
    if needed > total:
        raise ClusterError(
            f"accelerators: {num_nodes} node(s) x {per_node} GPU(s) = {needed} GPUs asked for, "
            f"but this machine has {total}; lower num_nodes or the accelerator count"
        )
    return [list(range(i * per_node, (i + 1) * per_node)) for i in range(num_nodes)]


def requested_summary(accelerators: Mapping[str, float] | None) -> str:
    if not accelerators:
        return "no GPUs"
    return " or ".join(f"{name}:{_count(count)}" for name, count in accelerators.items())


def _count(count: float) -> str:
    return str(int(count)) if float(count).is_integer() else str(count)


def describe_hosts(hosts: Sequence[tuple[str, Gpus]]) -> str:
    return "; ".join(f"{label}: {gpus.describe()}" for label, gpus in hosts)
