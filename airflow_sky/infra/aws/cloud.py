"""The aws infra: a cluster is a set of EC2 instances found by their tags, made through the amazon provider.

`infra: aws` lets the optimizer choose region, zone and instance type (cheapest first); `aws/<region>` or
`aws/<region>/<zone>` pins it. Provisioning, in one placement (zone, instance type, spot or not):

1. the key pair (the connection's SSH key) and the zone's subnet of the default VPC, found or created once;
2. the cluster's own network, recorded in its record (owned_network.py): its nodes' security group (SSH in
   from `ssh_cidr`, everything between the cluster's own nodes and nothing from another cluster's), with
   `network_tier: best` a cluster placement group and EFA interfaces, with `ports` a security group of
   exactly those ports;
3. one `run_instances` for all the missing ranks with a ClientToken derived from the request (a retried
   provision gets the same instances back) and the cluster's tags; rank tags by launch index (launcher.py);
4. waits, each with a deadline, for `running`, for the host key and for SSH;
5. a failure after the launch ends what it created (instances, then the network it made). A capacity
   error (no room, no spot room) moves on to the next placement in the optimizer's order;
   `retry_until_up` starts the list again, with backoff.

The skeleton of a provision (stopped nodes, missing ranks, failover, waiting) is infra/provisioner.py's;
this driver supplies its EC2 primitives. Host keys are known before first contact: each launch hands its
instances a host key it made, through their user data (pinning.py); the tag `airflow-sky-host-key-source`
says where a pinned key came from.

Where the cluster lives (region, zone) when `infra` does not say is recorded in the state table, beside
the job records (placement.py); membership itself is only ever read from EC2 (members.py). The connection's
clients, settings and zones: connection.py; what one run_instances call asks for: launch_spec.py.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra import catalog, notices, optimizer, provisioner
from airflow_sky.infra.aws import instances, launch_spec, network, pinning
from airflow_sky.infra.aws.instances import Member
from airflow_sky.infra.aws.launcher import AwsLauncher
from airflow_sky.infra.aws.placement import Placement
from airflow_sky.infra.base import Node, ProvisionRequest
from airflow_sky.infra.keys import public_key_of
from airflow_sky.infra.provisioner import LaunchOrder, Survey
from airflow_sky.infra.provisioning import (
    NoCapacity,
    container_image,
    container_note,
    disk_size_gb,
    image_for,
    report_container_prep,
)
from airflow_sky.task import Resources

log = logging.getLogger(__name__)

# For emulators only (moto plays EC2 but its instances are not machines): "module:function" taking
# (instance_id) and returning {"host", "port", "user", "internal_ip", "host_key"} of a machine that plays it
# (without "host_key": the machine holds the key its launch handed it, as an instance would).
ENDPOINT_RESOLVER_ENV = "AIRFLOW_SKY_AWS_ENDPOINT_RESOLVER"


class AwsCloud(AwsLauncher):
    name = "aws"
    notice_window_s = notices.AWS_WINDOW_S  # EC2 reports a noticed spot instance running (gang.notice_claims)
    notice_interval_s = 5.0  # as AWS asks

    def notice_check(self, cluster_name: str) -> str | None:
        return notices.aws_check(notices.metadata_url(notices.AWS_METADATA_URL))

    # Where the default image of each architecture is published (SSM parameters, one value per region).
    image_parameters = network.DEFAULT_IMAGE_PARAMETERS
    console_timeout_s = 300.0  # for cloud-init to print the host keys of an instance its launch did not key

    def __init__(self, location: str = "", conn_id: str | None = None) -> None:
        super().__init__(conn_id)
        self._pin(location, ENDPOINT_RESOLVER_ENV)

    # ---- provisioning ----------------------------------------------------------------------------------

    def plan(self, request: ProvisionRequest) -> list[Placement]:
        """The placements to try, best first: the optimizer's order over the aws catalog."""
        resources = request.resources or Resources()
        launch_spec.check_labels(resources.labels)  # refused before anything is made
        pin: dict[str, Any] = {"cloud": "aws"}
        if self.region:
            pin.update(region=self.region, zone=self.zone or resources.zone)
        zone = pin.get("zone") or resources.zone
        region = pin.get("region") or resources.region
        if zone and region:
            pin.update(region=region, zone=self.zone_id(region, zone))
        resources = resources.copy(**pin) if resources.cloud in (None, "aws") or self.region else resources
        choices = optimizer.plan(resources, request.num_nodes, clouds=["aws"])
        candidates = [
            Placement(c.offering.region, c.offering.zone, c.offering.instance_type, c.use_spot)
            for c in choices
        ]
        return provisioner.allowed_placements("aws", candidates, self.settings.regions, "fits the resources")

    def provision(self, request: ProvisionRequest) -> list[Node]:
        nodes = provisioner.provision(self, request)
        if container_image(request.resources) is not None:  # Docker and the image's pull, from each boot
            report_container_prep("aws", request.cluster_name, nodes, self.settings.ssh_key_file)
        if request.resources is not None and request.resources.ports:
            # Nodes that were up already get the ports asked too (a launch made its own ones with them).
            self._open_ports_on_nodes(request.cluster_name, request.resources)
        return nodes

    # ---- the provisioner's primitives (provisioner.VmDriver) -----------------------------------------

    def recorded_placement(self, cluster: str) -> Placement | None:
        return self._placement(cluster)

    def survey(self, cluster: str, recorded: Placement | None) -> Survey[Member]:
        region = self.region or (recorded.region if recorded else None)
        members = self._members(cluster, region) if region else []
        return Survey(instances.current_members(members), [m.instance_id for m in members])

    def restartable(self, instance: Member) -> bool:
        return instance.state == "stopped"

    def is_live(self, instance: Member) -> bool:
        return instance.state in instances.LIVE_STATES

    def start(self, cluster: str, stopped: list[Member]) -> None:
        region = self._region_of(cluster)
        assert region is not None  # the instances were found there
        log.info("aws: %s: starting %d stopped instance(s)", cluster, len(stopped))
        self._client("ec2", region).start_instances(InstanceIds=[m.instance_id for m in stopped])

    def record_size(self, cluster: str, num_nodes: int) -> None:
        """Nothing to record: EC2's tags are the membership."""

    def forget_if_empty(self, cluster: str) -> None:
        if not self.nodes(cluster):
            region = self._region_of(cluster)
            if region is not None:
                self._release_network(cluster, region)
            self._store(cluster).delete_all()

    def wait_ready(self, cluster: str, instance_ids: list[str]) -> None:
        region = self._region_of(cluster)
        assert region is not None
        self._wait_ready(cluster, region, instance_ids)

    def launch(self, order: LaunchOrder, placement: Placement) -> list[str]:
        """Bring up the order's ranks in `placement`; returns the instance ids. Ends what it made on failure."""
        cluster, ranks, request = order.cluster, order.ranks, order.request
        s = self.settings
        region = placement.region
        ec2 = self._client("ec2", region)
        resources = request.resources or Resources()
        zone_name = self.zone_name(region, placement.zone)
        image, root_device = network.resolve_image(
            ec2,
            self._client("ssm", region),
            image_for(resources, region, "aws", "an AMI id (ami-...) or resolve:ssm:<parameter>"),
            placement.instance_type,
            region,
            self.image_parameters,
        )
        disk = disk_size_gb(resources)
        note = container_note(resources)
        if note is not None:
            log.info("aws: %s: %s", cluster, note)
        container = f"docker:{container_image(resources)}" if note is not None else None
        self._record_placement(cluster, placement, image, disk, container)
        owned = self._prepare_network(cluster, ec2, region, placement, resources)
        ids: list[str] = []
        try:
            placed = network.launch_network(
                ec2,
                region,
                zone_name,
                public_key_of(s.ssh_key_file),
                owned.security_groups,
                not s.use_private_ip,
                efa_type=owned.efa_type,
            )
            ids = self._launch_or_adopt(order, placement, placed, image, root_device, disk, owned)
            try:
                self._tag_ranks(ec2, ids, ranks, cluster)
                self._wait_ready(cluster, region, ids)
            except BaseException:
                self._end(region, ids)
                raise
        except Exception:
            # Not when the process is being stopped (SystemExit, KeyboardInterrupt): it would wait minutes for
            # EC2 to let go of the groups; the cluster's record names them for its teardown.
            self._release_after_failure(cluster, region, owned, ids)
            raise
        return ids

    def _wait_ready(self, cluster: str, region: str, ids: list[str]) -> None:
        """Running (or a lost launch: NoCapacity for spot), host keys pinned, SSH answering; each bounded."""
        ec2 = self._client("ec2", region)
        by_id = self._wait_running(cluster, region, ids)
        for instance_id, member in by_id.items():
            learned = self._host_key_to_pin(ec2, member)
            if learned is not None:
                key, source = learned
                ec2.create_tags(
                    Resources=[instance_id],
                    Tags=[
                        {"Key": instances.TAG_HOST_KEY, "Value": key},
                        {"Key": instances.TAG_HOST_KEY_SOURCE, "Value": source},
                    ],
                )
        ranked = {
            m.instance_id: (r, m)
            for r, m in instances.current_members(self._members(cluster, region)).items()
        }
        nodes = [self._node(*ranked[i], region) for i in ids if i in ranked]
        self._wait_ssh(nodes)

    def _wait_running(self, cluster: str, region: str, ids: list[str]) -> dict[str, Member]:
        deadline = time.monotonic() + self.running_timeout_s
        while True:
            members = {m.instance_id: m for m in self._members(cluster, region) if m.instance_id in ids}
            lost = [m for m in members.values() if m.state in ("shutting-down", "terminated")]
            if lost:
                m = lost[0]
                placement = Placement(region, self.zone_id(region, m.zone), m.instance_type, m.spot)
                raise NoCapacity(
                    placement, m.state_reason or m.state, f"instance {m.instance_id} went {m.state} at launch"
                )
            if len(members) == len(ids) and all(m.state == "running" for m in members.values()):
                return members
            if time.monotonic() > deadline:
                waiting = sorted(i for i in ids if members.get(i) is None or members[i].state != "running")
                raise ClusterError(
                    f"aws: instance(s) {', '.join(waiting)} not running after {self.running_timeout_s:.0f} s"
                )
            time.sleep(self.poll_s)

    def _host_key_to_pin(self, ec2: Any, member: Member) -> tuple[str, str] | None:
        """The instance's SSH host key and where it was learned (console, console-fingerprint), or None
        when its launch pinned it already (user-data). An emulator's machine that presents a key of its
        own (its resolver names it) is pinned with that key instead (emulator)."""
        if self._resolver is not None:
            played = self._endpoint(member).host_key
            if played and played != member.host_key:
                return played, "emulator"
        if member.host_key is not None:
            return None
        key, fingerprints = pinning.console_host_keys(
            ec2, member.instance_id, self.console_timeout_s, self.poll_s
        )
        if key:
            return key, "console"
        endpoint = self._endpoint(member)
        return pinning.first_contact_key(
            member.instance_id, endpoint.host, endpoint.port, fingerprints, self.ssh_timeout_s, self.poll_s
        ), "console-fingerprint"

    # ---- replacing and ending ------------------------------------------------------------------------

    def replace(self, cluster_name: str, rank: int) -> Node:
        placement = self._placement(cluster_name)
        region = self._region_of(cluster_name)
        if placement is None or region is None:
            raise ClusterError(f"aws: cluster {cluster_name!r} not found; cannot replace rank {rank}")
        members = self._members(cluster_name, region)
        old = instances.current_members(members).get(rank)
        if old is not None and old.state not in ("terminated",):
            self._end(region, [old.instance_id])
        # The same type, this zone first, then the region's other zones (same VPC: members still reach
        # each other through the group).
        same_type = Resources(
            instance_type=placement.instance_type, use_spot=placement.use_spot, infra=f"aws/{region}"
        )
        others = [
            p
            for p in self.plan(ProvisionRequest(cluster_name, 1, same_type))
            if p.region == region and p != placement
        ]
        launched = self._launch_settings(cluster_name)
        same = Resources(
            instance_type=placement.instance_type,
            use_spot=placement.use_spot,
            image_id=launched.get("container") or launched.get("image"),
            disk_size=launched.get("disk_size"),
            **self._owned_resources(cluster_name),  # its placement group, ports, disk tier, labels
        )
        order = LaunchOrder(
            ProvisionRequest(cluster_name, rank + 1, same), [rank], [m.instance_id for m in members]
        )
        return provisioner.replace(self, order, [placement, *others])

    # ---- autostop ----------------------------------------------------------------------------------

    def prepare_autostop(self, cluster_name: str, down: bool) -> None:
        placement = self._placement(cluster_name)
        region = self._region_of(cluster_name)
        if placement is None or region is None:
            raise ClusterError(f"aws: cluster {cluster_name!r} not found; cannot set its autostop")
        self._refuse_stopping_spot(placement.use_spot, down, "instances")
        behavior = "terminate" if down else "stop"
        ec2 = self._client("ec2", region)
        for m in self._members(cluster_name, region):
            if m.state in instances.LIVE_STATES and not m.ended:
                ec2.modify_instance_attribute(
                    InstanceId=m.instance_id, Attribute="instanceInitiatedShutdownBehavior", Value=behavior
                )
        self._record_shutdown(cluster_name, behavior)

    def _end(self, region: str, ids: list[str]) -> None:
        """Mark instances as ended by airflow-sky, then terminate them (the mark keeps them off `nodes`)."""
        if not ids:
            return
        ec2 = self._client("ec2", region)
        ec2.create_tags(Resources=ids, Tags=[{"Key": instances.TAG_ENDED, "Value": "true"}])
        ec2.terminate_instances(InstanceIds=ids)

    def terminate(self, cluster_name: str) -> None:
        regions = (
            [self._region_of(cluster_name)]
            if self._region_of(cluster_name)
            else self._all_regions(cluster_name)
        )
        for region in regions:
            assert region is not None
            alive = [
                m.instance_id
                for m in self._members(cluster_name, region)
                if m.state not in ("shutting-down", "terminated")
            ]
            if alive:
                log.info("aws: %s: terminating %d instance(s) in %s", cluster_name, len(alive), region)
                self._end(region, alive)
        recorded = self._placement(cluster_name)
        # Its groups, once its instances are gone (the ports close at once); without a record, the nodes
        # group is found by its tags in each region the cluster had instances in.
        for region in [recorded.region] if recorded is not None else regions:
            assert region is not None
            self._release_network(cluster_name, region)
        self._store(cluster_name).delete_all()

    def _all_regions(self, cluster_name: str) -> list[str]:
        """Every region the cluster could be in, for a teardown whose placement record is gone."""
        regions = self.settings.regions or tuple(sorted({o.region for o in catalog.offerings("aws")}))
        # Only regions with instances of the cluster matter; look at all of them at once.
        with ThreadPoolExecutor(max_workers=8) as pool:
            found = list(pool.map(lambda r: (r, self._has_any(r, cluster_name)), regions))
        return [r for r, has in found if has]

    def _has_any(self, region: str, cluster_name: str) -> bool:
        try:
            return bool(self._members(cluster_name, region))
        except ClientError:
            return False
