"""Reading an aws cluster's membership: its instances found by their tags, and the nodes they make."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_sky.infra import catalog
from airflow_sky.infra.aws import instances
from airflow_sky.infra.aws.instances import Member
from airflow_sky.infra.aws.placement import AwsClusterRecords
from airflow_sky.infra.base import Node
from airflow_sky.infra.provisioning import Endpoint


class AwsMembers(AwsClusterRecords):
    """Membership is only ever read from EC2 (the tags), never from a record."""

    _resolver: Callable[[str], dict[str, Any]] | None  # an emulator's machines stand in for the instances

    def _members(self, cluster_name: str, region: str) -> list[Member]:
        ec2 = self._client("ec2", region)
        found: list[Member] = []
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{instances.TAG_CLUSTER}", "Values": [cluster_name]}]
        ):
            for reservation in page["Reservations"]:
                found.extend(instances.member_of(i) for i in reservation["Instances"])
        return found

    def nodes(self, cluster_name: str) -> list[Node]:
        region = self._region_of(cluster_name)
        if region is None:
            return []
        current = instances.current_members(self._members(cluster_name, region))
        return [self._node(rank, m, region) for rank, m in current.items()]

    def _node(self, rank: int, m: Member, region: str) -> Node:
        endpoint = self._endpoint(m)
        return Node(
            rank=rank,
            internal_ip=endpoint.internal_ip,
            ssh_host=endpoint.host,
            ssh_port=endpoint.port,
            ssh_user=endpoint.user,
            instance_id=m.instance_id,
            status=instances.status_of(m),
            gpus=catalog.accelerator_count("aws", m.instance_type),
            host_key=m.host_key,
            console_url=instances.console_url(region, m.instance_id),
        )

    def _endpoint(self, m: Member) -> Endpoint:
        if self._resolver is not None:
            return Endpoint.resolved(self._resolver(m.instance_id))
        s = self.settings
        host = m.private_ip if s.use_private_ip else (m.public_ip or m.private_ip)
        return Endpoint(host or "", 22, s.ssh_user, m.private_ip or "")
