"""What a gcp cluster has besides its VMs: firewall rules (SSH in to every node, one rule shared; traffic
between its nodes and the task's `ports`, one rule each per cluster) and, under `network_tier: best`, its
compact placement policy; all but the shared rule are removed with the cluster."""

from __future__ import annotations

from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.api import ComputeApi
from airflow_sky.infra.gcp.settings import GcpSettings


def ensure_firewalls(api: ComputeApi, s: GcpSettings, cluster: str) -> None:
    """SSH from `ssh_cidr` to the shared tag; all traffic between the VMs of the cluster's own tag."""
    network = f"global/networks/{s.network}"
    if api.firewall("airflow-sky-ssh") is None:
        api.insert_firewall(
            {
                "name": "airflow-sky-ssh",
                "network": network,
                "direction": "INGRESS",
                "sourceRanges": [s.ssh_cidr],
                "targetTags": [vms.SSH_TAG],
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                "description": "airflow-sky: SSH to cluster nodes",
            }
        )
    tag = vms.network_tag(cluster)
    if api.firewall(vms.internal_firewall(cluster)) is None:
        api.insert_firewall(
            {
                "name": vms.internal_firewall(cluster),
                "network": network,
                "direction": "INGRESS",
                "sourceTags": [tag],
                "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
                "description": f"airflow-sky: all traffic between the nodes of cluster {cluster}",
            }
        )


def ensure_ports(api: ComputeApi, s: GcpSettings, cluster: str, ports: tuple[str, ...]) -> None:
    """TCP `ports` from `ports_source_ranges` to the cluster's tag: exactly those (as SkyPilot's rule,
    an existing rule is updated to the ports asked)."""
    name = vms.ports_firewall(cluster)
    body = {
        "name": name,
        "network": f"global/networks/{s.network}",
        "direction": "INGRESS",
        "priority": 65534,  # SkyPilot's: below any deny rule the project keeps
        "sourceRanges": list(s.ports_source_ranges),
        "targetTags": [vms.network_tag(cluster)],
        "allowed": [{"IPProtocol": "tcp", "ports": list(ports)}],
        "description": f"airflow-sky: the ports of cluster {cluster}",
    }
    current = api.firewall(name)
    if current is None:
        api.insert_firewall(body)
        return
    allowed = [(a.get("IPProtocol"), list(a.get("ports") or [])) for a in current.get("allowed") or []]
    if allowed != [("tcp", list(ports))] or list(current.get("sourceRanges") or []) != body["sourceRanges"]:
        api.update_firewall(name, body)


def ensure_placement_policy(api: ComputeApi, region: str, cluster: str) -> str:
    """The cluster's compact placement policy in `region` (made if missing); its relative URL for a VM."""
    name = vms.placement_policy_name(cluster)
    if api.resource_policy(region, name) is None:
        api.insert_resource_policy(
            region,
            {
                "name": name,
                "description": f"airflow-sky: the nodes of cluster {cluster} close together",
                "groupPlacementPolicy": {"collocation": "COLLOCATED"},
            },
        )
    return f"projects/{api.project}/regions/{region}/resourcePolicies/{name}"


def remove_cluster_rules(api: ComputeApi, cluster: str, policy_regions: list[str]) -> None:
    """What the cluster's provisions made besides its VMs (after they are gone: a policy in use stays)."""
    api.delete_firewall(vms.ports_firewall(cluster))
    api.delete_firewall(vms.internal_firewall(cluster))
    for region in policy_regions:
        api.delete_resource_policy(region, vms.placement_policy_name(cluster))
