"""The Cloud contract run against the gcp infra, at the client boundary: the google-cloud-compute and
-storage clients talk HTTP to fakes of GCE and GCS (no emulator exists; responses in the documented
shapes), and local nodes play the VMs (tests/play_nodes.py, test-only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from airflow_sky.infra.base import Endpoint
from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.cloud import GcpCloud
from tests.gcp.conftest import REGION, ZONE
from tests.gcp.fake_gce import FakeGce
from tests.gcp.fake_gcs import FakeGcs
from tests.infra.contract import CloudContract


class FastGcpCloud(GcpCloud):
    """Short polls: the fake's operations finish in a poll or two, its VMs boot in 0.3 s."""

    def __init__(self, location: str = f"{REGION}/{ZONE}", conn_id: str | None = None) -> None:
        super().__init__(location, conn_id)
        self.poll_s = 0.1
        self.ssh_timeout_s = 20


class _ThirdNeverAnswers(FastGcpCloud):
    def _endpoint(self, vm: vms.Vm) -> Endpoint:
        endpoint = super()._endpoint(vm)
        return dataclasses.replace(endpoint, host="127.0.0.254", port=1) if vm.rank == 2 else endpoint


class TestGcpCloud(CloudContract):
    @pytest.fixture(autouse=True)
    def _env(self, gplay: dict[str, Any], gce: FakeGce, gcs: FakeGcs) -> None:
        self.gce = gce
        self.gcs = gcs
        self.bucket = gplay["conn"]["extra"]["airflow_sky"]["state_bucket"]

    @pytest.fixture
    def cloud(self) -> GcpCloud:
        return FastGcpCloud()

    @pytest.fixture
    def failing_cloud(self) -> GcpCloud:
        cloud = _ThirdNeverAnswers()
        cloud.ssh_timeout_s = 2
        return cloud

    def leftovers(self, cluster_name: str) -> list[object]:
        records = [
            name
            for (bucket, name) in self.gcs.objects
            if bucket == self.bucket and f"/{cluster_name}/" in name
        ]
        rules = (vms.internal_firewall(cluster_name), vms.ports_firewall(cluster_name))
        firewalls = [name for name in rules if name in self.gce.firewalls]
        policy = vms.placement_policy_name(cluster_name)
        policies = [p for p in self.gce.policy_links() if p.endswith(f"/{policy}")]
        return [*self.gce.live(cluster_name), *records, *firewalls, *policies]
