"""An aws cluster's own network, over its life: made before its instances are launched, recorded in its
record (so teardown, a replacement node, and any worker's `network_env` / `opened_ports` read it), and
removed once its instances are gone, at teardown or when the provision that made it failed.

`network_tier: best`: a cluster placement group and, on types with EFA, EFA interfaces (efa.py) and the
NCCL/libfabric env. `ports`: a security group of the cluster's own with exactly those ports open.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import cluster_network, efa, network
from airflow_sky.infra.aws.members import AwsMembers
from airflow_sky.infra.aws.placement import Placement
from airflow_sky.task import Resources

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class OwnedNetwork:
    """What a launch puts its instances in, beyond the shared group; `made`: what this launch created."""

    placement_group: str | None = None
    ports_group: str | None = None
    efa_type: str | None = None  # the instance type whose EFA interfaces the launch asks for
    made: tuple[str, ...] = ()  # "placement_group", "ports_group"


class AwsOwnedNetwork(AwsMembers):
    release_timeout_s = 600.0  # for EC2 to let go of a group whose instances are ending

    def _prepare_network(
        self, cluster: str, ec2: Any, region: str, placement: Placement, resources: Resources
    ) -> OwnedNetwork:
        """Make (or find) the cluster's placement group and ports group, and record them before launching."""
        best = resources.network_tier == "best"
        if best:
            refusal = efa.best_tier_refusal(placement.instance_type)
            if refusal is not None:  # the optimizer refuses these already; a recorded type may not be
                raise ClusterError(f"resources.network_tier: {refusal}")
        made: list[str] = []
        group_name = cluster_network.placement_group_name(cluster) if best else None
        if group_name and cluster_network.ensure_placement_group(ec2, group_name):
            made.append("placement_group")
        ports_group = None
        if resources.ports:
            vpc = network.default_vpc(ec2, region)
            ports_group, fresh = cluster_network.ensure_ports_group(
                ec2, vpc, cluster, resources.ports, self.settings.port_sources
            )
            if fresh:
                made.append("ports_group")
        self._update_record(
            cluster,
            {
                "network_tier": resources.network_tier,
                "placement_group": group_name,
                "ports_group": ports_group,
                "ports": list(resources.ports or ()),
                "disk_tier": resources.disk_tier,
                "labels": dict(resources.labels or {}),
            },
            "the cluster's network",
        )
        return OwnedNetwork(group_name, ports_group, placement.instance_type if best else None, tuple(made))

    def _release_network(
        self, cluster: str, region: str, owned: OwnedNetwork | None = None, wait_for: list[str] | None = None
    ) -> None:
        """Remove the cluster's placement group and ports group (`owned`: only what one launch made), once
        the instances in them (`wait_for`, or all of the cluster's) have ended; their rules go at once."""
        if owned is None:
            data = self._record(cluster) or {}
            owned = OwnedNetwork(
                data.get("placement_group"), data.get("ports_group"), made=("placement_group", "ports_group")
            )
        group = owned.placement_group if "placement_group" in owned.made else None
        ports = owned.ports_group if "ports_group" in owned.made else None
        if group is None and ports is None:
            return
        ec2 = self._client("ec2", region)
        if ports is not None:
            cluster_network.close_ports(ec2, ports)

        def still_used() -> bool:
            return any(
                m.state != "terminated"
                for m in self._members(cluster, region)
                if wait_for is None or m.instance_id in wait_for
            )

        if ports is not None:
            cluster_network.when_released(
                lambda: cluster_network.delete_ports_group(ec2, ports),
                f"security group {ports} (the ports of {cluster})",
                self.release_timeout_s,
                self.poll_s,
                still_used,
            )
        if group is not None:
            cluster_network.when_released(
                lambda: cluster_network.delete_placement_group(ec2, group),
                f"placement group {group}",
                self.release_timeout_s,
                self.poll_s,
                still_used,
            )
        removed = [f"placement group {group}" if group else "", f"ports group {ports}" if ports else ""]
        log.info("aws: %s: removed its %s", cluster, " and ".join(r for r in removed if r))

    def _open_ports_on_nodes(self, cluster: str, resources: Resources) -> None:
        """A cluster that was up asks more ports (Cluster.provision passes the union): its ports group gets
        exactly those, and every live node's primary interface that lacks the group gets it."""
        if not resources.ports:
            return
        data = self._record(cluster) or {}
        region = data.get("region")
        if region is None:
            return
        ec2 = self._client("ec2", region)
        group, _ = cluster_network.ensure_ports_group(
            ec2, network.default_vpc(ec2, region), cluster, resources.ports, self.settings.port_sources
        )
        self._update_record(
            cluster, {"ports": list(resources.ports), "ports_group": group}, "the cluster's ports"
        )
        for m in self._members(cluster, region):
            if m.state in ("pending", "running", "stopped") and not m.ended:
                cluster_network.attach_group(ec2, m.instance_id, group)

    # ---- what the cluster's nodes see of it (Cloud contract) ----------------------------------------

    def network_env(self, cluster_name: str) -> dict[str, str]:
        """NCCL over EFA for a `network_tier: best` cluster on an EFA type; nothing otherwise."""
        data = self._record(cluster_name) or {}
        if data.get("network_tier") != "best" or not data.get("instance_type"):
            return {}
        return efa.nccl_env(str(data["instance_type"]))

    def opened_ports(self, cluster_name: str) -> tuple[str, ...]:
        data = self._record(cluster_name) or {}
        return tuple(str(p) for p in data.get("ports") or ())

    def _owned_resources(self, cluster_name: str) -> dict[str, Any]:
        """The record's network, disk and labels: what a replacement node is launched with too."""
        data = self._record(cluster_name) or {}
        return {
            "network_tier": data.get("network_tier"),
            "ports": data.get("ports") or None,
            "disk_tier": data.get("disk_tier"),
            "labels": data.get("labels") or None,
        }


def interface_note(instance_type: str, public_ip: bool) -> str:
    """What the launch log says of a `best` launch's EFA interfaces."""
    count = efa.interface_count(instance_type, public_ip)
    most = efa.efa_of(instance_type)
    if most is not None and count < most.max_interfaces:
        return (
            f"{count} of {instance_type}'s {most.max_interfaces} EFA interfaces: EC2 gives no public address to "
            "a node with several; set use_private_ip in the connection to get all of them"
        )
    return f"{count} EFA interface(s)"
