"""EC2 instances as cluster members: the tags that are the only state, and what they mean (pure functions).

Every instance of a cluster carries:

    airflow-sky-cluster   the cluster name (what `nodes` and `terminate` filter on)
    airflow-sky-rank      its rank (0 = head); set right after launch
    airflow-sky-job       the job (task name) that launched it
    airflow-sky-launch    the launch token: the ClientToken of the run_instances call that created it
    airflow-sky-ranks     the ranks that call filled, in launch-index order (so a launch whose rank tags
                          were never written, the provisioner having died, is still read right)
    airflow-sky-host-key  the SSH host key pinned at provision time, and -source: console | first-contact
    airflow-sky-ended     set on instances airflow-sky itself ended (teardown, replacement, a failed launch),
                          so a node that is gone on purpose is not reported as lost
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_sky.infra.base import NodeStatus

TAG_CLUSTER = "airflow-sky-cluster"
TAG_RANK = "airflow-sky-rank"
TAG_JOB = "airflow-sky-job"
TAG_LAUNCH = "airflow-sky-launch"
TAG_RANKS = "airflow-sky-ranks"
TAG_HOST_KEY = "airflow-sky-host-key"
TAG_HOST_KEY_SOURCE = "airflow-sky-host-key-source"
TAG_ENDED = "airflow-sky-ended"

LIVE_STATES = ("pending", "running")
# The codes EC2 answers when a zone has no room (or no spot room) for the request: try the next placement.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InsufficientFreeAddressesInSubnet",
        "Unsupported",  # the type is not offered in this zone
    }
)
# Quotas: retrying elsewhere in the same region does not help, another region may.
QUOTA_ERRORS = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded"})
_SPOT_REASONS = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")


@dataclasses.dataclass(frozen=True)
class Member:
    """One instance of a cluster as its tags and state describe it."""

    instance_id: str
    rank: int | None
    state: str
    spot: bool
    ended: bool
    launch_time: str
    zone: str
    instance_type: str
    private_ip: str | None
    public_ip: str | None
    host_key: str | None
    state_reason: str


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def member_of(instance: dict[str, Any]) -> Member:
    tags = tags_of(instance)
    return Member(
        instance_id=instance["InstanceId"],
        rank=rank_of(tags, int(instance.get("AmiLaunchIndex", 0))),
        state=instance["State"]["Name"],
        spot=instance.get("InstanceLifecycle") == "spot",
        ended=TAG_ENDED in tags,
        launch_time=str(instance.get("LaunchTime", "")),
        zone=instance.get("Placement", {}).get("AvailabilityZone", ""),
        instance_type=instance.get("InstanceType", ""),
        private_ip=instance.get("PrivateIpAddress"),
        public_ip=instance.get("PublicIpAddress"),
        host_key=tags.get(TAG_HOST_KEY),
        state_reason=str(instance.get("StateReason", {}).get("Code", "")),
    )


def rank_of(tags: dict[str, str], launch_index: int) -> int | None:
    """The rank tag, or else the rank its launch filled at its launch index; None when neither says."""
    if tags.get(TAG_RANK, "").isdigit():
        return int(tags[TAG_RANK])
    ranks = parse_ranks(tags.get(TAG_RANKS, ""))
    return ranks[launch_index] if 0 <= launch_index < len(ranks) else None


def format_ranks(ranks: Sequence[int]) -> str:
    return ",".join(str(r) for r in ranks)


def parse_ranks(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip().isdigit()]


def status_of(member: Member) -> NodeStatus:
    """RUNNING while usable; a spot instance that went away is PREEMPTED, any other lost one TERMINATED."""
    if member.state == "running":
        return NodeStatus.RUNNING
    if member.state == "pending":
        return NodeStatus.UNREACHABLE  # not usable yet; provisioning waits it out
    if member.state in ("stopping", "stopped"):
        return NodeStatus.STOPPED  # autostop: the disk is kept, provisioning starts it again
    if member.spot or member.state_reason in _SPOT_REASONS:
        return NodeStatus.PREEMPTED
    return NodeStatus.TERMINATED


def current_members(members: Iterable[Member]) -> dict[int, Member]:
    """The instance that holds each rank: the newest live one, else the newest lost one.

    Instances airflow-sky ended on purpose (teardown, a replaced node, a failed launch) hold no rank.
    """
    best: dict[int, Member] = {}
    for m in members:
        if m.rank is None or m.ended:
            continue
        held = best.get(m.rank)
        if held is None or _preference(m) > _preference(held):
            best[m.rank] = m
    return dict(sorted(best.items()))


def _preference(m: Member) -> tuple[bool, str]:
    return (m.state in LIVE_STATES, m.launch_time)


def launch_token(cluster: str, ranks: Sequence[int], placement: str, known: Iterable[str], salt: str) -> str:
    """The ClientToken (and tag) of one launch: the same request on the same membership gives the same
    token, so a retried provision finds (or, through EC2's idempotency, gets back) the instances it
    already created; any change in membership (a node ended or replaced) makes a new one. `salt` (the
    day) keeps a cluster name reused days later from meeting an old token (EC2 remembers tokens)."""
    text = "|".join([cluster, format_ranks(ranks), placement, ",".join(sorted(known)), salt])
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    return f"sky-{digest}"  # ClientToken allows 64 ASCII characters


def error_code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def console_url(region: str, instance_id: str) -> str:
    """The instance's page in the EC2 console (the node's extra link in the Airflow UI)."""
    return f"https://{region}.console.aws.amazon.com/ec2/home?region={region}#InstanceDetails:instanceId={instance_id}"
