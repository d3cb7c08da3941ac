"""How a task's `disk_tier`, `labels` and `network_tier: best` become parts of a GCE VM (pure).

Disk tiers map to disk types as SkyPilot maps them (`sky/clouds/gcp.py::_get_disk_type`): low pd-standard,
medium pd-balanced, high pd-ssd, ultra pd-extreme (20,000 provisioned IOPS), `best` the highest the type
takes; families without pd-extreme (n1, a2, g2, n2 under 64 vCPUs) get pd-ssd for ultra, a3 gets
hyperdisk-balanced; a3 and g2 have no pd-standard (pd-balanced for low); a3-ultragpu, a4 and n4 take only
hyperdisk-balanced. Unset is medium.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.gcp.fabric import GPUDIRECT_RDMA, Fabric, best_tier_refusal, fabric_of

PD_EXTREME_IOPS = 20000  # SkyPilot's provisioned IOPS for an ultra pd-extreme disk
_TIERS = ("low", "medium", "high", "ultra")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
MAX_LABELS = 64  # GCE's limit per resource
RESERVED_LABEL_PREFIX = "airflow-sky"


def disk_type(machine_type: str, tier: str | None) -> str:
    """The boot disk's type for `disk_tier` on this machine type."""
    types = {"low": "pd-standard", "medium": "pd-balanced", "high": "pd-ssd", "ultra": "pd-extreme"}
    series = machine_type.split("-", 1)[0].lower()
    if series in ("n1", "a2", "g2") or (series == "n2" and _vcpus(machine_type) < 64):
        types["ultra"] = types["high"]
    if series in ("a3", "g2"):
        types["low"] = types["medium"]
    if series == "a3":
        types["ultra"] = "hyperdisk-balanced"
    if machine_type.startswith("a3-ultragpu") or series in ("a4", "n4"):
        types = dict.fromkeys(_TIERS, "hyperdisk-balanced")
    return types[_tier(tier)]


def disk_iops(machine_type: str, tier: str | None) -> int | None:
    """Provisioned IOPS where the type needs them: only an ultra pd-extreme disk (as SkyPilot)."""
    if _tier(tier) == "ultra" and disk_type(machine_type, tier) == "pd-extreme":
        return PD_EXTREME_IOPS
    return None


def _tier(tier: str | None) -> str:
    if tier is None:
        return "medium"
    return "ultra" if tier == "best" else tier  # every gcp type takes its ultra type (SkyPilot's failover)


def _vcpus(machine_type: str) -> int:
    last = machine_type.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 0


def vm_labels(own: Mapping[str, str], user: Mapping[str, Any] | None) -> dict[str, str]:
    """The cluster's own labels with the task's `labels`; a bad or reserved user label is a SpecError."""
    user = dict(user or {})
    reserved = sorted(k for k in user if str(k).startswith(RESERVED_LABEL_PREFIX))
    if reserved:
        raise SpecError(
            f"resources.labels: {', '.join(reserved)}: keys starting with {RESERVED_LABEL_PREFIX!r} are "
            "airflow-sky's own on gcp (how it finds a cluster's VMs); choose other keys"
        )
    for key, value in user.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise SpecError(
                f"resources.labels: key {key!r} is not a GCE label key: 1-63 characters, lower-case letters, "
                "digits, '_' and '-', starting with a letter"
            )
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise SpecError(
                f"resources.labels.{key}: value {value!r} is not a GCE label value: at most 63 characters, "
                "lower-case letters, digits, '_' and '-'"
            )
    if len(user) + len(own) > MAX_LABELS:
        raise SpecError(
            f"resources.labels: {len(user)} labels; GCE allows {MAX_LABELS} per VM and airflow-sky uses "
            f"{len(own)}: at most {MAX_LABELS - len(own)}"
        )
    return {**user, **own}


def gpu_interfaces(
    fabric: Fabric, region: str, networks: tuple[tuple[str, str], ...]
) -> list[dict[str, Any]]:
    """The type's GPU NICs, one per configured (network, subnetwork), no external address."""
    nic_type = "MRDMA" if fabric.kind == GPUDIRECT_RDMA else "GVNIC"
    return [
        {
            "network": f"global/networks/{network}",
            "subnetwork": f"regions/{region}/subnetworks/{subnetwork}",
            "nicType": nic_type,
        }
        for network, subnetwork in networks[: fabric.extra_nics]
    ]


def missing_gpu_networks(fabric: Fabric, networks: tuple[tuple[str, str], ...]) -> str | None:
    """Why the connection's networks cannot carry this type's GPU NICs under `best`; None when they can."""
    if len(networks) >= fabric.extra_nics:
        return None
    return (
        f"{fabric.kind} needs {fabric.extra_nics} extra VPC networks for its GPU NICs and the connection "
        f"configures {len(networks)}: set extra.airflow_sky.gpu_networks (a list of NETWORK or "
        "NETWORK/SUBNETWORK, one per GPU NIC; airflow-sky does not create VPCs) — see docs/infra-gcp.md"
    )


def best_refusal(machine_type: str, networks: tuple[tuple[str, str], ...]) -> str | None:
    """Why `network_tier: best` cannot be honoured on this type with this connection's networks; else None."""
    fabric = fabric_of(machine_type)
    if fabric is None:
        return best_tier_refusal(machine_type)
    missing = missing_gpu_networks(fabric, networks)
    return f"gcp {machine_type}: {missing}" if missing else None
