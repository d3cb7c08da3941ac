"""An aws cluster's own network, over its life: made before its instances are launched, recorded in its
record (so teardown, a replacement node, and any worker's `network_env` / `opened_ports` read it), and
removed once its instances are gone, at teardown or when the provision that made it failed.

Always: the nodes' security group, the cluster's own (SSH in, all traffic between its own nodes only: the
nodes of another cluster are never members). `network_tier: best`: a cluster placement group and, on types
with EFA, EFA interfaces (efa.py) and the NCCL/libfabric env. `ports`: a security group of the cluster's own
with exactly those ports open.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import cluster_network, efa, network
from airflow_sky.infra.aws.members import AwsMembers
from airflow_sky.infra.aws.placement import Placement
from airflow_sky.task import Resources

log = logging.getLogger(__name__)

_ALL = ("placement_group", "ports_group", "nodes_group")


@dataclasses.dataclass(frozen=True)
class OwnedNetwork:
    """What a launch puts its instances in; `made`: what this launch created."""

    placement_group: str | None = None
    ports_group: str | None = None
    efa_type: str | None = None  # the instance type whose EFA interfaces the launch asks for
    made: tuple[str, ...] = ()  # "placement_group", "ports_group", "nodes_group"
    nodes_group: str | None = None
    deployment_group: str | None = None  # the connection's `security_group`, never made nor removed here

    @property
    def security_groups(self) -> list[str]:
        """The groups of a node's primary interface: its cluster's nodes group first."""
        return [g for g in (self.nodes_group, self.ports_group, self.deployment_group) if g]


class AwsOwnedNetwork(AwsMembers):
    release_timeout_s = 600.0  # for EC2 to let go of a group whose instances are ending

    def _prepare_network(
        self, cluster: str, ec2: Any, region: str, placement: Placement, resources: Resources
    ) -> OwnedNetwork:
        """Make (or find) the cluster's nodes group, placement group and ports group, and record them
        before launching."""
        best = resources.network_tier == "best"
        if best:
            refusal = efa.best_tier_refusal(placement.instance_type)
            if refusal is not None:  # the optimizer refuses these already; a recorded type may not be
                raise ClusterError(f"resources.network_tier: {refusal}")
        made: list[str] = []
        group_name = cluster_network.placement_group_name(cluster) if best else None
        if group_name and cluster_network.ensure_placement_group(ec2, group_name):
            made.append("placement_group")
        vpc = network.default_vpc(ec2, region)
        nodes_group, fresh = cluster_network.ensure_nodes_group(ec2, vpc, cluster, self.settings.ssh_cidr)
        if fresh:
            made.append("nodes_group")
        ports_group = None
        if resources.ports:
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
                "nodes_group": nodes_group,
                "ports": list(resources.ports or ()),
                "disk_tier": resources.disk_tier,
                "labels": dict(resources.labels or {}),
            },
            "the cluster's network",
        )
        return OwnedNetwork(
            group_name,
            ports_group,
            placement.instance_type if best else None,
            tuple(made),
            nodes_group,
            network.deployment_group(ec2, vpc, self.settings.security_group),
        )

    def _release_network(
        self, cluster: str, region: str, owned: OwnedNetwork | None = None, wait_for: list[str] | None = None
    ) -> None:
        """Remove the cluster's groups (`owned`: only what one launch made) once the instances in them
        (`wait_for`, or all of the cluster's) have ended; the ports close at once. Without a record the
        nodes group is still found by its tags. A group EC2 will not let go of in time is a ClusterError
        that says to run the teardown again (the record, which names the groups, is kept until then)."""
        ec2 = self._client("ec2", region)
        if owned is None:
            data = self._record(cluster) or {}
            nodes = data.get("nodes_group") or cluster_network.find_nodes_group(ec2, None, cluster)
            owned = OwnedNetwork(
                data.get("placement_group"), data.get("ports_group"), made=_ALL, nodes_group=nodes
            )
        group = owned.placement_group if "placement_group" in owned.made else None
        ports = owned.ports_group if "ports_group" in owned.made else None
        nodes = owned.nodes_group if "nodes_group" in owned.made else None
        if ports is not None:
            cluster_network.close_ports(ec2, ports)

        def still_used() -> bool:
            return any(
                m.state != "terminated"
                for m in self._members(cluster, region)
                if wait_for is None or m.instance_id in wait_for
            )

        removals = [
            (f"security group {ports} (the ports of {cluster})", ports, cluster_network.delete_group),
            (f"security group {nodes} (the nodes of {cluster})", nodes, cluster_network.delete_group),
            (f"placement group {group}", group, cluster_network.delete_placement_group),
        ]
        removed = []
        for what, name, delete in removals:
            if name is not None:
                cluster_network.when_released(
                    functools.partial(delete, ec2, name),
                    what,
                    self.release_timeout_s,
                    self.poll_s,
                    still_used,
                )
                removed.append(what)
        if removed:
            log.info("aws: %s: removed its %s", cluster, ", ".join(removed))

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
