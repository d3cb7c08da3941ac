"""AwsCloud on moto (server mode): tags as the only state, idempotent launches, spot, failover, cleanup.

moto plays EC2/SSM/DynamoDB; local nodes play the instances (tests/play_nodes.py, test-only). moto cannot
answer a launch with a capacity error, so those answers come from botocore's Stubber, on run_instances only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra import provisioning
from airflow_sky.infra.aws import instances
from airflow_sky.infra.aws.cloud import AwsCloud
from airflow_sky.infra.aws.settings import settings_from_extra
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.host_keys import host_key_from_console
from airflow_sky.task import Resources
from tests.aws.conftest import REGION, boto, live_instances, moto_image
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture

M6I = Resources(instance_type="m6i.2xlarge")


@pytest.fixture
def cluster(play: dict[str, Any], published_image: str, request: pytest.FixtureRequest) -> Iterator[str]:  # noqa: F811
    name = f"aws-{request.node.name[:24].replace('_', '-').lower()}"
    yield name
    MotoAwsCloud(REGION).terminate(name)


def _instances_of(endpoint: str, cluster: str) -> list[dict[str, Any]]:
    ec2 = boto("ec2", endpoint)
    found = []
    for r in ec2.describe_instances(Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [cluster]}])[
        "Reservations"
    ]:
        found.extend(r["Instances"])
    return found


def test_ranks_come_from_the_instances_tags_and_a_fresh_driver_reads_them_back(
    moto_endpoint: str, cluster: str
) -> None:
    nodes = MotoAwsCloud(REGION).provision(ProvisionRequest(cluster, 3, M6I, job_name="train"))
    tagged = {i["InstanceId"]: instances.tags_of(i) for i in _instances_of(moto_endpoint, cluster)}
    assert sorted(int(t[instances.TAG_RANK]) for t in tagged.values()) == [0, 1, 2]
    assert all(t[instances.TAG_JOB] == "train" and t[instances.TAG_HOST_KEY] for t in tagged.values())
    assert {n.instance_id: n.rank for n in nodes} == {
        i: int(t[instances.TAG_RANK]) for i, t in tagged.items()
    }
    # infra `aws` (no region): the driver finds the region through the placement record
    assert [n.instance_id for n in AwsCloud().nodes(cluster)] == [n.instance_id for n in nodes]
    assert nodes[0].console_url == (  # the node's extra link in the Airflow UI
        f"https://{REGION}.console.aws.amazon.com/ec2/home?region={REGION}#InstanceDetails:instanceId="
        f"{nodes[0].instance_id}"
    )


def test_a_provision_retried_after_its_provisioner_died_gets_the_same_instances(
    moto_endpoint: str, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first provisioner dies right after run_instances (no rank tags, nothing ended). The retry finds
    the instances of that launch by its token (the ClientToken EC2 got, also a tag) instead of making more."""
    dying = MotoAwsCloud(REGION)

    def die(*args: Any) -> None:
        raise SystemExit("provisioner killed")

    monkeypatch.setattr(dying, "_tag_ranks", die)
    monkeypatch.setattr(dying, "_end", lambda *args: None)  # a killed process cleans nothing up
    with pytest.raises(SystemExit):
        dying.provision(ProvisionRequest(cluster, 2, M6I))
    first = _instances_of(moto_endpoint, cluster)
    assert len(first) == 2 and all(instances.TAG_RANK not in instances.tags_of(i) for i in first)
    tokens = {i["ClientToken"] for i in first} | {instances.tags_of(i)[instances.TAG_LAUNCH] for i in first}
    assert len(tokens) == 1

    nodes = MotoAwsCloud(REGION).provision(ProvisionRequest(cluster, 2, M6I))
    assert sorted(n.instance_id for n in nodes) == sorted(i["InstanceId"] for i in first)
    assert len(_instances_of(moto_endpoint, cluster)) == 2
    # ...and the ranks are those of the launch index
    by_index = {int(i["AmiLaunchIndex"]): i["InstanceId"] for i in first}
    assert [n.instance_id for n in nodes] == [by_index[0], by_index[1]]


def test_spot_nodes_are_spot_instances_and_one_terminated_by_aws_is_preempted_then_replaced(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(use_spot=True)))
    assert all(i.get("InstanceLifecycle") == "spot" for i in _instances_of(moto_endpoint, cluster))
    boto("ec2", moto_endpoint).terminate_instances(InstanceIds=[nodes[1].instance_id])  # the interruption
    assert [n.status for n in cloud.nodes(cluster)] == [NodeStatus.RUNNING, NodeStatus.PREEMPTED]

    new = cloud.replace(cluster, 1)
    assert new.rank == 1 and new.status is NodeStatus.RUNNING and new.instance_id != nodes[1].instance_id
    assert [n.instance_id for n in cloud.nodes(cluster)] == [nodes[0].instance_id, new.instance_id]
    assert sorted(live_instances(moto_endpoint, cluster)) == sorted([nodes[0].instance_id, new.instance_id])


def test_the_key_pair_and_security_group_are_made_once_and_open_ssh_to_the_cidr_only(
    moto_endpoint: str, cluster: str, play: dict[str, Any]
) -> None:
    cloud = MotoAwsCloud(REGION)
    ec2 = boto("ec2", moto_endpoint)

    def key_pairs() -> list[str]:
        return [
            k["KeyName"]
            for k in ec2.describe_key_pairs()["KeyPairs"]
            if k["KeyName"].startswith("airflow-sky-")
        ]

    # The moto server is shared by the test files an xdist worker runs: another file's connection may have
    # imported a key of its own before this test; only what these two provisions add counts.
    before = set(key_pairs())
    cloud.provision(ProvisionRequest(cluster, 1, M6I))
    cloud.provision(ProvisionRequest(cluster + "-b", 1, M6I))
    try:
        used = {i["KeyName"] for c in (cluster, cluster + "-b") for i in _instances_of(moto_endpoint, c)}
        assert len(used) == 1, used
        (key_name,) = used
        assert len(set(key_pairs()) - before) <= 1
        assert key_pairs().count(key_name) == 1
        (group,) = ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [f"airflow-sky-{cluster}-nodes"]}]
        )["SecurityGroups"]  # the cluster's own (tests/aws/test_aws_network_isolation.py)
        rules = group["IpPermissions"]
        ssh = [r for r in rules if r.get("FromPort") == 22]
        assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["10.0.0.0/8"]
        assert any(p["GroupId"] == group["GroupId"] for r in rules for p in r.get("UserIdGroupPairs", []))
        assert {i["KeyName"] for i in _instances_of(moto_endpoint, cluster)} == {key_name}
    finally:
        cloud.terminate(cluster + "-b")


class _StubbedCapacity:
    """The EC2 client, except that run_instances first goes through a Stubber holding capacity errors."""

    def __init__(self, real: Any, errors: list[tuple[str, str]]) -> None:
        self._real = real
        self._fake = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
        self.stubber = Stubber(self._fake)
        for subnet, code in errors:
            self.stubber.add_client_error(
                "run_instances",
                service_error_code=code,
                service_message=f"We currently do not have sufficient capacity ({code}).",
                expected_params={**_ANY_LAUNCH, "NetworkInterfaces": [{**_ANY_NIC, "SubnetId": subnet}]},
            )
        self.stubber.activate()
        self.attempts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def run_instances(self, **kwargs: Any) -> Any:
        self.attempts += 1
        if self.stubber._queue:
            return self._fake.run_instances(**kwargs)
        return self._real.run_instances(**kwargs)


_ANY_LAUNCH = {
    k: ANY
    for k in (
        "ImageId",
        "InstanceType",
        "MinCount",
        "MaxCount",
        "KeyName",
        "ClientToken",
        "BlockDeviceMappings",
        "InstanceInitiatedShutdownBehavior",
        "TagSpecifications",
        "MetadataOptions",
        "UserData",
    )
}
_ANY_NIC = {"DeviceIndex": 0, "Groups": ANY, "AssociatePublicIpAddress": ANY}


def _subnet(endpoint: str, zone_name: str) -> str:
    return str(
        boto("ec2", endpoint).describe_subnets(
            Filters=[{"Name": "availability-zone", "Values": [zone_name]}]
        )["Subnets"][0]["SubnetId"]
    )


def _stub_capacity(cloud: AwsCloud, errors: list[tuple[str, str]]) -> _StubbedCapacity:
    stub = _StubbedCapacity(cloud._client("ec2", REGION), errors)
    cloud._clients[("ec2", REGION)] = stub
    return stub


def test_no_capacity_in_a_zone_fails_over_to_the_next_in_the_optimizers_order(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    order = cloud.plan(ProvisionRequest(cluster, 2, M6I))
    names = [cloud.zone_name(REGION, p.zone) for p in order]
    stub = _stub_capacity(
        cloud,
        [
            (_subnet(moto_endpoint, names[0]), "InsufficientInstanceCapacity"),
            (_subnet(moto_endpoint, names[1]), "Unsupported"),
        ],
    )
    nodes = cloud.provision(ProvisionRequest(cluster, 2, M6I))
    stub.stubber.assert_no_pending_responses()
    assert stub.attempts == 3 and len(nodes) == 2
    zones = {i["Placement"]["AvailabilityZone"] for i in _instances_of(moto_endpoint, cluster)}
    assert zones == {names[2]}
    assert cloud.cluster_info(cluster).zone == names[2]


def test_no_capacity_anywhere_fails_naming_the_zones_and_leaves_nothing(
    moto_endpoint: str, cluster: str, play: dict[str, Any]
) -> None:
    cloud = MotoAwsCloud(REGION)
    order = cloud.plan(ProvisionRequest(cluster, 2, M6I))
    names = [cloud.zone_name(REGION, p.zone) for p in order]
    _stub_capacity(cloud, [(_subnet(moto_endpoint, n), "InsufficientInstanceCapacity") for n in names])
    with pytest.raises(ClusterError, match=r"no capacity.*retry-until-up") as failed:
        cloud.provision(ProvisionRequest(cluster, 2, M6I))
    assert all(p.zone in str(failed.value) for p in order[:5])
    assert live_instances(moto_endpoint, cluster) == []
    assert cloud.nodes(cluster) == [] and cloud.state_store(cluster).get("placement") is None


def test_retry_until_up_goes_round_again_after_a_backoff(
    moto_endpoint: str, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provisioning, "RETRY_BACKOFF_S", (0.01, 0.02))
    cloud = MotoAwsCloud(REGION)
    order = cloud.plan(ProvisionRequest(cluster, 1, M6I))
    names = [cloud.zone_name(REGION, p.zone) for p in order]
    stub = _stub_capacity(cloud, [(_subnet(moto_endpoint, n), "InsufficientInstanceCapacity") for n in names])
    nodes = cloud.provision(ProvisionRequest(cluster, 1, M6I, retry_until_up=True))
    assert stub.attempts == len(order) + 1 and nodes[0].status is NodeStatus.RUNNING


def test_a_launch_error_that_is_not_capacity_fails_at_once_and_leaves_nothing(
    moto_endpoint: str, cluster: str
) -> None:
    with pytest.raises(ClusterError, match="image_id: ami-00000000 is not an image in us-east-1"):
        MotoAwsCloud(REGION).provision(ProvisionRequest(cluster, 2, M6I.copy(image_id="ami-00000000")))
    assert live_instances(moto_endpoint, cluster) == []


def test_an_image_per_region_and_an_ssm_parameter_image_are_resolved(
    moto_endpoint: str, cluster: str
) -> None:
    image = moto_image(moto_endpoint)
    boto("ssm", moto_endpoint).put_parameter(
        Name="/team/train-image", Value=image, Type="String", Overwrite=True
    )
    cloud = MotoAwsCloud(REGION)
    cloud.provision(ProvisionRequest(cluster, 1, M6I.copy(image_id="resolve:ssm:/team/train-image")))
    assert {i["ImageId"] for i in _instances_of(moto_endpoint, cluster)} == {image}
    with pytest.raises(SpecError, match="no image for region us-east-1"):
        cloud.provision(ProvisionRequest(cluster + "-x", 1, M6I.copy(image_id={"eu-west-1": image})))


def test_zone_names_and_ids_both_pin_the_zone(moto_endpoint: str, play: dict[str, Any]) -> None:
    by_name = MotoAwsCloud(f"{REGION}/us-east-1a").plan(ProvisionRequest("x", 1, M6I))
    by_id = MotoAwsCloud(f"{REGION}/use1-az6").plan(ProvisionRequest("x", 1, M6I))
    assert {p.zone for p in by_name} == {p.zone for p in by_id} == {"use1-az6"}  # moto: us-east-1a = use1-az6
    with pytest.raises(SpecError, match="us-east-1q is not a zone of us-east-1"):
        MotoAwsCloud(f"{REGION}/us-east-1q").plan(ProvisionRequest("x", 1, M6I))


def test_connection_settings_errors_name_the_connection_and_field() -> None:
    with pytest.raises(SpecError, match=r"'aws_default': extra.airflow_sky: unknown field\(s\) ssh_usr"):
        settings_from_extra("aws_default", {"airflow_sky": {"ssh_usr": "x"}}, None)
    with pytest.raises(SpecError, match=r"extra.airflow_sky.ssh_cidr: not a CIDR block"):
        settings_from_extra("aws_default", {"airflow_sky": {"ssh_cidr": "everyone"}}, None)
    with pytest.raises(SpecError, match=r"extra.airflow_sky.ssh_key_file: .*does not exist"):
        settings_from_extra("aws_default", {"airflow_sky": {"ssh_key_file": "/nonexistent/key"}}, None)


CONSOLE = """\
[   12.345] cloud-init[1234]: Cloud-init v. 23.1 running 'modules:final'
ec2:
ec2: #############################################################
ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
ec2: 256 SHA256:abc root@ip-10-0-0-1 (ECDSA)
ec2: -----END SSH HOST KEY FINGERPRINTS-----
-----BEGIN SSH HOST KEY KEYS-----
ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY= root@ip-10-0-0-1
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2U= root@ip-10-0-0-1
ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== root@ip-10-0-0-1
-----END SSH HOST KEY KEYS-----
"""


def test_the_host_key_is_read_from_cloud_inits_console_block_ed25519_first() -> None:
    assert host_key_from_console(CONSOLE) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2U="
    assert host_key_from_console(CONSOLE.replace("ssh-ed25519", "x-none")) == (
        "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY="
    )
    assert host_key_from_console("[ 1.0] booting") is None


def test_a_rank_is_read_from_the_launch_when_its_own_tag_was_never_written() -> None:
    tags = {instances.TAG_RANKS: "1,3"}
    assert instances.rank_of(tags, 0) == 1 and instances.rank_of(tags, 1) == 3
    assert instances.rank_of({instances.TAG_RANK: "2", **tags}, 0) == 2
    assert instances.rank_of({}, 0) is None


def _shutdown_behavior(endpoint: str, instance_id: str) -> str:
    attribute = boto("ec2", endpoint).describe_instance_attribute(
        InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior"
    )
    return str(attribute["InstanceInitiatedShutdownBehavior"]["Value"])


def test_autostop_makes_a_nodes_own_shutdown_stop_or_end_its_instance(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(autostop={"idle_minutes": 10})))
    assert {_shutdown_behavior(moto_endpoint, n.instance_id) for n in nodes} == {"stop"}
    assert "shutdown -h now" in cloud.autostop_action(cluster, down=False)
    cloud.prepare_autostop(cluster, down=True)  # `-i 10 --down` on the kept cluster
    assert {_shutdown_behavior(moto_endpoint, n.instance_id) for n in nodes} == {"terminate"}
    new = cloud.replace(cluster, 1)  # a replacement behaves like the rest
    assert _shutdown_behavior(moto_endpoint, new.instance_id) == "terminate"


def test_a_cluster_stopped_by_autostop_is_started_again_by_provisioning(
    moto_endpoint: str, cluster: str
) -> None:
    cloud = MotoAwsCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(autostop=5)))
    boto("ec2", moto_endpoint).stop_instances(
        InstanceIds=[n.instance_id for n in nodes]
    )  # the nodes' shutdown
    assert [n.status for n in cloud.nodes(cluster)] == [NodeStatus.STOPPED, NodeStatus.STOPPED]
    again = cloud.provision(ProvisionRequest(cluster, 2, M6I.copy(autostop=5)))
    assert [(n.instance_id, n.status) for n in again] == [(n.instance_id, NodeStatus.RUNNING) for n in nodes]


def test_spot_nodes_can_only_autodown(moto_endpoint: str, cluster: str) -> None:
    cloud = MotoAwsCloud(REGION)
    nodes = cloud.provision(ProvisionRequest(cluster, 1, M6I.copy(use_spot=True, autostop=5)))
    assert _shutdown_behavior(moto_endpoint, nodes[0].instance_id) == "terminate"
    with pytest.raises(SpecError, match="spot instances cannot be stopped"):
        cloud.prepare_autostop(cluster, down=False)


def test_an_instance_profile_in_the_connection_is_every_nodes_bucket_identity(
    moto_endpoint: str, play: dict[str, Any], cluster: str
) -> None:
    import json

    from airflow_sky.node.buckets import bucket_remotes
    from airflow_sky.task.storage import BucketMount
    from tests.envs import patched_environ

    iam = boto("iam", moto_endpoint)
    iam.create_instance_profile(InstanceProfileName="sky-nodes")
    conn = json.loads(json.dumps(play["conn"]))
    conn["extra"]["airflow_sky"]["iam_instance_profile"] = "sky-nodes"
    with patched_environ({"AIRFLOW_CONN_AWS_NODES": json.dumps(conn)}):
        cloud = MotoAwsCloud(REGION, conn_id="aws_nodes")
        cloud.provision(ProvisionRequest(cluster, 1, M6I))
        (instance,) = _instances_of(moto_endpoint, cluster)
        assert instance["IamInstanceProfile"]["Arn"].endswith("/sky-nodes")
        assert cloud.node_bucket_identity() == frozenset({"s3"})
        # The nodes' rclone then uses their role (env_auth) and gets no key from the connection.
        plan = bucket_remotes([BucketMount("/ckpt", "s3", "ckpt")], "aws_nodes", node_identity={"s3"})
        assert plan.remotes["sky-s3"]["env_auth"] == "true"
        assert not {"access_key_id", "secret_access_key", "session_token"} & set(plan.remotes["sky-s3"])
        assert "secret" not in repr(plan) and "<redacted>" in repr(plan)
    assert MotoAwsCloud(REGION).node_bucket_identity() == frozenset()
