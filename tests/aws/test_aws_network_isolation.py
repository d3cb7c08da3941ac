"""Each aws cluster's nodes sit in a security group of their own (moto in server mode): what reaches what.

moto records security groups, their rules and each instance's groups, but does not carry packets; so "A
reaches B on port P" is decided here from what moto holds, the way EC2 decides it: some ingress rule of one
of B's groups admits P from a group A's instance is in, or from a CIDR block holding A's address
(`admits` below). Security groups only allow (no rule denies), so that is the whole decision.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import cluster_network
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.task import Resources
from tests.aws.conftest import REGION, boto, live_instances
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture
from tests.aws.test_aws_ports_disks import _groups_of, _instances
from tests.envs import patched_environ

M6I = Resources(instance_type="m6i.2xlarge")


@pytest.fixture
def clusters(
    play: dict[str, Any],
    published_image: str,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[list[str]]:
    """Names for the test's clusters, which are ended after it whatever happened."""
    base = "aws-" + request.node.name[5:25].replace("_", "-").lower()
    names = [f"{base}-a", f"{base}-b"]
    yield names
    for name in names:
        MotoAwsCloud(REGION).terminate(name)


def _rules(endpoint: str, groups: set[str]) -> list[dict[str, Any]]:
    found = boto("ec2", endpoint).describe_security_groups(GroupIds=sorted(groups))["SecurityGroups"]
    return [rule for g in found for rule in g["IpPermissions"]]


def admits(endpoint: str, target: dict[str, Any], source: dict[str, Any], protocol: str, port: int) -> bool:
    """Whether EC2 lets `source`'s traffic (`protocol`, `port`) into `target`, by `target`'s groups' rules."""
    addresses = [
        ipaddress.ip_address(a) for a in (source.get("PrivateIpAddress"), source.get("PublicIpAddress")) if a
    ]
    for rule in _rules(endpoint, _groups_of(target)):
        if rule["IpProtocol"] not in ("-1", protocol):
            continue
        if rule["IpProtocol"] != "-1" and not rule["FromPort"] <= port <= rule["ToPort"]:
            continue
        if {p["GroupId"] for p in rule.get("UserIdGroupPairs", [])} & _groups_of(source):
            return True
        for block in rule.get("IpRanges", []):
            if any(a in ipaddress.ip_network(block["CidrIp"]) for a in addresses):
                return True
    return False


def _nodes_group(endpoint: str, cluster: str) -> str | None:
    return cluster_network.find_nodes_group(boto("ec2", endpoint), None, cluster)


def test_two_clusters_get_groups_of_their_own_and_neither_admits_the_others_nodes(
    moto_endpoint: str, clusters: list[str]
) -> None:
    a, b = clusters
    cloud = MotoAwsCloud(REGION)
    cloud.provision(ProvisionRequest(a, 2, M6I))
    cloud.provision(ProvisionRequest(b, 2, M6I))
    group_a, group_b = _nodes_group(moto_endpoint, a), _nodes_group(moto_endpoint, b)
    assert group_a and group_b and group_a != group_b
    (a0, a1), (b0, b1) = _instances(moto_endpoint, a), _instances(moto_endpoint, b)
    assert _groups_of(a0) == _groups_of(a1) == {group_a}
    assert _groups_of(b0) == _groups_of(b1) == {group_b}

    # Within a cluster: everything (torchrun's rendezvous, NCCL, UDP); across clusters: nothing, SSH included
    # (the tests' ssh_cidr, 10.0.0.0/8, does not hold the default VPC's addresses).
    for protocol, port in (("tcp", 29500), ("tcp", 22), ("udp", 4791), ("tcp", 8265)):
        assert admits(moto_endpoint, a1, a0, protocol, port) and admits(moto_endpoint, b0, b1, protocol, port)
        for target, source in ((a0, b0), (a1, b1), (b0, a0), (b1, a1)):
            assert not admits(moto_endpoint, target, source, protocol, port), (protocol, port)
    # No rule of either names the other's group.
    for mine, other in ((a0, group_b), (b0, group_a)):
        named = {
            p["GroupId"]
            for r in _rules(moto_endpoint, _groups_of(mine))
            for p in r.get("UserIdGroupPairs", [])
        }
        assert other not in named
    # The group that every cluster shared before is not made (nor joined) any more.
    shared = boto("ec2", moto_endpoint).describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["airflow-sky"]}]
    )["SecurityGroups"]
    assert not {g["GroupId"] for g in shared} & (_groups_of(a0) | _groups_of(b0))

    # A second provision of a cluster finds its group by its tags instead of making another.
    cloud.provision(ProvisionRequest(a, 2, M6I))
    tagged = boto("ec2", moto_endpoint).describe_security_groups(
        Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [a]}]
    )["SecurityGroups"]
    assert [g["GroupId"] for g in tagged] == [group_a]

    # Down: the group goes with the cluster; the other cluster keeps its own.
    cloud.terminate(a)
    assert _nodes_group(moto_endpoint, a) is None and live_instances(moto_endpoint, a) == []
    with pytest.raises(ClientError, match=r"InvalidGroup\.NotFound"):
        boto("ec2", moto_endpoint).describe_security_groups(GroupIds=[group_a])
    assert _nodes_group(moto_endpoint, b) == group_b


def test_a_replaced_node_joins_its_clusters_group_and_reaches_its_siblings_only(
    moto_endpoint: str, clusters: list[str]
) -> None:
    a, b = clusters
    cloud = MotoAwsCloud(REGION)
    cloud.provision(ProvisionRequest(a, 2, M6I.copy(ports=[6006])))
    cloud.provision(ProvisionRequest(b, 1, M6I))
    new = cloud.replace(a, 1)
    (fresh,) = [i for i in _instances(moto_endpoint, a) if i["InstanceId"] == new.instance_id]
    (head,) = [i for i in _instances(moto_endpoint, a) if i["InstanceId"] != new.instance_id]
    (other,) = _instances(moto_endpoint, b)
    assert _nodes_group(moto_endpoint, a) in _groups_of(fresh)
    assert admits(moto_endpoint, head, fresh, "tcp", 29500) and admits(
        moto_endpoint, fresh, head, "tcp", 29500
    )
    assert not admits(moto_endpoint, fresh, other, "tcp", 29500)
    # A's opened port is open to its `port_sources` (0.0.0.0/0 by default: everyone, B's nodes included).
    assert admits(moto_endpoint, fresh, other, "tcp", 6006)


def test_a_teardown_whose_record_is_gone_still_removes_the_group_found_by_its_tags(
    moto_endpoint: str, clusters: list[str]
) -> None:
    a, _ = clusters
    cloud = MotoAwsCloud(REGION)
    cloud.provision(ProvisionRequest(a, 1, M6I))
    assert _nodes_group(moto_endpoint, a) is not None
    cloud.state_store(a).delete_all()  # the record that names the group (and the region) is lost
    MotoAwsCloud("").terminate(a)  # no region pinned: the connection's regions are searched
    assert _nodes_group(moto_endpoint, a) is None and live_instances(moto_endpoint, a) == []


def test_a_security_group_named_in_the_connection_joins_every_node_as_it_is_and_must_exist(
    moto_endpoint: str, clusters: list[str], play: dict[str, Any]
) -> None:
    a, _ = clusters
    ec2 = boto("ec2", moto_endpoint)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    name = f"bastion-{a}"
    conn = json.loads(json.dumps(play["conn"]))
    conn["extra"]["airflow_sky"]["security_group"] = name
    with patched_environ({"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}):
        with pytest.raises(ClusterError, match=rf"security_group: {name}: no such security group in {vpc}"):
            MotoAwsCloud(REGION).provision(ProvisionRequest(a, 1, M6I))
        assert live_instances(moto_endpoint, a) == []
        mine = ec2.create_security_group(GroupName=name, Description="the deployment's", VpcId=vpc)["GroupId"]
        try:
            MotoAwsCloud(REGION).provision(ProvisionRequest(a, 1, M6I))
            (instance,) = _instances(moto_endpoint, a)
            assert _groups_of(instance) == {_nodes_group(moto_endpoint, a), mine}
            (group,) = ec2.describe_security_groups(GroupIds=[mine])["SecurityGroups"]
            assert group["IpPermissions"] == []  # airflow-sky adds nothing to it
            MotoAwsCloud(REGION).terminate(a)
            assert ec2.describe_security_groups(GroupIds=[mine])["SecurityGroups"]  # and never removes it
        finally:
            ec2.delete_security_group(GroupId=mine)
