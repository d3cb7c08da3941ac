"""What a cluster owns in EC2 besides its instances: its nodes' security group, a cluster placement group
(`network_tier: best`) and a security group holding exactly the task's `ports` (each found, made once,
removed at teardown).

The nodes group (`airflow-sky-<cluster>-nodes`, found by the cluster's tags) is the only group that lets
traffic in from other nodes, and only from its own members: SSH from `ssh_cidr`, everything from the nodes
of the same cluster (NCCL, Ray, torchrun, EFA). Another cluster's nodes are not members, so they reach a
node only where a CIDR rule admits their address (SSH from `ssh_cidr`, the ports from `port_sources`).
The placement and ports groups are named after the cluster (`airflow-sky-<cluster>`,
`airflow-sky-<cluster>-ports`); all three are recorded in the cluster's record, so teardown (and a
provision that failed half-way) knows what to remove.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws.instances import TAG_CLUSTER, error_code

log = logging.getLogger(__name__)

_TAG = [{"Key": "airflow-sky", "Value": "cluster"}]
NODES_ROLE = "cluster-nodes"  # the `airflow-sky` tag's value on a cluster's nodes group


def placement_group_name(cluster: str) -> str:
    return f"airflow-sky-{cluster}"


def ports_group_name(cluster: str) -> str:
    return f"airflow-sky-{cluster}-ports"


def nodes_group_name(cluster: str) -> str:
    # `-nodes` where the ports group has `-ports`: no cluster's name makes one the other's.
    return f"airflow-sky-{cluster}-nodes"


def nodes_group_tags(cluster: str) -> list[dict[str, str]]:
    return [{"Key": "airflow-sky", "Value": NODES_ROLE}, {"Key": TAG_CLUSTER, "Value": cluster}]


def find_nodes_group(ec2: Any, vpc_id: str | None, cluster: str) -> str | None:
    """The cluster's nodes group, found by its tags (in `vpc_id`, or in any VPC of the region)."""
    filters = [{"Name": f"tag:{t['Key']}", "Values": [t["Value"]]} for t in nodes_group_tags(cluster)]
    if vpc_id is not None:
        filters.append({"Name": "vpc-id", "Values": [vpc_id]})
    found = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
    return str(found[0]["GroupId"]) if found else None


def ensure_nodes_group(ec2: Any, vpc_id: str, cluster: str, ssh_cidr: str) -> tuple[str, bool]:
    """The cluster's nodes group with its rules (SSH from `ssh_cidr`, all traffic in from and out to its
    own members: EFA asks for both in so many words); (id, made). Safe for racing provisioners."""
    group_id, made = find_nodes_group(ec2, vpc_id, cluster), False
    if group_id is None:
        try:
            group_id = str(
                ec2.create_security_group(
                    GroupName=nodes_group_name(cluster),
                    Description=f"airflow-sky cluster {cluster}: SSH in, all traffic between its own nodes",
                    VpcId=vpc_id,
                    TagSpecifications=[{"ResourceType": "security-group", "Tags": nodes_group_tags(cluster)}],
                )["GroupId"]
            )
            made = True
        except ClientError as e:
            if error_code(e) != "InvalidGroup.Duplicate":  # another provision of the cluster made it first
                raise ClusterError(
                    f"aws: cannot create the nodes group of {cluster}: {error_code(e) or e}"
                ) from e
            return ensure_nodes_group(ec2, vpc_id, cluster, ssh_cidr)
    (group,) = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    members = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}
    ssh = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": ssh_cidr}]}
    for rule, egress in ((ssh, False), (members, False), (members, True)):
        allow(ec2, group, rule, egress)
    if made:
        log.info("aws: %s: created its nodes group %s", cluster, group_id)
    return group_id, made


def allow(ec2: Any, group: dict[str, Any], rule: dict[str, Any], egress: bool = False) -> None:
    """Authorize `rule` (one CIDR block or one group) on `group` unless a rule of the group holds it."""
    for existing in group.get("IpPermissionsEgress" if egress else "IpPermissions", []):
        if existing.get("IpProtocol") != rule["IpProtocol"] or (
            rule["IpProtocol"] != "-1" and existing.get("FromPort") != rule.get("FromPort")
        ):
            continue
        cidrs = [r.get("CidrIp") for r in existing.get("IpRanges", [])]
        groups = [p.get("GroupId") for p in existing.get("UserIdGroupPairs", [])]
        if "IpRanges" in rule and rule["IpRanges"][0]["CidrIp"] in cidrs:
            return
        if "UserIdGroupPairs" in rule and rule["UserIdGroupPairs"][0]["GroupId"] in groups:
            return
    authorize = ec2.authorize_security_group_egress if egress else ec2.authorize_security_group_ingress
    try:
        authorize(GroupId=group["GroupId"], IpPermissions=[rule])
    except ClientError as e:
        if error_code(e) != "InvalidPermission.Duplicate":
            raise


def ensure_placement_group(ec2: Any, name: str) -> bool:
    """A `cluster` placement group named `name`; True when this call made it."""
    try:
        ec2.create_placement_group(
            GroupName=name,
            Strategy="cluster",
            TagSpecifications=[{"ResourceType": "placement-group", "Tags": _TAG}],
        )
    except ClientError as e:
        if error_code(e) != "InvalidPlacementGroup.Duplicate":  # a retried provision made it already
            raise ClusterError(f"aws: cannot create the placement group {name}: {error_code(e) or e}") from e
        return False
    log.info("aws: created the cluster placement group %s", name)
    return True


def delete_placement_group(ec2: Any, name: str) -> None:
    _unless_gone(lambda: ec2.delete_placement_group(GroupName=name), "InvalidPlacementGroup.Unknown")


def _unless_gone(delete: Callable[[], Any], gone: str) -> None:
    """Delete something; already gone (`gone`: EC2's code for that) is as good."""
    try:
        delete()
    except ClientError as e:
        if error_code(e) != gone:
            raise


def rules_for(ports: Sequence[str], sources: Sequence[str]) -> list[dict[str, Any]]:
    """One TCP rule per port (or range) open to every source (IPv4 and IPv6 CIDR blocks), as SkyPilot opens
    them (pure)."""
    v4 = [{"CidrIp": s} for s in sources if ipaddress.ip_network(s, strict=False).version == 4]
    v6 = [{"CidrIpv6": s} for s in sources if ipaddress.ip_network(s, strict=False).version == 6]
    rules = []
    for port in ports:
        lo, _, hi = port.partition("-")
        rule: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": int(lo), "ToPort": int(hi or lo)}
        if v4:
            rule["IpRanges"] = v4
        if v6:
            rule["Ipv6Ranges"] = v6
        rules.append(rule)
    return rules


def _shape(rule: dict[str, Any]) -> tuple[Any, ...]:
    """A rule as a comparable value (EC2 answers with fields of its own, e.g. descriptions)."""
    return (
        rule.get("IpProtocol"),
        rule.get("FromPort"),
        rule.get("ToPort"),
        tuple(sorted(r["CidrIp"] for r in rule.get("IpRanges", []))),
        tuple(sorted(r["CidrIpv6"] for r in rule.get("Ipv6Ranges", []))),
    )


def ensure_ports_group(
    ec2: Any, vpc_id: str, cluster: str, ports: Sequence[str], sources: Sequence[str]
) -> tuple[str, bool]:
    """The cluster's ports group holding exactly `ports` from `sources` (other rules revoked); (id, made)."""
    name = ports_group_name(cluster)
    found = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
    )["SecurityGroups"]
    made = not found
    if found:
        group_id, existing = str(found[0]["GroupId"]), list(found[0].get("IpPermissions", []))
    else:
        group_id = ec2.create_security_group(
            GroupName=name,
            Description=f"airflow-sky cluster {cluster}: its resources.ports",
            VpcId=vpc_id,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": _TAG}],
        )["GroupId"]
        existing = []
    wanted = rules_for(ports, sources)
    stale = [r for r in existing if _shape(r) not in {_shape(w) for w in wanted}]
    if stale:
        ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=stale)
    missing = [w for w in wanted if _shape(w) not in {_shape(r) for r in existing}]
    if missing:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=missing)
    log.info("aws: %s: opened port(s) %s to %s", cluster, ", ".join(ports), ", ".join(sources))
    return group_id, made


def attach_group(ec2: Any, instance_id: str, group_id: str) -> None:
    """Add `group_id` to the instance's primary interface (device 0) unless it is there already."""
    for reservation in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]:
        for instance in reservation["Instances"]:
            for nic in instance.get("NetworkInterfaces", []):
                groups = [g["GroupId"] for g in nic.get("Groups", [])]
                if nic.get("Attachment", {}).get("DeviceIndex") == 0 and group_id not in groups:
                    ec2.modify_network_interface_attribute(
                        NetworkInterfaceId=nic["NetworkInterfaceId"], Groups=[*groups, group_id]
                    )


def close_ports(ec2: Any, group_id: str) -> None:
    """Revoke every rule of the ports group at once (the nodes may take minutes to end)."""
    try:
        found = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    except ClientError as e:
        if error_code(e) == "InvalidGroup.NotFound":
            return
        raise
    rules = found[0].get("IpPermissions", []) if found else []
    if rules:
        ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=rules)


def delete_group(ec2: Any, group_id: str) -> None:
    _unless_gone(lambda: ec2.delete_security_group(GroupId=group_id), "InvalidGroup.NotFound")


def when_released(
    delete: Callable[[], None], what: str, timeout_s: float, poll_s: float, still_used: Callable[[], bool]
) -> None:
    """Delete `what` once nothing uses it: EC2 refuses while instances of the cluster are still ending."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not still_used():
            try:
                delete()
                return
            except ClientError as e:
                if error_code(e) not in ("InvalidPlacementGroup.InUse", "DependencyViolation"):
                    raise ClusterError(f"aws: cannot delete {what}: {error_code(e) or e}") from e
        if time.monotonic() > deadline:
            raise ClusterError(
                f"aws: {what} is still in use {timeout_s:.0f} s after its instances were ended; "
                "run the teardown (`airflow-sky down`) again to remove it"
            )
        time.sleep(poll_s)
