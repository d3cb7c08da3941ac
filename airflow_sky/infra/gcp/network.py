"""The gcp cluster's firewall rules: SSH in to every node (one rule, shared), traffic between its nodes
(one rule per cluster, removed with it)."""

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
