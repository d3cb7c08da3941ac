"""One launch of an aws cluster's ranks: the run_instances call (or the instances an earlier try of the
same launch made, found by its token), its rank tags, and what a failed launch leaves of its network."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.aws import instances, launch_spec, pinning
from airflow_sky.infra.aws.owned_network import AwsOwnedNetwork, OwnedNetwork, interface_note
from airflow_sky.infra.aws.placement import Placement
from airflow_sky.infra.provisioner import LaunchOrder
from airflow_sky.infra.provisioning import NoCapacity, boot_prep
from airflow_sky.task import Resources

log = logging.getLogger(__name__)


class AwsLauncher(AwsOwnedNetwork):
    def _launch_or_adopt(
        self,
        order: LaunchOrder,
        placement: Placement,
        placed: dict[str, Any],
        image: str,
        root_device: str,
        disk: int,
        owned: OwnedNetwork,
    ) -> list[str]:
        """The instances of this launch: those an earlier try of it made (its token), or new ones."""
        cluster, ranks, request = order.cluster, order.ranks, order.request
        resources = request.resources or Resources()
        region = placement.region
        ec2 = self._client("ec2", region)
        day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        token = instances.launch_token(cluster, ranks, placement.label, order.known, day)
        adopted = [
            m.instance_id
            for m in self._members(cluster, region)
            if not m.ended
            and m.state in instances.LIVE_STATES
            and m.instance_id not in order.known
            and self._launch_tag(ec2, m.instance_id) == token
        ]
        if adopted:
            log.info(
                "aws: %s: found the %d instance(s) of an earlier try of this launch", cluster, len(adopted)
            )
            return adopted
        extra = ""
        if owned.efa_type:
            note = interface_note(owned.efa_type, not self.settings.use_private_ip)
            extra = f" in placement group {owned.placement_group}, {note}"
        log.info("aws: %s: launching %d x %s%s", cluster, len(ranks), placement.label, extra)
        host_key = pinning.new_host_key()  # known before first contact: see pinning.py
        tags = launch_spec.launch_tags(cluster, ranks, token, request.job_name, resources.labels)
        args = launch_spec.run_instances_args(
            count=len(ranks),
            instance_type=placement.instance_type,
            use_spot=placement.use_spot,
            image=image,
            root_device=root_device,
            tags=[*tags, *launch_spec.host_key_tags(host_key.public)],
            user_data=pinning.user_data(host_key, boot_prep(resources, self.settings.ssh_user)),
            volume_tags=launch_spec.volume_tags(cluster, resources.labels),
            disk_size=disk,
            disk_tier=resources.disk_tier,
            network=placed,
            token=token,
            shutdown=launch_spec.shutdown_behavior(
                resources, placement.use_spot, self._launch_settings(cluster).get("shutdown")
            ),
            iam_instance_profile=self.settings.iam_instance_profile,
            placement_group=owned.placement_group,
        )
        return self._run_instances(ec2, placement, args)

    def _release_after_failure(self, cluster: str, region: str, owned: OwnedNetwork, ids: list[str]) -> None:
        """What this launch made of the cluster's network goes with it (kept when it is not the first)."""
        try:
            self._release_network(cluster, region, owned, wait_for=ids)
        except Exception as e:  # the launch's own error is the one to report
            log.warning("aws: %s: could not remove its network after the failed launch: %s", cluster, e)

    def _launch_tag(self, ec2: Any, instance_id: str) -> str | None:
        for reservation in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]:
            for i in reservation["Instances"]:
                return instances.tags_of(i).get(instances.TAG_LAUNCH)
        return None

    def _run_instances(self, ec2: Any, placement: Placement, args: dict[str, Any]) -> list[str]:
        """The launch; the ids in launch-index order. No room (or no quota) here: NoCapacity."""
        try:
            response = ec2.run_instances(**args)
        except ClientError as e:
            code = instances.error_code(e)
            if code in instances.CAPACITY_ERRORS or code in instances.QUOTA_ERRORS:
                raise NoCapacity(placement, code, str(e.response.get("Error", {}).get("Message", ""))) from e
            raise ClusterError(f"aws: run_instances in {placement.label} failed: {code or e}") from e
        launched = sorted(response["Instances"], key=lambda i: int(i.get("AmiLaunchIndex", 0)))
        return [str(i["InstanceId"]) for i in launched]

    def _tag_ranks(self, ec2: Any, ids: list[str], ranks: list[int], cluster: str) -> None:
        by_index = {}
        for reservation in ec2.describe_instances(InstanceIds=ids)["Reservations"]:
            for i in reservation["Instances"]:
                by_index[int(i.get("AmiLaunchIndex", 0))] = i["InstanceId"]
        for index, rank in enumerate(ranks):
            instance_id = by_index.get(index, ids[index] if index < len(ids) else None)
            if instance_id is not None:
                ec2.create_tags(Resources=[instance_id], Tags=launch_spec.rank_tags(cluster, rank))
