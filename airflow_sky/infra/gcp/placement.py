"""Where a gcp cluster lives: its placement (region, zone, machine type, spot, accelerators), its size, the
image and disk it was launched with and its VMs' pinned host keys, in one record of its GCS state bucket
beside the job records. Membership itself is only ever read from the VMs' labels."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from airflow_sky.infra.gcp.connection import GcpConnection
from airflow_sky.infra.gcp.state_store import GcsStateStore, cluster_names, ensure_bucket
from airflow_sky.infra.ledger import Billing, catalog_billing
from airflow_sky.infra.vm_cloud import VmCloud
from airflow_sky.task.envs import ClusterInfo


@dataclasses.dataclass(frozen=True)
class Placement:
    region: str
    zone: str
    machine_type: str
    use_spot: bool
    accelerator: str | None = None
    accelerator_count: int = 0

    @property
    def label(self) -> str:
        return f"{self.zone} {self.machine_type}{' (spot)' if self.use_spot else ''}"


class GcpClusterRecords(GcpConnection, VmCloud):
    """The cluster records of a gcp connection."""

    def _store(self, cluster_name: str) -> GcsStateStore:
        s = self.settings
        ensure_bucket(self._storage_client(), s.state_bucket, s.state_location)
        return GcsStateStore(self._storage_client(), s.state_bucket, cluster_name)

    def _placement(self, cluster_name: str) -> Placement | None:
        data = self._record(cluster_name)
        if data is None:
            return None
        return Placement(**{f.name: data[f.name] for f in dataclasses.fields(Placement) if f.name in data})

    def _zone_of(self, cluster_name: str) -> str | None:
        placement = self._placement(cluster_name)
        if placement is not None:
            return placement.zone
        return self.zone

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        placement = self._placement(cluster_name)
        if placement is None:
            return ClusterInfo(cluster_name, "gcp", self.region, self.zone)
        return ClusterInfo(cluster_name, "gcp", placement.region, placement.zone)

    def billing(self, cluster_name: str) -> Billing | None:
        p = self._placement(cluster_name)
        if p is None:
            return None
        return catalog_billing("gcp", p.machine_type, p.use_spot, p.region, p.zone, p.accelerator)

    def clusters(self) -> Sequence[str]:
        s = self.settings
        ensure_bucket(self._storage_client(), s.state_bucket, s.state_location)
        return cluster_names(self._storage_client(), s.state_bucket)
