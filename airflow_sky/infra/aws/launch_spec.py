"""What one `run_instances` call asks EC2 for: image, network, disk, tags, shutdown behavior, spot (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.aws import instances
from airflow_sky.task import Resources

# `disk_tier` as SkyPilot maps it on AWS (sky/clouds/aws.py): volume type, IOPS, and for gp3 a throughput
# of IOPS/16 MiB/s; `best` is `ultra`. Without a tier the volume is gp3 at EBS's own baseline.
DISK_TIERS: dict[str, dict[str, Any]] = {
    "low": {"VolumeType": "standard"},
    "medium": {"VolumeType": "gp3", "Iops": 3500, "Throughput": 3500 // 16},
    "high": {"VolumeType": "gp3", "Iops": 7000, "Throughput": 7000 // 16},
    "ultra": {"VolumeType": "io2", "Iops": 20000},
}
# Tag keys airflow-sky's own state lives in (and AWS's), which user labels must not overwrite.
_RESERVED_PREFIXES = ("airflow-sky", "aws:")
_RESERVED_KEYS = ("Name",)


def disk_spec(disk_tier: str | None) -> dict[str, Any]:
    if disk_tier is None:
        return {"VolumeType": "gp3"}
    return dict(DISK_TIERS["ultra" if disk_tier == "best" else disk_tier])


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """`resources.labels` as instance tags: refused when a key is one airflow-sky (or AWS) keeps for itself,
    or longer than EC2 allows."""
    labels = dict(labels or {})
    reserved = sorted(k for k in labels if k in _RESERVED_KEYS or k.lower().startswith(_RESERVED_PREFIXES))
    if reserved:
        raise SpecError(
            f"resources.labels: {', '.join(reserved)}: reserved on aws (airflow-sky's own tags "
            "`airflow-sky*` and `Name`, AWS's `aws:*`); choose other keys"
        )
    for key, value in labels.items():
        if len(key) > 128 or len(str(value)) > 256:
            raise SpecError(f"resources.labels.{key}: aws tags allow keys up to 128, values up to 256 chars")
    return {k: str(v) for k, v in labels.items()}


def launch_tags(
    cluster: str,
    ranks: Sequence[int],
    token: str,
    job_name: str | None,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """The cluster's tags on every instance of the call (after the user's labels, which never replace one
    of them); the rank tags too when the call makes one."""
    tags = [{"Key": k, "Value": v} for k, v in check_labels(labels).items()]
    tags += [
        {"Key": instances.TAG_CLUSTER, "Value": cluster},
        {"Key": instances.TAG_LAUNCH, "Value": token},
        {"Key": instances.TAG_RANKS, "Value": instances.format_ranks(ranks)},
    ]
    if job_name:
        tags.append({"Key": instances.TAG_JOB, "Value": job_name[:255]})
    if len(ranks) == 1:
        tags += rank_tags(cluster, ranks[0])
    return tags


def volume_tags(cluster: str, labels: Mapping[str, str] | None) -> list[dict[str, str]]:
    return [*({"Key": k, "Value": v} for k, v in check_labels(labels).items()), cluster_tag(cluster)]


def cluster_tag(cluster: str) -> dict[str, str]:
    return {"Key": instances.TAG_CLUSTER, "Value": cluster}


def host_key_tags(public_key: str) -> list[dict[str, str]]:
    """The host key the launch hands its instances (pinning.py), pinned from the start."""
    return [
        {"Key": instances.TAG_HOST_KEY, "Value": public_key},
        {"Key": instances.TAG_HOST_KEY_SOURCE, "Value": "user-data"},
    ]


def rank_tags(cluster: str, rank: int) -> list[dict[str, str]]:
    return [{"Key": instances.TAG_RANK, "Value": str(rank)}, {"Key": "Name", "Value": f"{cluster}-{rank}"}]


def run_instances_args(
    *,
    count: int,
    instance_type: str,
    use_spot: bool,
    image: str,
    root_device: str,
    disk_size: int,
    network: dict[str, Any],
    token: str,
    shutdown: str,
    tags: list[dict[str, str]],
    volume_tags: list[dict[str, str]],
    iam_instance_profile: str | None,
    disk_tier: str | None = None,
    placement_group: str | None = None,
    user_data: str | None = None,
) -> dict[str, Any]:
    """`user_data`: the cloud-config that installs the launch's host key (pinning.py); a secret."""
    args: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": token,
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {"VolumeSize": disk_size, "DeleteOnTermination": True, **disk_spec(disk_tier)},
            }
        ],
        # The node's own `shutdown` stops or ends it: autostop's dead-man switch needs no credentials.
        "InstanceInitiatedShutdownBehavior": shutdown,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": volume_tags},
        ],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        **network,  # the key pair and the interface (subnet, security group): network.launch_network
    }
    if user_data is not None:
        args["UserData"] = user_data  # boto3 encodes it (base64)
    if placement_group:
        args["Placement"] = {"GroupName": placement_group}  # `network_tier: best`: close together
    if iam_instance_profile:
        # The nodes' own identity: their role reaches the task's s3:// buckets, no key is sent to them.
        profile = iam_instance_profile
        args["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
    if use_spot:
        args["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return args


def shutdown_behavior(resources: Resources, use_spot: bool, recorded: str | None) -> str:
    """`stop` for autostop without down on on-demand instances; `terminate` otherwise (one-time spot
    instances cannot stop). A node launched into a cluster (a replacement) does what the others do."""
    if recorded in ("stop", "terminate"):
        return recorded
    autostop = resources.autostop
    if isinstance(autostop, dict) and not autostop["down"] and not use_spot:
        return "stop"
    return "terminate"
