"""Reading an aws cluster's membership: its instances found by their tags, and the nodes they make."""

from __future__ import annotations

from airflow_sky.infra import catalog
from airflow_sky.infra.aws import instances
from airflow_sky.infra.aws.instances import Member
from airflow_sky.infra.aws.placement import AwsClusterRecords
from airflow_sky.infra.base import Endpoint, Node


class AwsMembers(AwsClusterRecords):
    """Membership is only ever read from EC2 (the tags), never from a record."""

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
        gpus = catalog.accelerator_count("aws", m.instance_type)
        url = instances.console_url(region, m.instance_id)
        return self._endpoint(m).node(rank, m.instance_id, instances.status_of(m), gpus, m.host_key, url)

    def _endpoint(self, m: Member) -> Endpoint:
        return self._endpoint_of(m.instance_id, m.private_ip, m.public_ip)
