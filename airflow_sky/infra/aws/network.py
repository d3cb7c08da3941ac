"""What an instance needs around it in a region: the key pair, a subnet, the image, and the deployment's
own security group when the connection names one.

The key pair is created once and found by name afterwards (idempotent, safe for racing provisioners),
named after the public key's fingerprint. Nothing here is per cluster (what is, the nodes' security group
among it: cluster_network.py).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import efa
from airflow_sky.infra.aws.instances import error_code

log = logging.getLogger(__name__)

# The deep-learning images AWS publishes (Ubuntu 22.04, NVIDIA driver, CUDA, Docker), looked up per region
# through their public SSM parameters, so a region always gets its current build. `image_id` overrides:
# an AMI id, or `resolve:ssm:<parameter>` (as EC2 itself accepts).
DEFAULT_IMAGE_PARAMETERS = {
    "x86_64": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "arm64": "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
}
SSM_PREFIX = "resolve:ssm:"
# The group every cluster's nodes shared (all traffic between its members) before each cluster had its own.
SHARED_GROUP = "airflow-sky"


def launch_network(
    ec2: Any,
    region: str,
    zone_name: str,
    public_key: str,
    groups: Sequence[str],
    public_ip: bool,
    *,
    efa_type: str | None = None,
) -> dict[str, Any]:
    """The run_instances arguments that place instances in the zone: the key pair (found, or imported
    once), and one interface in the zone's subnet of the default VPC in `groups` (the cluster's nodes
    group first: cluster_network.py). `efa_type`: `network_tier: best`, the EFA interfaces of that type,
    each further one in the nodes group alone (the group that lets EFA traffic through)."""
    key_name = ensure_key_pair(ec2, public_key)
    subnet = subnet_in_zone(ec2, default_vpc(ec2, region), zone_name)
    if efa_type is not None:
        interfaces = efa.network_interfaces(efa_type, subnet, list(groups), list(groups[:1]), public_ip)
    else:
        interfaces = [
            {
                "DeviceIndex": 0,
                "SubnetId": subnet,
                "Groups": list(groups),
                "AssociatePublicIpAddress": public_ip,
            }
        ]
    return {"KeyName": key_name, "NetworkInterfaces": interfaces}


def key_pair_name(public_key: str) -> str:
    """A key pair name derived from the key itself, so one key is imported once per region."""
    blob = base64.b64decode(public_key.split()[1])
    return "airflow-sky-" + hashlib.sha256(blob).hexdigest()[:16]


def ensure_key_pair(ec2: Any, public_key: str) -> str:
    name = key_pair_name(public_key)
    try:
        ec2.describe_key_pairs(KeyNames=[name])
        return name
    except ClientError as e:
        if error_code(e) != "InvalidKeyPair.NotFound":
            raise
    try:
        ec2.import_key_pair(
            KeyName=name,
            PublicKeyMaterial=public_key.encode(),
            TagSpecifications=[
                {"ResourceType": "key-pair", "Tags": [{"Key": "airflow-sky", "Value": "key"}]}
            ],
        )
    except ClientError as e:
        if error_code(e) != "InvalidKeyPair.Duplicate":  # another provisioner imported it first
            raise
    return name


def default_vpc(ec2: Any, region: str) -> str:
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise ClusterError(
            f"aws: region {region} has no default VPC; create one (aws ec2 create-default-vpc --region {region})"
        )
    return str(vpcs[0]["VpcId"])


def deployment_group(ec2: Any, vpc_id: str, name: str) -> str | None:
    """The connection's `security_group`, added to every node as it is (the deployment's own rules: a
    bastion, a monitoring host); airflow-sky adds no rule to it. None for the default name: the group every
    cluster shared before clusters had their own, which no node joins any more."""
    if name == SHARED_GROUP:
        return None
    by = "group-id" if name.startswith("sg-") else "group-name"
    found = ec2.describe_security_groups(
        Filters=[{"Name": by, "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
    )["SecurityGroups"]
    if not found:
        raise ClusterError(
            f"security_group: {name}: no such security group in {vpc_id}; create it (every node joins it as "
            f"it is), or remove the setting (each cluster has a group of its own)"
        )
    group = found[0]
    group_id = str(group["GroupId"])
    if any(
        p.get("GroupId") == group_id
        for rule in group.get("IpPermissions", [])
        for p in rule.get("UserIdGroupPairs", [])
    ):
        log.warning(
            "aws: security_group %s admits traffic from its own members, and the nodes of every cluster are "
            "members: they reach each other through it; revoke that rule (each cluster's nodes group lets its "
            "own nodes talk)",
            name,
        )
    return group_id


def subnet_in_zone(ec2: Any, vpc_id: str, zone: str) -> str:
    subnets = ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "availability-zone", "Values": [zone]},
        ]
    )["Subnets"]
    if not subnets:
        raise ClusterError(f"aws: the default VPC {vpc_id} has no subnet in {zone}")
    default = [s for s in subnets if s.get("DefaultForAz")]
    return str((default or subnets)[0]["SubnetId"])


def architecture(ec2: Any, instance_type: str) -> str:
    try:
        info = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except ClientError as e:
        raise ClusterError(
            f"aws: instance type {instance_type} is not offered here: {error_code(e) or e}"
        ) from e
    arches = info[0]["ProcessorInfo"]["SupportedArchitectures"] if info else ["x86_64"]
    return "arm64" if "arm64" in arches and "x86_64" not in arches else "x86_64"


def resolve_image(
    ec2: Any,
    ssm: Any,
    image_id: str | None,
    instance_type: str,
    region: str,
    defaults: dict[str, str] = DEFAULT_IMAGE_PARAMETERS,
) -> tuple[str, str]:
    """(AMI id, root device name) for the launch: `image_id`, or the region's deep-learning image."""
    parameter = None
    if image_id is None:
        parameter = defaults[architecture(ec2, instance_type)]
    elif image_id.startswith(SSM_PREFIX):
        parameter = image_id[len(SSM_PREFIX) :]
    ami = image_id
    if parameter is not None:
        try:
            ami = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as e:
            raise ClusterError(f"image_id: cannot read SSM parameter {parameter} in {region}: {e}") from e
    assert ami is not None
    try:
        images = ec2.describe_images(ImageIds=[ami])["Images"]
    except ClientError as e:
        raise ClusterError(f"image_id: {ami} is not an image in {region}: {error_code(e) or e}") from e
    if not images:
        raise ClusterError(f"image_id: {ami} is not an image in {region}")
    return ami, str(images[0].get("RootDeviceName") or "/dev/sda1")
