"""The pure rules of gcp's resource fields: what fast networking a machine type has, which disk type a tier
is on it (SkyPilot's map), and the connection settings they read."""

from __future__ import annotations

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.infra.gcp import vm_fields
from airflow_sky.infra.gcp.fabric import (
    GPUDIRECT_RDMA,
    GPUDIRECT_TCPX,
    GPUDIRECT_TCPXO,
    TCPXO_NCCL_ENV,
    best_tier_refusal,
    fabric_of,
)
from airflow_sky.infra.gcp.settings import settings_from_extra


@pytest.mark.parametrize(
    ("machine_type", "kind", "nics"),
    [
        ("a2-highgpu-8g", None, 0),
        ("a2-ultragpu-8g", None, 0),
        ("g2-standard-48", None, 0),
        ("n2-standard-8", None, 0),
        ("a3-highgpu-4g", None, 0),  # GPUDirect-TCPX is the 8-GPU type's only
        ("a3-highgpu-8g", GPUDIRECT_TCPX, 4),
        ("a3-edgegpu-8g", GPUDIRECT_TCPX, 4),
        ("a3-megagpu-8g", GPUDIRECT_TCPXO, 8),
        ("a3-ultragpu-8g", GPUDIRECT_RDMA, 8),
        ("a3-ultragpu-8g-nolssd", GPUDIRECT_RDMA, 8),
        ("a4-highgpu-8g", GPUDIRECT_RDMA, 8),
    ],
)
def test_the_fast_networking_each_type_has_under_best(machine_type: str, kind: str | None, nics: int) -> None:
    fabric = fabric_of(machine_type)
    assert fabric is not None and (fabric.kind, fabric.extra_nics) == (kind, nics)
    assert best_tier_refusal(machine_type) is None


def test_types_without_compact_placement_cannot_honour_best_and_say_why() -> None:
    for machine_type in ("n1-standard-8", "e2-standard-4"):
        assert fabric_of(machine_type) is None
        reason = best_tier_refusal(machine_type)
        assert reason is not None and machine_type in reason and "no compact placement" in reason
    assert fabric_of("a3-megagpu-8g").nccl_env == TCPXO_NCCL_ENV  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("machine_type", "tier", "disk", "iops"),
    [
        ("n2-standard-8", None, "pd-balanced", None),  # unset: medium, today's type
        ("n2-standard-8", "low", "pd-standard", None),
        ("n2-standard-8", "high", "pd-ssd", None),
        ("n2-standard-8", "ultra", "pd-ssd", None),  # n2 under 64 vCPUs has no pd-extreme
        ("n2-standard-64", "ultra", "pd-extreme", 20000),
        ("n2-standard-64", "best", "pd-extreme", 20000),
        ("a2-highgpu-8g", "ultra", "pd-ssd", None),
        ("a3-highgpu-8g", "low", "pd-balanced", None),  # a3 has no pd-standard
        ("a3-highgpu-8g", "ultra", "hyperdisk-balanced", None),
        ("a3-ultragpu-8g", None, "hyperdisk-balanced", None),  # hyperdisk only
        ("a4-highgpu-8g", "low", "hyperdisk-balanced", None),
        ("g2-standard-8", "low", "pd-balanced", None),
    ],
)
def test_disk_tiers_map_to_skypilots_disk_types(
    machine_type: str, tier: str | None, disk: str, iops: int | None
) -> None:
    assert vm_fields.disk_type(machine_type, tier) == disk
    assert vm_fields.disk_iops(machine_type, tier) == iops


def test_user_labels_keep_the_clusters_own_and_respect_gces_limit() -> None:
    own = {"airflow-sky-cluster": "c", "airflow-sky-rank": "0", "airflow-sky-launch": "t"}
    assert vm_fields.vm_labels(own, {"team": "ml"}) == own | {"team": "ml"}
    too_many = {f"k{i}": "v" for i in range(62)}
    with pytest.raises(SpecError, match="62 labels; GCE allows 64 per VM and airflow-sky uses 3: at most 61"):
        vm_fields.vm_labels(own, too_many)


def test_the_connection_settings_of_ports_sources_and_gpu_networks() -> None:
    s = settings_from_extra("g", {"airflow_sky": {}}, "p")
    assert (s.ports_source_ranges, s.gpu_networks) == (("0.0.0.0/0",), ())
    extra = {"airflow_sky": {"ports_source_ranges": ["10.0.0.0/8"], "gpu_networks": ["a", "b/c"]}}
    s = settings_from_extra("g", extra, "p")
    assert (s.ports_source_ranges, s.gpu_networks) == (("10.0.0.0/8",), (("a", "a"), ("b", "c")))
    with pytest.raises(SpecError, match=r"ports_source_ranges: 'anywhere' is not a CIDR block"):
        settings_from_extra("g", {"airflow_sky": {"ports_source_ranges": ["anywhere"]}}, "p")
    with pytest.raises(SpecError, match=r"gpu_networks: 'Net_1': 'Net_1' is not a GCE resource name"):
        settings_from_extra("g", {"airflow_sky": {"gpu_networks": ["Net_1"]}}, "p")
    with pytest.raises(SpecError, match=r"gpu_networks: must be a non-empty list of strings"):
        settings_from_extra("g", {"airflow_sky": {"gpu_networks": "net"}}, "p")
