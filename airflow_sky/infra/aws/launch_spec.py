"""What one `run_instances` call asks EC2 for: image, network, disk, tags, shutdown behavior, spot (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_sky.infra.aws import instances
from airflow_sky.task import Resources


def launch_tags(cluster: str, ranks: Sequence[int], token: str, job_name: str | None) -> list[dict[str, str]]:
    """The cluster's tags on every instance of the call; the rank tags too when the call makes one."""
    tags = [
        {"Key": instances.TAG_CLUSTER, "Value": cluster},
        {"Key": instances.TAG_LAUNCH, "Value": token},
        {"Key": instances.TAG_RANKS, "Value": instances.format_ranks(ranks)},
    ]
    if job_name:
        tags.append({"Key": instances.TAG_JOB, "Value": job_name[:255]})
    if len(ranks) == 1:
        tags += rank_tags(cluster, ranks[0])
    return tags


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
    iam_instance_profile: str | None,
) -> dict[str, Any]:
    args: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": token,
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {"VolumeSize": disk_size, "VolumeType": "gp3", "DeleteOnTermination": True},
            }
        ],
        # The node's own `shutdown` stops or ends it: autostop's dead-man switch needs no credentials.
        "InstanceInitiatedShutdownBehavior": shutdown,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags[:1]},
        ],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        **network,  # the key pair and the interface (subnet, security group): network.launch_network
    }
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
