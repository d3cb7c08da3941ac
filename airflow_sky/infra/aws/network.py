"""What an instance needs around it in a region: the key pair, the security group, a subnet, the image.

All created once and found by name afterwards (idempotent, safe for racing provisioners): the key pair is
named after the public key's fingerprint, the security group after the setting (`airflow-sky`) in the
region's default VPC. Nothing here is per cluster (what is: cluster_network.py).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import efa
from airflow_sky.infra.aws.instances import error_code

# The deep-learning images AWS publishes (Ubuntu 22.04, NVIDIA driver, CUDA, Docker), looked up per region
# through their public SSM parameters, so a region always gets its current build. `image_id` overrides:
# an AMI id, or `resolve:ssm:<parameter>` (as EC2 itself accepts).
DEFAULT_IMAGE_PARAMETERS = {
    "x86_64": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "arm64": "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
}
SSM_PREFIX = "resolve:ssm:"


def launch_network(
    ec2: Any,
    region: str,
    zone_name: str,
    public_key: str,
    group_name: str,
    ssh_cidr: str,
    public_ip: bool,
    *,
    extra_groups: Sequence[str] = (),
    efa_type: str | None = None,
) -> dict[str, Any]:
    """The run_instances arguments that place instances in the zone: the key pair, and one interface in
    the zone's subnet of the default VPC with the security group (and the cluster's own, `extra_groups`);
    each found, or made once. `efa_type`: `network_tier: best`, the EFA interfaces of that type."""
    key_name = ensure_key_pair(ec2, public_key)
    vpc = default_vpc(ec2, region)
    group = ensure_security_group(ec2, vpc, group_name, ssh_cidr, for_efa=efa_type is not None)
    subnet = subnet_in_zone(ec2, vpc, zone_name)
    groups = [group, *extra_groups]
    if efa_type is not None:
        interfaces = efa.network_interfaces(efa_type, subnet, groups, [group], public_ip)
    else:
        interfaces = [
            {"DeviceIndex": 0, "SubnetId": subnet, "Groups": groups, "AssociatePublicIpAddress": public_ip}
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


def ensure_security_group(ec2: Any, vpc_id: str, name: str, ssh_cidr: str, for_efa: bool = False) -> str:
    """The group: SSH from `ssh_cidr`, all traffic between its members (NCCL, Ray, torchrun rendezvous).
    `for_efa`: also all traffic out to its members, which EFA asks for in so many words (AWS's EFA setup)."""
    found = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
    )["SecurityGroups"]
    if found:
        group = found[0]
    else:
        try:
            group_id = ec2.create_security_group(
                GroupName=name,
                Description="airflow-sky cluster nodes: SSH in, all traffic between members",
                VpcId=vpc_id,
                TagSpecifications=[
                    {"ResourceType": "security-group", "Tags": [{"Key": "airflow-sky", "Value": "nodes"}]}
                ],
            )["GroupId"]
        except ClientError as e:
            if error_code(e) != "InvalidGroup.Duplicate":
                raise
            return ensure_security_group(ec2, vpc_id, name, ssh_cidr, for_efa)
        group = {"GroupId": group_id, "IpPermissions": []}
    group_id = str(group["GroupId"])
    _allow(ec2, group, _ssh_rule(ssh_cidr))
    members = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}
    _allow(ec2, group, members)
    if for_efa:
        _allow(ec2, group, members, egress=True)
    return group_id


def _ssh_rule(cidr: str) -> dict[str, Any]:
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": cidr}]}


def _allow(ec2: Any, group: dict[str, Any], rule: dict[str, Any], egress: bool = False) -> None:
    for existing in group.get("IpPermissionsEgress" if egress else "IpPermissions", []):
        if existing.get("IpProtocol") != rule["IpProtocol"]:
            continue
        if "IpRanges" in rule and rule["IpRanges"][0] in [
            {"CidrIp": r.get("CidrIp")} for r in existing.get("IpRanges", [])
        ]:
            return
        if "UserIdGroupPairs" in rule and rule["UserIdGroupPairs"][0]["GroupId"] in [
            p.get("GroupId") for p in existing.get("UserIdGroupPairs", [])
        ]:
            return
    authorize = ec2.authorize_security_group_egress if egress else ec2.authorize_security_group_ingress
    try:
        authorize(GroupId=group["GroupId"], IpPermissions=[rule])
    except ClientError as e:
        if error_code(e) != "InvalidPermission.Duplicate":
            raise


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
