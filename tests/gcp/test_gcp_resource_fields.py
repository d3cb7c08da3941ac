"""network_tier, ports, disk_tier and labels acting on gcp, through the google-cloud-compute clients and the
fake GCE (no emulator exists: responses in GCE's documented shapes, not captured); local nodes play the VMs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.cloud import GcpCloud
from airflow_sky.infra.gcp.fabric import TCPX_NCCL_ENV
from airflow_sky.task import Resources
from tests.gcp.conftest import REGION
from tests.gcp.fake_gce import FakeGce
from tests.gcp.test_gcp_contract import FastGcpCloud

A100_8 = Resources(accelerators="A100:8", network_tier="best")
H100_8 = Resources(instance_type="a3-highgpu-8g", network_tier="best")
GPU_NETWORKS = ["gpu-net-1", "gpu-net-2", "gpu-net-3", "gpu-net-4/gpu-sub-4"]


@pytest.fixture
def cluster(gplay: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"r-{request.node.name[5:30].replace('_', '-').lower()}".rstrip("-")
    yield name
    FastGcpCloud(REGION).terminate(name)


def _with_settings(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
    """The default connection with more airflow_sky settings, for this test only."""
    conn = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    conn["extra"]["airflow_sky"].update(settings)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(conn))


def _vms(gce: FakeGce, cluster: str) -> list[dict[str, Any]]:
    return [gce.instances[n] for n in gce.live(cluster)]


def _made(gce: FakeGce, cluster: str) -> list[str]:
    """Everything of the cluster the fake holds: VMs, its firewall rules, its placement policy."""
    rules = [n for n in (vms.internal_firewall(cluster), vms.ports_firewall(cluster)) if n in gce.firewalls]
    policy = [p for p in gce.policy_links() if p.endswith("/" + vms.placement_policy_name(cluster))]
    return [*gce.live(cluster), *rules, *policy]


def test_best_on_four_a100_nodes_puts_them_in_one_compact_policy_with_gvnic_and_teardown_removes_it(
    gce: FakeGce, cluster: str
) -> None:
    cloud = FastGcpCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 4, A100_8))
    assert len(nodes) == 4
    created = _vms(gce, cluster)
    policy = vms.placement_policy_name(cluster)
    (link,) = [p for p in gce.policy_links() if p.endswith("/" + policy)]
    assert gce.policies[f"{REGION}/{policy}"]["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    for vm in created:
        assert vm["machineType"].endswith("/a2-highgpu-8g")
        assert vm["resourcePolicies"] == [link]
        assert [nic.get("nicType") for nic in vm["networkInterfaces"]] == ["GVNIC"]  # a2: no GPU NICs
        assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert GcpCloud().network_env(cluster) == {}  # a2 has no GPUDirect NICs: no NCCL settings to give
    new = FastGcpCloud(REGION).replace(cluster, 1)  # a replacement joins the same policy, with gVNIC
    assert gce.instances[new.instance_id]["resourcePolicies"] == [link]
    assert gce.instances[new.instance_id]["networkInterfaces"][0]["nicType"] == "GVNIC"
    cloud.terminate(cluster)
    assert _made(gce, cluster) == [] and gce.policy_links().count(link) == 0


def test_best_on_a3_highgpu_adds_its_four_gpu_nics_and_every_worker_gets_the_tcpx_nccl_env(
    gce: FakeGce, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_settings(monkeypatch, gpu_networks=GPU_NETWORKS)
    FastGcpCloud(REGION).provision(ProvisionRequest(cluster, 2, H100_8))
    for vm in _vms(gce, cluster):
        nics = vm["networkInterfaces"]
        assert [n.get("nicType") for n in nics] == ["GVNIC"] * 5
        assert [(n["network"], n["subnetwork"]) for n in nics[1:]] == [
            ("global/networks/gpu-net-1", f"regions/{REGION}/subnetworks/gpu-net-1"),
            ("global/networks/gpu-net-2", f"regions/{REGION}/subnetworks/gpu-net-2"),
            ("global/networks/gpu-net-3", f"regions/{REGION}/subnetworks/gpu-net-3"),
            ("global/networks/gpu-net-4", f"regions/{REGION}/subnetworks/gpu-sub-4"),
        ]
        assert "accessConfigs" not in nics[1]  # GPU NICs carry no public address
    env = GcpCloud().network_env(cluster)  # a fresh driver, as on another worker: read from the record
    assert env == TCPX_NCCL_ENV and env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"


def test_best_is_refused_with_the_reason_and_nothing_is_created(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    firewalls, policies = dict(gce.firewalls), gce.policy_links()
    with pytest.raises(SpecError, match=r"n1-standard-8: the N1 family has no compact placement"):
        cloud.provision(
            ProvisionRequest(cluster, 2, Resources(instance_type="n1-standard-8", network_tier="best"))
        )
    with pytest.raises(SpecError, match=r"needs 4 extra VPC networks .* set extra.airflow_sky.gpu_networks"):
        cloud.provision(ProvisionRequest(cluster, 2, H100_8))
    assert _made(gce, cluster) == [] and gce.policy_links() == policies and gce.firewalls == firewalls
    assert cloud.nodes(cluster) == [] and cloud.opened_ports(cluster) == ()


def test_a_best_launch_that_fails_half_way_leaves_no_placement_policy(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    gce.stockout_zones = {p.zone for p in cloud.plan(ProvisionRequest(cluster, 2, A100_8))}
    try:
        with pytest.raises(ClusterError, match="no capacity"):
            cloud.provision(ProvisionRequest(cluster, 2, A100_8))
    finally:
        gce.stockout_zones = set()
    assert _made(gce, cluster) == []


def test_ports_open_exactly_those_from_the_configured_sources_and_teardown_closes_them(
    gce: FakeGce, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = FastGcpCloud(REGION)
    cloud.provision(
        ProvisionRequest(cluster, 1, Resources(instance_type="n2-standard-8", ports=[6006, 8265]))
    )
    rule = gce.firewalls[vms.ports_firewall(cluster)]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["6006", "8265"]}]
    assert rule["sourceRanges"] == ["0.0.0.0/0"] and rule["targetTags"] == [vms.network_tag(cluster)]
    assert GcpCloud().opened_ports(cluster) == ("6006", "8265")
    # Asked again with other ports (and sources): the rule becomes exactly those.
    _with_settings(monkeypatch, ports_source_ranges=["203.0.113.0/24"])
    FastGcpCloud(REGION).provision(
        ProvisionRequest(cluster, 1, Resources(instance_type="n2-standard-8", ports=["10000-10010"]))
    )
    rule = gce.firewalls[vms.ports_firewall(cluster)]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["10000-10010"]}]
    assert rule["sourceRanges"] == ["203.0.113.0/24"]
    assert GcpCloud().opened_ports(cluster) == ("10000-10010",)
    cloud.terminate(cluster)
    assert vms.ports_firewall(cluster) not in gce.firewalls


def test_disk_tier_and_labels_are_on_the_vms_and_their_disks_beside_the_clusters_own(
    gce: FakeGce, cluster: str
) -> None:
    resources = Resources(
        instance_type="n2-standard-8", disk_tier="high", labels={"team": "ml", "cost-center": "42"}
    )
    FastGcpCloud(REGION).provision(ProvisionRequest(cluster, 2, resources))
    for vm in _vms(gce, cluster):
        assert {"team": "ml", "cost-center": "42"}.items() <= vm["labels"].items()
        assert vm["labels"][vms.LABEL_CLUSTER] == cluster and vm["labels"][vms.LABEL_RANK] in ("0", "1")
        disk = gce.disks[vm["name"]]
        assert disk["type"].endswith("/diskTypes/pd-ssd") and "provisionedIops" not in disk
        assert disk["labels"]["team"] == "ml" and disk["labels"][vms.LABEL_CLUSTER] == cluster


def test_an_ultra_disk_is_pd_extreme_with_skypilots_iops_where_the_type_takes_it(
    gce: FakeGce, cluster: str
) -> None:
    FastGcpCloud(REGION).provision(
        ProvisionRequest(cluster, 1, Resources(instance_type="n2-standard-64", disk_tier="ultra"))
    )
    (vm,) = _vms(gce, cluster)
    disk = gce.disks[vm["name"]]
    assert disk["type"].endswith("/diskTypes/pd-extreme") and disk["provisionedIops"] == "20000"


@pytest.mark.parametrize(
    ("labels", "error"),
    [
        ({"airflow-sky-cluster": "x"}, r"airflow-sky-cluster: keys starting with 'airflow-sky'"),
        ({"Team": "ml"}, r"key 'Team' is not a GCE label key"),
        ({"team": "M L"}, r"labels.team: value 'M L' is not a GCE label value"),
        ({"t" * 64: "x"}, r"is not a GCE label key: 1-63 characters"),
    ],
)
def test_bad_labels_are_refused_naming_the_key_and_nothing_is_created(
    gce: FakeGce, cluster: str, labels: dict[str, str], error: str
) -> None:
    with pytest.raises(SpecError, match=error):
        FastGcpCloud(REGION).provision(
            ProvisionRequest(cluster, 1, Resources(instance_type="n2-standard-8", labels=labels))
        )
    assert _made(gce, cluster) == []
