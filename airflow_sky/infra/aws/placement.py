"""Where an aws cluster lives: its placement (region, zone, instance type, spot), the image and disk it
was launched with and its autostop behavior, kept in one record of the cluster's DynamoDB state table
beside the job records. Membership itself is only ever read from EC2's tags."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from airflow_sky.infra.aws.connection import AwsConnection
from airflow_sky.infra.aws.state_store import DynamoDbStateStore, cluster_names
from airflow_sky.infra.ledger import Billing, catalog_billing
from airflow_sky.infra.vm_cloud import VmCloud
from airflow_sky.task.envs import ClusterInfo


@dataclasses.dataclass(frozen=True)
class Placement:
    region: str
    zone: str  # the zone's id (use1-az1): the catalog's; names (us-east-1a) differ between accounts
    instance_type: str
    use_spot: bool

    @property
    def label(self) -> str:
        return f"{self.zone} {self.instance_type}{' (spot)' if self.use_spot else ''}"


class AwsClusterRecords(AwsConnection, VmCloud):
    """The cluster records of an aws connection."""

    def _store(self, cluster_name: str) -> DynamoDbStateStore:
        s = self.settings
        return DynamoDbStateStore(self._client("dynamodb", s.state_region), s.state_table, cluster_name)

    def _placement(self, cluster_name: str) -> Placement | None:
        data = self._record(cluster_name)
        if data is None:
            return None
        return Placement(**{f.name: data[f.name] for f in dataclasses.fields(Placement)})

    def _launch_settings(self, cluster_name: str) -> dict[str, Any]:
        """The image and disk the cluster was launched with: what a replacement node gets too (with its
        container image, `docker:<image>`, when the task runs in one: the replacement's boot pulls it)."""
        data = self._record(cluster_name)
        keys = ("image", "disk_size", "shutdown", "container")
        return {k: data.get(k) for k in keys} if data is not None else {}

    def _record_placement(
        self,
        cluster_name: str,
        placement: Placement,
        image: str,
        disk_size: int,
        container: str | None = None,
    ) -> None:
        # Merged: what autostop recorded (the shutdown behavior) stays for the nodes launched later.
        launched = {"image": image, "disk_size": disk_size, "container": container}
        self._update_record(cluster_name, dataclasses.asdict(placement) | launched)

    def _region_of(self, cluster_name: str) -> str | None:
        if self.region:
            return self.region
        placement = self._placement(cluster_name)
        return placement.region if placement else None

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        placement = self._placement(cluster_name)
        if placement is None:
            return ClusterInfo(cluster_name, "aws", self.region, self.zone)
        return ClusterInfo(
            cluster_name, "aws", placement.region, self.zone_name(placement.region, placement.zone)
        )

    def billing(self, cluster_name: str) -> Billing | None:
        placement = self._placement(cluster_name)
        if placement is None:
            return None
        return catalog_billing(
            "aws", placement.instance_type, placement.use_spot, placement.region, placement.zone
        )

    def clusters(self) -> Sequence[str]:
        s = self.settings
        return cluster_names(self._client("dynamodb", s.state_region), s.state_table)

    def _record_shutdown(self, cluster_name: str, behavior: str) -> None:
        self._update_record(cluster_name, {"shutdown": behavior}, "the autostop behavior")
