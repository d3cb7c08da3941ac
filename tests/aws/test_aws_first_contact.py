"""aws first contact without trust-on-first-use: a launch hands its instances a host key in their user data
and pins it before anyone connects (moto in server mode; real OpenSSH servers play the instances).

The machines: moto's instances are not machines, so a real `sshd` (tests/ssh/sshd.py) plays each one, and
this module's resolver (AIRFLOW_SKY_AWS_ENDPOINT_RESOLVER) gives the driver its address. A machine that
plays an instance as an EC2 one does reads the instance's user data back from moto, parses it as cloud-init
does (YAML) and serves the host key it names; one that plays an image ignoring user data keeps a key of its
own. moto's console output is fake (no cloud-init blocks), so the console fingerprint path gets its console
text from the test and its machine from a real sshd.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import asyncssh
import pytest
import yaml

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import instances, pinning
from airflow_sky.infra.aws.cloud import ENDPOINT_RESOLVER_ENV
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.node.client import NodeClient
from airflow_sky.task import Resources
from tests.aws.conftest import REGION, boto, live_instances, moto_connection
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture
from tests.envs import patched_environ
from tests.ssh.sshd import PORT, SshdPool

M6I = Resources(instance_type="m6i.2xlarge")
_MACHINES: dict[str, Any] = {}  # what the resolver reads: the pool, moto's endpoint, who plays what


def resolve(instance_id: str) -> dict[str, Any]:
    """The machine playing `instance_id` (the next free sshd host), started on first ask."""
    assigned: dict[str, Any] = _MACHINES["assigned"]
    if instance_id not in assigned:
        host = _MACHINES["pool"].hosts[len(assigned) % len(_MACHINES["pool"].hosts)]
        if _MACHINES["honours_user_data"]:
            key = host_key_in_user_data(_MACHINES["endpoint"], instance_id)
            (host.dir / "host_key").write_text(key)
            os.chmod(host.dir / "host_key", 0o600)
            public = asyncssh.import_private_key(key).export_public_key().decode()
            (host.dir / "host_key.pub").write_text(public)
        else:
            for name in ("host_key", "host_key.pub"):  # a key of its own, made at start
                (host.dir / name).unlink(missing_ok=True)
        host.restart()
        assigned[instance_id] = host
    host = assigned[instance_id]
    return {"host": host.address, "port": PORT, "user": host.user, "internal_ip": host.address}


def host_key_in_user_data(endpoint: str, instance_id: str) -> str:
    """The ed25519 host key the instance's user data gives cloud-init (`ssh_keys`), read as cloud-init does."""
    attribute = boto("ec2", endpoint).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData"
    )
    text = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert text.startswith("#cloud-config\n")
    config = yaml.safe_load(text)
    assert config["ssh_deletekeys"] is True and config["ssh_genkeytypes"] == []
    return str(config["ssh_keys"]["ed25519_private"])


@pytest.fixture(scope="module")
def machines(moto_endpoint: str, published_image: str) -> Iterator[SshdPool]:  # noqa: F811
    pool = SshdPool(2, "awsfc", subnet=3).start()
    conn = moto_connection(moto_endpoint, str(pool.client_key))
    env = {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
        ENDPOINT_RESOLVER_ENV: f"{__name__}:resolve",
    }
    _MACHINES.update(pool=pool, endpoint=moto_endpoint)
    try:
        with patched_environ(env):
            yield pool
    finally:
        pool.stop()


@pytest.fixture
def cluster(machines: SshdPool, request: pytest.FixtureRequest) -> Iterator[str]:
    _MACHINES.update(assigned={}, honours_user_data=True)
    yield (name := "aws-fc-" + request.node.name[5:25].replace("_", "-").lower())
    MotoAwsCloud(REGION).terminate(name)


def _tags(endpoint: str, instance_id: str) -> dict[str, str]:
    (reservation,) = boto("ec2", endpoint).describe_instances(InstanceIds=[instance_id])["Reservations"]
    return instances.tags_of(reservation["Instances"][0])


def test_the_launch_pins_the_host_key_it_hands_its_instances_and_ssh_checks_it_from_the_first_contact(
    moto_endpoint: str, cluster: str, machines: SshdPool
) -> None:
    cloud = MotoAwsCloud(REGION)
    cloud.console_timeout_s = 0  # the console is never read: the key is known from the launch
    nodes = cloud.provision(ProvisionRequest(cluster, 2, M6I))

    (key,) = {n.host_key for n in nodes}  # one key per launch, its instances share it
    for node in nodes:
        tags = _tags(moto_endpoint, node.instance_id)
        assert (tags[instances.TAG_HOST_KEY], tags[instances.TAG_HOST_KEY_SOURCE]) == (key, "user-data")
        with NodeClient(node, str(machines.client_key), conn_retry_attempts=1) as client:
            assert client.exec("echo ok")[:2] == (0, b"ok\n")
    # The key the sshd serves is the one the user data names, and nothing else was pinned.
    assert key is not None and key.startswith("ssh-ed25519 ")
    assert {machines.hosts[i].public_host_key() for i in range(2)} == {key}


def test_a_machine_that_presents_another_key_than_its_launch_gave_is_refused_and_nothing_is_left(
    moto_endpoint: str, cluster: str
) -> None:
    _MACHINES["honours_user_data"] = False  # an image without cloud-init, or a machine in its place
    cloud = MotoAwsCloud(REGION)
    cloud.ssh_timeout_s = 3
    with pytest.raises(ClusterError, match=r"does not answer SSH.*not the key pinned"):
        cloud.provision(ProvisionRequest(cluster, 1, M6I))
    assert live_instances(moto_endpoint, cluster) == []


CONSOLE = """\
[   42.1] cloud-init[911]: Cloud-init v. 24.1 running 'modules:final'
ec2:
ec2: #############################################################
ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
ec2: 256 {fp} root@ip-172-31-0-10 (ED25519)
ec2: 256 SHA256:7Vq3oDAt9lI4bn1oAqm2M6/Ih2RTP1ohN5zLW+v3hN8 root@ip-172-31-0-10 (ECDSA)
ec2: -----END SSH HOST KEY FINGERPRINTS-----
ec2: #############################################################
"""


def test_an_untagged_instance_is_pinned_only_to_a_key_its_console_fingerprints_name(
    machines: SshdPool,
) -> None:
    host = machines.hosts[0]
    host.restart()
    presented = host.public_host_key()
    console = CONSOLE.format(fp=pinning.fingerprint(presented))
    assert pinning.console_fingerprints(console) == {
        pinning.fingerprint(presented),
        "SHA256:7Vq3oDAt9lI4bn1oAqm2M6/Ih2RTP1ohN5zLW+v3hN8",
    }
    fingerprints = pinning.console_fingerprints(console)
    assert pinning.first_contact_key("i-1", host.address, PORT, fingerprints, 30, 0.2) == presented

    other = pinning.fingerprint(pinning.new_host_key().public)
    with pytest.raises(
        ClusterError, match=r"presents host key SHA256:.*not one of those i-1's console printed"
    ):
        pinning.first_contact_key("i-1", host.address, PORT, {other}, 30, 0.2)
    # A console that shows nothing: no key is taken at first contact at all (no trust on first use).
    with pytest.raises(ClusterError, match=r"i-1: its host key is known neither from its launch nor"):
        pinning.first_contact_key("i-1", host.address, PORT, set(), 30, 0.2)


def test_moto_console_output_without_cloud_inits_blocks_gives_no_key_and_no_fingerprint(
    moto_endpoint: str,
) -> None:
    (instance,) = boto("ec2", moto_endpoint).run_instances(
        ImageId=boto("ec2", moto_endpoint).describe_images()["Images"][0]["ImageId"], MinCount=1, MaxCount=1
    )["Instances"]
    try:
        found = pinning.console_host_keys(boto("ec2", moto_endpoint), instance["InstanceId"], 0, 0.1)
        assert found == (None, set())
    finally:
        boto("ec2", moto_endpoint).terminate_instances(InstanceIds=[instance["InstanceId"]])
