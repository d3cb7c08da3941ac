"""What a cluster owns in EC2 besides its instances: a cluster placement group (`network_tier: best`) and a
security group holding exactly the task's `ports` (each found by its name, made once, removed at teardown).

Both are named after the cluster (`airflow-sky-<cluster>`, `airflow-sky-<cluster>-ports`) and recorded in
the cluster's record, so teardown (and a provision that failed half-way) knows what to remove. The ports
group sits beside the shared group on each node's primary interface: the shared group (SSH, members)
stays the same for every cluster, and the ports of one cluster never open another's nodes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws.instances import error_code

log = logging.getLogger(__name__)

_TAG = [{"Key": "airflow-sky", "Value": "cluster"}]


def placement_group_name(cluster: str) -> str:
    return f"airflow-sky-{cluster}"


def ports_group_name(cluster: str) -> str:
    return f"airflow-sky-{cluster}-ports"


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


def delete_ports_group(ec2: Any, group_id: str) -> None:
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
