"""GcpCloud at the client boundary: labels as the only state, request ids, spot preemption, stock-out
failover, host keys from guest attributes, autostop. The google-cloud-compute clients talk HTTP to a fake
of GCE (no emulator exists: responses in GCE's documented shapes, not captured); local nodes play the VMs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.cloud import GcpCloud
from airflow_sky.task import Resources
from tests.gcp.conftest import REGION
from tests.gcp.fake_gce import FakeGce
from tests.gcp.test_gcp_contract import FastGcpCloud

N2 = Resources(instance_type="n2-standard-8")


@pytest.fixture
def cluster(gplay: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"g-{request.node.name[5:30].replace('_', '-').lower()}".rstrip("-")
    yield name
    FastGcpCloud(REGION).terminate(name)


def _vm_names(gce: FakeGce, cluster: str) -> list[str]:
    return gce.live(cluster)


def test_ranks_come_from_labels_and_a_fresh_driver_finds_the_zone_in_the_record(
    gce: FakeGce, cluster: str
) -> None:
    nodes = FastGcpCloud(REGION).provision(ProvisionRequest(cluster, 3, N2))
    labels = {name: gce.instances[name]["labels"] for name in _vm_names(gce, cluster)}
    assert sorted(int(v[vms.LABEL_RANK]) for v in labels.values()) == [0, 1, 2]
    assert {n.instance_id: n.rank for n in nodes} == {k: int(v[vms.LABEL_RANK]) for k, v in labels.items()}
    assert [n.instance_id for n in GcpCloud().nodes(cluster)] == [n.instance_id for n in nodes]
    zone = gce.instances[nodes[0].instance_id]["zone"].rsplit("/", 1)[-1]
    assert nodes[0].console_url == (  # the node's extra link in the Airflow UI
        f"https://console.cloud.google.com/compute/instancesDetail/zones/{zone}/instances/"
        f"{nodes[0].instance_id}?project=test-project"
    )
    tags = gce.instances[nodes[0].instance_id]["tags"]["items"]
    assert tags == ["airflow-sky", f"sky-{cluster}"]
    internal = gce.firewalls[vms.internal_firewall(cluster)]
    assert internal["sourceTags"] == internal["targetTags"] == [f"sky-{cluster}"]
    assert gce.firewalls["airflow-sky-ssh"]["sourceRanges"] == ["10.0.0.0/8"]


def test_a_provision_retried_after_its_provisioner_died_gets_the_same_vms(
    gce: FakeGce, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first provisioner dies right after its inserts. The retry sends the same names and request ids:
    GCE answers with the first inserts' operations (or 'already exists'), so no VM is made twice."""
    dying = FastGcpCloud(REGION)

    def die(*args: Any) -> None:
        raise SystemExit("provisioner killed")

    monkeypatch.setattr(dying, "_wait_ready", die)
    monkeypatch.setattr(dying, "_delete", lambda *args: None)  # a killed process cleans nothing up
    with pytest.raises(SystemExit):
        dying.provision(ProvisionRequest(cluster, 2, N2))
    first = _vm_names(gce, cluster)
    inserts = len(gce.inserts)
    nodes = FastGcpCloud(REGION).provision(ProvisionRequest(cluster, 2, N2))
    assert sorted(n.instance_id for n in nodes) == first
    assert len(gce.inserts) == inserts and _vm_names(gce, cluster) == first


def test_a_preempted_spot_vm_is_reported_preempted_and_replaced(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 2, N2.copy(use_spot=True)))
    scheduling = gce.instances[nodes[1].instance_id]["scheduling"]
    assert (scheduling["provisioningModel"], scheduling["instanceTerminationAction"]) == ("SPOT", "DELETE")
    gce.preempt(nodes[1].instance_id)
    assert [(n.rank, n.status) for n in cloud.nodes(cluster)] == [
        (0, NodeStatus.RUNNING),
        (1, NodeStatus.PREEMPTED),
    ]
    new = cloud.replace(cluster, 1)
    assert new.status is NodeStatus.RUNNING and new.instance_id != nodes[1].instance_id
    assert [n.instance_id for n in cloud.nodes(cluster)] == [nodes[0].instance_id, new.instance_id]


def test_a_stocked_out_zone_fails_over_to_the_next_in_the_optimizers_order(
    gce: FakeGce, cluster: str
) -> None:
    cloud = FastGcpCloud(REGION)
    order = cloud.plan(ProvisionRequest(cluster, 2, N2))
    gce.stockout_zones = {order[0].zone}
    try:
        nodes = cloud.provision(ProvisionRequest(cluster, 2, N2))
    finally:
        gce.stockout_zones = set()
    zones = {gce.instances[n.instance_id]["zone"].rsplit("/", 1)[-1] for n in nodes}
    assert zones == {order[1].zone} and cloud.cluster_info(cluster).zone == order[1].zone


def test_stock_outs_everywhere_fail_naming_the_zones_and_leave_nothing(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    order = cloud.plan(ProvisionRequest(cluster, 2, N2))
    gce.stockout_zones = {p.zone for p in order}
    try:
        with pytest.raises(ClusterError, match=r"no capacity.*ZONE_RESOURCE_POOL_EXHAUSTED") as failed:
            cloud.provision(ProvisionRequest(cluster, 2, N2))
    finally:
        gce.stockout_zones = set()
    assert all(p.zone in str(failed.value) for p in order[:5])
    assert _vm_names(gce, cluster) == [] and cloud.nodes(cluster) == []
    assert vms.internal_firewall(cluster) not in gce.firewalls


def test_host_keys_are_read_from_the_guest_attributes(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    cloud.provision(ProvisionRequest(cluster, 1, N2))
    (name,) = _vm_names(gce, cluster)
    gce.guest_keys[name] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGd1ZXN0"
    vm = vms.vm_of(gce.instances[name])
    cloud._resolver = None  # the real path: the API, not the test's play node
    assert cloud._learn_host_key(vm) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGd1ZXN0"


def test_what_a_vm_needs_for_its_gpus_spot_and_autodown() -> None:
    common: dict[str, Any] = dict(
        zone="us-central1-a",
        image=vms.DEFAULT_IMAGE,
        disk_gb=256,
        network="default",
        labels={},
        tags=[],
        ssh_user="gcpuser",
        public_key="ssh-ed25519 AAAA",
        external_ip=True,
    )
    t4 = vms.instance_body(
        name="c-0-x",
        machine_type="n1-standard-8",
        accelerator="T4",
        accelerator_count=2,
        spot=False,
        self_delete=False,
        **common,
    )
    assert t4["guestAccelerators"] == [
        {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}
    ]
    assert t4["scheduling"]["onHostMaintenance"] == "TERMINATE" and "serviceAccounts" not in t4
    l4 = vms.instance_body(
        name="c-0-x",
        machine_type="g2-standard-48",
        accelerator="L4",
        accelerator_count=4,
        spot=True,
        self_delete=True,
        **common,
    )
    assert "guestAccelerators" not in l4  # g2 carries its L4s
    assert l4["scheduling"]["provisioningModel"] == "SPOT" and l4["serviceAccounts"][0]["email"] == "default"
    assert {"key": "ssh-keys", "value": "gcpuser:ssh-ed25519 AAAA gcpuser"} in l4["metadata"]["items"]
    # A configured service account is the nodes' identity for the task's gs:// buckets.
    own = vms.instance_body(
        name="c-0-x",
        machine_type="n2-standard-8",
        accelerator=None,
        accelerator_count=0,
        spot=False,
        self_delete=True,
        service_account="nodes@p.iam.gserviceaccount.com",
        **common,
    )
    assert own["serviceAccounts"] == [
        {
            "email": "nodes@p.iam.gserviceaccount.com",
            "scopes": [
                "https://www.googleapis.com/auth/compute",
                "https://www.googleapis.com/auth/devstorage.read_write",
            ],
        }
    ]


def test_autostop_stops_or_deletes_and_a_stopped_cluster_is_started_again(gce: FakeGce, cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 2, N2.copy(autostop=5)))
    assert "shutdown -h now" in cloud.autostop_action(cluster, down=False)
    assert "instances/$n" in cloud.autostop_action(cluster, down=True)  # autodown: the VM deletes itself
    for n in nodes:  # what the nodes' own shutdown does to a GCE VM
        gce.instances[n.instance_id]["status"] = "TERMINATED"
    assert [n.status for n in cloud.nodes(cluster)] == [NodeStatus.STOPPED, NodeStatus.STOPPED]
    again = cloud.provision(ProvisionRequest(cluster, 2, N2))
    assert [(n.instance_id, n.status) for n in again] == [(n.instance_id, NodeStatus.RUNNING) for n in nodes]


def test_spot_vms_can_only_autodown(cluster: str) -> None:
    cloud = FastGcpCloud(REGION)
    cloud.provision(ProvisionRequest(cluster, 1, N2.copy(use_spot=True)))
    with pytest.raises(SpecError, match="spot VMs cannot be stopped"):
        cloud.prepare_autostop(cluster, down=False)


def test_connection_settings_errors_name_the_connection_and_field() -> None:
    from airflow_sky.infra.gcp.settings import settings_from_extra

    with pytest.raises(SpecError, match=r"'g': extra.airflow_sky: unknown field\(s\) netwrok"):
        settings_from_extra("g", {"airflow_sky": {"netwrok": "x"}}, "p")
    with pytest.raises(SpecError, match=r"extra.airflow_sky: no project"):
        settings_from_extra("g", {"airflow_sky": {}}, None)
    with pytest.raises(SpecError, match=r"anonymous_credentials: only for emulators"):
        settings_from_extra("g", {"airflow_sky": {"anonymous_credentials": True}}, "p")
