"""The local infra's GPUs: each node's share of this machine's GPUs (device indices), and a launch that
this machine cannot serve at all, refused before anything starts (`check` says it too)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Collection

from airflow_sky.errors import ClusterError
from airflow_sky.infra.gpus import QUERY_COMMAND, Gpus, parse_nvidia_smi
from airflow_sky.infra.local import layout
from airflow_sky.task import Resources, gpus_per_node


def gpu_refusal(resources: Resources | None, num_nodes: int) -> str | None:
    """Why this machine can never give `num_nodes` nodes their `accelerators` (it has no GPU, or fewer
    than they ask for in all), None if it can. Other clusters' shares are not counted: they end."""
    per_node = gpus_per_node(resources)
    if not per_node:
        return None
    total = detect_local_gpus().count
    if total == 0:
        return _none_here(per_node)
    if per_node * num_nodes > total:
        return (
            f"accelerators: {num_nodes} node(s) x {per_node} GPU(s) = {per_node * num_nodes} GPUs asked for, "
            f"but this machine has {total}; lower num_nodes or the accelerator count"
        )
    return None


def _none_here(per_node: int) -> str:
    return (
        f"accelerators: each node asks for {per_node} GPU(s), but this machine has none "
        "(nvidia-smi finds no GPU); drop `accelerators` to run on the CPU"
    )


def _gpus_in_use(freeing: Collection[str]) -> set[int]:
    used: set[int] = set()
    base = layout.root()
    if not base.is_dir():
        return used
    for record_path in base.glob("*/instances/*/node.json"):
        record = layout.read_json(record_path)
        if (
            record
            and record.get("state") != layout.STATE_TERMINATED
            and record.get("instance_id") not in freeing
        ):
            used.update(int(d) for d in record.get("gpu_devices") or [])
    return used


def gpu_devices(per_node: int, still_to_start: int, freeing: Collection[str]) -> list[int] | None:
    """This node's share of the machine's GPUs (device indices), None on a machine without GPUs.

    The same detection as for ssh hosts (nvidia-smi); a share is counted, not matched by model: one 8-GPU
    box plays a cluster of `L4:4` nodes whatever its GPUs are. Called under the address lock, so two
    clusters provisioning at once never get the same device.
    """
    total = detect_local_gpus().count
    if total == 0:
        if per_node:
            raise ClusterError(_none_here(per_node))
        return None
    free = [d for d in range(total) if d not in _gpus_in_use(freeing)]
    if per_node * still_to_start > len(free):
        raise ClusterError(
            f"accelerators: {still_to_start} node(s) x {per_node} GPU(s) = {per_node * still_to_start} GPUs "
            f"asked for, but this machine has {total} ({len(free)} free, the rest held by other local "
            "nodes); lower num_nodes or the accelerator count"
        )
    return free[:per_node]


def detect_local_gpus() -> Gpus:
    """This machine's GPUs, by the detection the ssh infra uses on its hosts."""
    if shutil.which("nvidia-smi") is None:
        return Gpus()
    try:
        out = subprocess.run(["bash", "-c", QUERY_COMMAND], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return Gpus()
    return parse_nvidia_smi(out)
