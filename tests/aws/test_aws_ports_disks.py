"""`ports`, `disk_tier` and `labels` on aws (moto in server mode): what the cluster's nodes are made with.

moto records security groups and their rules, the instances' groups, tags and the volumes' type and tags;
it keeps no IOPS or throughput of its own (a volume shows 3000 IOPS whatever was asked), so those two are
asserted on the RunInstances request the driver sent, caught by a botocore event hook on its own client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra.aws import cluster_network, launch_spec
from airflow_sky.infra.aws.settings import settings_from_extra
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.cluster import Cluster
from airflow_sky.task import Resources
from tests.aws.conftest import REGION, boto, live_instances
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture
from tests.envs import patched_environ

M6I = Resources(instance_type="m6i.2xlarge")


@pytest.fixture
def cluster(play: dict[str, Any], published_image: str, request: pytest.FixtureRequest) -> Iterator[str]:  # noqa: F811
    """A name for the test's cluster, which is ended after it whatever happened."""
    yield (name := "aws-" + request.node.name[5:29].replace("_", "-").lower())
    MotoAwsCloud(REGION).terminate(name)


def _instances(endpoint: str, cluster: str) -> list[dict[str, Any]]:
    found = boto("ec2", endpoint).describe_instances(
        Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [cluster]}]
    )["Reservations"]
    return [i for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def _ports_group(endpoint: str, cluster: str) -> list[dict[str, Any]]:
    return list(
        boto("ec2", endpoint).describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [cluster_network.ports_group_name(cluster)]}]
        )["SecurityGroups"]
    )


def _groups_of(instance: dict[str, Any]) -> set[str]:
    return {g["GroupId"] for n in instance["NetworkInterfaces"] for g in n["Groups"]}


def _opened(group: dict[str, Any]) -> list[tuple[str, int, int, list[str]]]:
    return sorted(
        (r["IpProtocol"], r["FromPort"], r["ToPort"], sorted(c["CidrIp"] for c in r.get("IpRanges", [])))
        for r in group["IpPermissions"]
    )


def test_ports_open_exactly_those_on_the_clusters_own_group_and_teardown_removes_it(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(ports=[6006, 8265])))

    (group,) = _ports_group(moto_endpoint, cluster)
    assert _opened(group) == [("tcp", 6006, 6006, ["0.0.0.0/0"]), ("tcp", 8265, 8265, ["0.0.0.0/0"])]
    # every node's interface is in it (and in the cluster's nodes group, which opens no port of a task)
    for instance in _instances(moto_endpoint, cluster):
        assert group["GroupId"] in _groups_of(instance)
    (nodes,) = boto("ec2", moto_endpoint).describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [cluster_network.nodes_group_name(cluster)]}]
    )["SecurityGroups"]
    assert not [r for r in nodes["IpPermissions"] if r.get("FromPort") in (6006, 8265)]
    # any worker reads them back from the cluster's record (what `status --endpoints` lists)
    assert MotoAwsCloud(REGION).opened_ports(cluster) == ("6006", "8265")

    cloud.terminate(cluster)
    assert _ports_group(moto_endpoint, cluster) == [] and live_instances(moto_endpoint, cluster) == []


def test_port_sources_from_the_connection_and_a_range_are_what_is_opened(
    moto_endpoint: str, cluster: str, play: dict[str, Any]
) -> None:
    conn = json.loads(json.dumps(play["conn"]))
    conn["extra"]["airflow_sky"]["port_sources"] = ["203.0.113.0/24", "198.51.100.7/32"]
    with patched_environ({"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}):
        cloud = MotoAwsCloud(REGION)
        cloud.provision(ProvisionRequest(cluster, 1, M6I.copy(ports=["10000-10010"])))
        (group,) = _ports_group(moto_endpoint, cluster)
        assert _opened(group) == [("tcp", 10000, 10010, ["198.51.100.7/32", "203.0.113.0/24"])]
        assert cloud.opened_ports(cluster) == ("10000-10010",)


def test_port_sources_that_are_not_cidr_blocks_are_refused_naming_the_field() -> None:
    extra = {"airflow_sky": {"ssh_key_file": "/k", "port_sources": ["office"]}}
    with pytest.raises(SpecError, match=r"extra\.airflow_sky\.port_sources: 'office' is not a CIDR block"):
        settings_from_extra("aws_default", extra, "us-east-1")
    extra = {"airflow_sky": {"ssh_key_file": "/k", "port_sources": "0.0.0.0/0"}}
    with pytest.raises(SpecError, match=r"port_sources: must be a non-empty list of CIDR blocks"):
        settings_from_extra("aws_default", extra, "us-east-1")


def test_disk_tier_and_labels_are_on_the_volumes_and_instances_beside_the_clusters_own_tags(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    sent: list[dict[str, Any]] = []
    cloud._client("ec2", REGION).meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: sent.append(dict(params))
    )
    labels = {"team": "vision", "cost-center": "42"}
    cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(disk_tier="high", labels=labels), job_name="train"))

    ec2 = boto("ec2", moto_endpoint)
    for instance in _instances(moto_endpoint, cluster):
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags.items() >= labels.items()
        assert tags["airflow-sky-cluster"] == cluster and tags["airflow-sky-job"] == "train"
        assert tags["airflow-sky-rank"] in ("0", "1") and tags["Name"].startswith(cluster)
        (mapping,) = instance["BlockDeviceMappings"]
        (volume,) = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"]
        assert volume["VolumeType"] == "gp3"
        assert {t["Key"]: t["Value"] for t in volume["Tags"]} == {**labels, "airflow-sky-cluster": cluster}
    (request,) = sent
    ebs = request["BlockDeviceMappings"][0]["Ebs"]
    assert (ebs["VolumeType"], ebs["Iops"], ebs["Throughput"]) == ("gp3", 7000, 437)  # SkyPilot's `high`


def test_a_replacement_node_gets_the_clusters_ports_disk_tier_and_labels(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    nodes = cloud.provision(
        ProvisionRequest(cluster, 2, M6I.copy(ports=[6006], disk_tier="low", labels={"team": "nlp"}))
    )
    new = cloud.replace(cluster, 1)
    (instance,) = [i for i in _instances(moto_endpoint, cluster) if i["InstanceId"] == new.instance_id]
    (group,) = _ports_group(moto_endpoint, cluster)
    assert group["GroupId"] in _groups_of(instance)
    assert {t["Key"]: t["Value"] for t in instance["Tags"]}["team"] == "nlp"
    volume_id = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    (volume,) = boto("ec2", moto_endpoint).describe_volumes(VolumeIds=[volume_id])["Volumes"]
    assert volume["VolumeType"] == "standard"  # `low`
    assert new.instance_id != nodes[1].instance_id


def test_labels_that_would_replace_the_clusters_own_tags_are_refused_naming_them(
    moto_endpoint: str, cluster: str
) -> None:
    labels = {"airflow-sky-rank": "0", "Name": "mine", "aws:cloudformation:stack": "x", "team": "ok"}
    with pytest.raises(SpecError) as refused:
        MotoAwsCloud(REGION).provision(ProvisionRequest(cluster, 1, M6I.copy(labels=labels)))
    assert str(refused.value).startswith(
        "resources.labels: Name, airflow-sky-rank, aws:cloudformation:stack: reserved on aws"
    )
    assert live_instances(moto_endpoint, cluster) == []


def test_disk_tiers_map_as_skypilot_maps_them() -> None:
    assert launch_spec.disk_spec(None) == {"VolumeType": "gp3"}  # no tier: as before, EBS's gp3 baseline
    assert launch_spec.disk_spec("low") == {"VolumeType": "standard"}
    assert launch_spec.disk_spec("medium") == {"VolumeType": "gp3", "Iops": 3500, "Throughput": 218}
    assert launch_spec.disk_spec("ultra") == {"VolumeType": "io2", "Iops": 20000}
    assert launch_spec.disk_spec("best") == launch_spec.disk_spec("ultra")


def test_ipv4_and_ipv6_sources_become_one_rule_per_port() -> None:
    rules = cluster_network.rules_for(["6006", "10000-10010"], ["0.0.0.0/0", "::/0"])
    assert rules == [
        {
            "IpProtocol": "tcp",
            "FromPort": 6006,
            "ToPort": 6006,
            "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
        },
        {
            "IpProtocol": "tcp",
            "FromPort": 10000,
            "ToPort": 10010,
            "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
        },
    ]


def test_a_group_is_deleted_once_ec2_lets_go_of_it_and_a_teardown_that_waited_too_long_says_so() -> None:
    """EC2 refuses to delete a group while the cluster's instances are still ending (moto ends them at
    once, so EC2's refusals are played here by ClientErrors with EC2's codes)."""
    answers = ["DependencyViolation", "DependencyViolation", None]
    calls: list[str | None] = []

    def delete() -> None:
        code = answers[len(calls)]
        calls.append(code)
        if code is not None:
            raise ClientError({"Error": {"Code": code, "Message": code}}, "DeleteSecurityGroup")

    cluster_network.when_released(delete, "security group sg-1", 60, 0.01, lambda: False)
    assert calls == ["DependencyViolation", "DependencyViolation", None]

    with pytest.raises(ClusterError, match=r"placement group pg-1 is still in use 0 s after .* again"):
        cluster_network.when_released(lambda: None, "placement group pg-1", 0, 0.01, lambda: True)


def test_a_reused_cluster_asked_for_more_ports_opens_them_on_the_nodes_it_has(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    (node,) = Cluster(cluster, "aws", cloud).provision(1, M6I)
    assert _ports_group(moto_endpoint, cluster) == []  # no ports asked: no group

    # A later launch onto it asks ports: nothing is launched, the running node gets them.
    Cluster(cluster, "aws", cloud).provision(1, M6I.copy(ports=[6006]))
    Cluster(cluster, "aws", cloud).provision(1, M6I.copy(ports=[8265]))  # more: the union (SkyPilot's rule)
    (instance,) = _instances(moto_endpoint, cluster)
    assert instance["InstanceId"] == node.instance_id
    (group,) = _ports_group(moto_endpoint, cluster)
    assert _opened(group) == [("tcp", 6006, 6006, ["0.0.0.0/0"]), ("tcp", 8265, 8265, ["0.0.0.0/0"])]
    assert group["GroupId"] in _groups_of(instance)
    assert MotoAwsCloud(REGION).opened_ports(cluster) == ("6006", "8265")
