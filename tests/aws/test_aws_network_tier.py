"""`network_tier: best` on aws (moto in server mode): a cluster placement group, EFA interfaces, the EFA
security-group rule, NCCL over EFA in every rank's env, and the group removed at teardown.

What moto (5.2) does not play, and what these tests do instead:
- placement groups: moto implements no placement-group call (CreatePlacementGroup answers "not
  implemented") and drops `Placement.GroupName` at launch (DescribeInstances shows ""). `_PlacementGroups`
  below, a test-only stand-in, keeps the groups (create, delete, in use while an instance launched into
  it lives); every other call goes to moto.
- EFA interfaces: moto makes the interfaces but records each as InterfaceType "interface" on network card
  0, so the interface types and cards are asserted on the RunInstances request the driver sent.
Everything else (instances, their type, tags, the security group's rules) is read back from moto.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_sky.client.cli import main
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import phase_env
from airflow_sky.infra import optimizer
from airflow_sky.infra.aws import efa
from airflow_sky.infra.aws.cloud import AwsCloud
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.cluster import Cluster
from airflow_sky.task import Resources, Task
from tests.aws.conftest import REGION, boto, live_instances
from tests.aws.test_aws_contract import MotoAwsCloud, _ThirdNeverAnswers, published_image  # noqa: F401
from tests.envs import patched_environ

A100x8_BEST = Resources(accelerators="A100:8", network_tier="best")


class _PlacementGroups:
    """The EC2 client, with placement groups kept here (moto has none; see the module's docstring)."""

    def __init__(self, real: Any, groups: dict[str, str], launched: dict[str, str]) -> None:
        self._real = real
        self.groups = groups  # name -> strategy
        self.launched = launched  # instance id -> the group it was launched into
        self.sent: list[dict[str, Any]] = []  # every RunInstances request, as sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @staticmethod
    def _error(code: str, operation: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, operation)

    def create_placement_group(self, GroupName: str, Strategy: str, **_: Any) -> dict[str, Any]:
        if GroupName in self.groups:
            raise self._error("InvalidPlacementGroup.Duplicate", "CreatePlacementGroup")
        self.groups[GroupName] = Strategy
        return {}

    def delete_placement_group(self, GroupName: str) -> dict[str, Any]:
        if GroupName not in self.groups:
            raise self._error("InvalidPlacementGroup.Unknown", "DeletePlacementGroup")
        inside = [i for i, g in self.launched.items() if g == GroupName]
        if inside and live_instances_by_id(self._real, inside):
            raise self._error("InvalidPlacementGroup.InUse", "DeletePlacementGroup")
        del self.groups[GroupName]
        return {}

    def run_instances(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        group = kwargs.get("Placement", {}).get("GroupName")
        if group is not None and group not in self.groups:
            raise self._error("InvalidPlacementGroup.Unknown", "RunInstances")
        response: dict[str, Any] = self._real.run_instances(**kwargs)
        if group is not None:
            self.launched.update({i["InstanceId"]: group for i in response["Instances"]})
        return response


def live_instances_by_id(ec2: Any, ids: list[str]) -> list[str]:
    found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return [i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated"]


@pytest.fixture
def groups() -> tuple[dict[str, str], dict[str, str]]:
    return {}, {}  # the stand-in's state, shared by every driver of one test (as EC2's is)


def with_groups(cloud: AwsCloud, state: tuple[dict[str, str], dict[str, str]]) -> _PlacementGroups:
    stand_in = _PlacementGroups(cloud._client("ec2", REGION), *state)
    cloud._clients[("ec2", REGION)] = stand_in
    return stand_in


@pytest.fixture
def cluster(
    play: dict[str, Any],
    published_image: str,  # noqa: F811
    request: pytest.FixtureRequest,
    groups: tuple[dict[str, str], dict[str, str]],
) -> Iterator[str]:
    name = f"aws-{request.node.name[5:29].replace('_', '-').lower()}"
    yield name
    cloud = MotoAwsCloud(REGION)
    with_groups(cloud, groups)
    cloud.terminate(name)


@pytest.fixture
def private_ips(play: dict[str, Any]) -> Iterator[None]:
    """The connection with use_private_ip (Airflow inside the VPC): a node may have all its EFA interfaces.
    SSH still reaches the play nodes through the emulator's resolver."""
    conn = json.loads(json.dumps(play["conn"]))
    conn["extra"]["airflow_sky"]["use_private_ip"] = True
    with patched_environ({"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}):
        yield


def test_best_puts_four_a100_nodes_in_one_placement_group_with_all_efa_interfaces_and_nccl_env(
    moto_endpoint: str, cluster: str, groups: tuple[dict[str, str], dict[str, str]], private_ips: None
) -> None:
    cloud = MotoAwsCloud(REGION)
    ec2 = with_groups(cloud, groups)
    nodes = cloud.provision(ProvisionRequest(cluster, 4, A100x8_BEST))

    assert len(nodes) == 4
    assert groups[0] == {f"airflow-sky-{cluster}": "cluster"}  # one cluster placement group
    # From moto: four p4d.24xlarge instances (the A100:8 type with EFA), the cluster's.
    moto_ec2 = boto("ec2", moto_endpoint)
    launched = moto_ec2.describe_instances(InstanceIds=[n.instance_id for n in nodes])["Reservations"]
    assert {i["InstanceType"] for r in launched for i in r["Instances"]} == {"p4d.24xlarge"}
    # From the request sent (moto drops both): all four into the group, each with p4d's 4 EFA interfaces.
    (sent,) = ec2.sent
    assert sent["Placement"] == {"GroupName": f"airflow-sky-{cluster}"} and sent["MaxCount"] == 4
    nics = sent["NetworkInterfaces"]
    assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in nics] == [
        (0, 0, "efa"),
        (1, 1, "efa-only"),
        (2, 1, "efa-only"),
        (3, 1, "efa-only"),
    ]
    # From moto: the cluster's nodes group (first on the primary interface) lets all traffic out to its own members, as EFA needs.
    (group,) = moto_ec2.describe_security_groups(GroupIds=nics[0]["Groups"][:1])["SecurityGroups"]
    assert any(
        r["IpProtocol"] == "-1" and group["GroupId"] in [p["GroupId"] for p in r.get("UserIdGroupPairs", [])]
        for r in group["IpPermissionsEgress"]
    )

    # Any worker reads the NCCL env from the cluster's record: a fresh driver, through the Cluster whose
    # env gang/phases.py gives every rank's setup and run (the task's own envs win over it).
    on_worker = Cluster(cluster, "aws", MotoAwsCloud(REGION))
    assert on_worker.network_env() == efa.nccl_env("p4d.24xlarge")
    task = Task.from_dict({"run": "true", "num_nodes": 4, "envs": {"NCCL_SOCKET_IFNAME": "ens32"}})
    handle = JobHandle(cluster, "aws", 1, "sky-1", tuple(on_worker.nodes()), 4)
    for rank in range(4):
        env = phase_env(on_worker, task, handle, "run", rank)
        assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        assert env["FI_EFA_FORK_SAFE"] == "1" and env["SKYPILOT_NODE_RANK"] == str(rank)
        assert env["NCCL_SOCKET_IFNAME"] == "ens32"

    cloud.terminate(cluster)
    assert groups[0] == {} and live_instances(moto_endpoint, cluster) == []


def test_with_public_addresses_a_best_node_gets_one_efa_interface_as_ec2_allows() -> None:
    nics = efa.network_interfaces("p5.48xlarge", "subnet-1", ["sg-1"], ["sg-1"], public_ip=True)
    assert [(n["InterfaceType"], n["AssociatePublicIpAddress"]) for n in nics] == [("efa", True)]
    full = efa.network_interfaces("p5.48xlarge", "subnet-1", ["sg-1", "sg-ports"], ["sg-1"], public_ip=False)
    assert len(full) == 32 and [n["NetworkCardIndex"] for n in full] == list(range(32))
    # P5: EFA with ENA on every fourth card, EFA-only on the others; only the primary has the ports group.
    assert [n["NetworkCardIndex"] for n in full if n["InterfaceType"] == "efa"] == [
        0,
        4,
        8,
        12,
        16,
        20,
        24,
        28,
    ]
    assert [n["Groups"] for n in full[:2]] == [["sg-1", "sg-ports"], ["sg-1"]]


def test_a_best_provision_that_fails_half_way_removes_its_placement_group_and_instances(
    moto_endpoint: str, cluster: str, groups: tuple[dict[str, str], dict[str, str]]
) -> None:
    cloud = _ThirdNeverAnswers()
    cloud.ssh_timeout_s = 2
    with_groups(cloud, groups)
    with pytest.raises(ClusterError):
        cloud.provision(ProvisionRequest(cluster, 4, A100x8_BEST))
    assert groups[0] == {}
    assert live_instances(moto_endpoint, cluster) == []
    assert cloud.state_store(cluster).get("placement") is None


def test_best_on_a_type_without_efa_is_refused_naming_it_and_nothing_is_made(
    moto_endpoint: str, cluster: str, groups: tuple[dict[str, str], dict[str, str]]
) -> None:
    cloud = MotoAwsCloud(REGION)
    ec2 = with_groups(cloud, groups)
    with pytest.raises(SpecError) as refused:
        cloud.provision(
            ProvisionRequest(cluster, 2, Resources(instance_type="g5.xlarge", network_tier="best"))
        )
    assert str(refused.value).startswith("resources.network_tier: best: ")
    assert "aws g5.xlarge: has no EFA" in str(refused.value)
    assert ec2.sent == [] and groups[0] == {} and live_instances(moto_endpoint, cluster) == []
    # `standard` (or no tier) on the same type launches as before: no group, one plain interface.
    cloud.provision(
        ProvisionRequest(cluster, 1, Resources(instance_type="g5.xlarge", network_tier="standard"))
    )
    (sent,) = ec2.sent
    assert "Placement" not in sent and [n.get("InterfaceType") for n in sent["NetworkInterfaces"]] == [None]
    assert cloud.network_env(cluster) == {}


def test_the_optimizer_prefers_sizes_with_efa_and_dryrun_says_what_best_gives(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # T4:1: g4dn.xlarge is the cheapest, but only the 8xlarge and larger have EFA.
    plain = optimizer.plan(Resources(accelerators="T4:1", infra="aws"), 2)
    best = optimizer.plan(Resources(accelerators="T4:1", infra="aws", network_tier="best"), 2)
    assert plain[0].offering.instance_type == "g4dn.xlarge"
    assert {c.offering.instance_type for c in best} == {"g4dn.8xlarge", "g4dn.16xlarge"}

    task = tmp_path / "task.yaml"
    task.write_text(
        "resources:\n  infra: aws\n  accelerators: A100:8\n  network_tier: best\nnum_nodes: 4\nrun: echo\n"
    )
    assert main(["launch", str(task), "--dryrun"]) == 0
    out = capsys.readouterr().out
    assert "p4d.24xlarge" in out
    assert (
        "network_tier: best: p4d.24xlarge with 4 EFA interface(s), all nodes in one cluster placement" in out
    )

    task.write_text("resources:\n  infra: aws\n  accelerators: V100:1\n  network_tier: best\nrun: echo\n")
    assert main(["launch", str(task), "--dryrun"]) == 2
    err = capsys.readouterr().err
    assert (
        "resources.network_tier: best: no instance that fits can honour it: aws p3.2xlarge: has no EFA" in err
    )
