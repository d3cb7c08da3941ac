"""The aws infra: a cluster is a set of EC2 instances found by their tags, made through the amazon provider.

`infra: aws` lets the optimizer choose region, zone and instance type (cheapest first); `aws/<region>` or
`aws/<region>/<zone>` pins it. Provisioning, in one placement (zone, instance type, spot or not):

1. the key pair (the connection's SSH key), the security group (SSH in from `ssh_cidr`, everything between
   members) and the zone's subnet of the default VPC, each found or created once;
2. one `run_instances` for all the missing ranks with a ClientToken derived from the request (a retried
   provision gets the same instances back) and the cluster's tags; rank tags by launch index;
3. waits, each with a deadline, for `running`, for the host key and for SSH;
4. a failure after the launch ends what it created. A capacity error (no room, no spot room) moves on to
   the next placement in the optimizer's order; `retry_until_up` starts the list again, with backoff.

Host keys are pinned from the serial console, where cloud-init prints them at first boot (the EC2 API is
the authenticated channel). When the console has not shown them within its deadline, the key is taken at
first contact over SSH, kept only if the machine answering proves to be the instance (its instance id in
the DMI asset tag or the instance metadata matches). The tag `airflow-sky-host-key-source` says which.

Where the cluster lives (region, zone) when `infra` does not say is recorded in the state table, beside
the job records; membership itself is only ever read from EC2.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra import catalog, optimizer
from airflow_sky.infra.aws import instances, network
from airflow_sky.infra.aws.instances import Member
from airflow_sky.infra.aws.settings import DEFAULT_CONN_ID, AwsSettings, settings_from_extra
from airflow_sky.infra.aws.state_store import DynamoDbStateStore, cluster_names
from airflow_sky.infra.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.host_keys import host_key_from_console
from airflow_sky.infra.keys import public_key_of
from airflow_sky.infra.provisioning import (
    NoCapacity,
    image_for,
    launch_with_failover,
    resolver_from_env,
    update_record,
    wait_for_ssh,
)
from airflow_sky.infra.state_store import StateStore
from airflow_sky.task import Resources

log = logging.getLogger(__name__)

PLACEMENT_KEY = "placement"
DEFAULT_DISK_SIZE_GB = 256  # SkyPilot's default disk_size
# For emulators only (moto plays EC2 but its instances are not machines): "module:function" taking
# (instance_id) and returning {"host", "port", "user", "internal_ip", "host_key"} of a machine that plays it.
ENDPOINT_RESOLVER_ENV = "AIRFLOW_SKY_AWS_ENDPOINT_RESOLVER"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    internal_ip: str
    host_key: str | None = None


@dataclasses.dataclass(frozen=True)
class Placement:
    region: str
    zone: str  # the zone's id (use1-az1): the catalog's; names (us-east-1a) differ between accounts
    instance_type: str
    use_spot: bool

    @property
    def label(self) -> str:
        return f"{self.zone} {self.instance_type}{' (spot)' if self.use_spot else ''}"


class AwsCloud(Cloud):
    name = "aws"
    # Where the default image of each architecture is published (SSM parameters, one value per region).
    image_parameters = network.DEFAULT_IMAGE_PARAMETERS

    def __init__(self, location: str = "", conn_id: str | None = None) -> None:
        parts = [p for p in (location or "").split("/") if p]
        if len(parts) > 2:
            raise SpecError(f"infra: aws takes aws, aws/<region> or aws/<region>/<zone>, got aws/{location}")
        self.region = parts[0] if parts else None
        self.zone = parts[1] if len(parts) > 1 else None
        self.conn_id = conn_id or DEFAULT_CONN_ID
        self._settings: AwsSettings | None = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._zone_ids: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._resolver = resolver_from_env(ENDPOINT_RESOLVER_ENV)
        self.running_timeout_s = 600.0
        self.console_timeout_s = 300.0
        self.ssh_timeout_s = 600.0
        self.poll_s = 3.0

    # ---- connection ------------------------------------------------------------------------------------

    def _client(self, service: str, region: str) -> Any:
        """A boto3 client from the amazon provider's hooks (the connection's credentials and endpoint)."""
        with self._lock:
            client = self._clients.get((service, region))
            if client is None:
                if service == "ec2":
                    from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

                    client = EC2Hook(
                        aws_conn_id=self.conn_id, region_name=region, api_type="client_type"
                    ).conn
                else:
                    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

                    client = AwsBaseHook(
                        aws_conn_id=self.conn_id, client_type=service, region_name=region
                    ).conn
                self._clients[(service, region)] = client
            return client

    @property
    def settings(self) -> AwsSettings:
        if self._settings is None:
            from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

            config = AwsBaseHook(aws_conn_id=self.conn_id, client_type="ec2").conn_config
            self._settings = settings_from_extra(self.conn_id, dict(config.extra_config), config.region_name)
        return self._settings

    def node_bucket_identity(self) -> frozenset[str]:
        return frozenset({"s3"}) if self.settings.iam_instance_profile else frozenset()

    def check_config(self) -> None:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        # Credentials resolve locally (connection, environment, profile, instance role) or not at all.
        if AwsBaseHook(aws_conn_id=self.conn_id, client_type="ec2").get_session().get_credentials() is None:
            raise SpecError(
                f"aws: no AWS credentials: the Airflow connection {self.conn_id!r} has none and none were "
                "found in the environment, ~/.aws or an instance role (see docs/infra-aws.md)"
            )
        public_key_of(self.settings.ssh_key_file)  # the key parses: its public half is what EC2 imports

    # ---- where a cluster lives -----------------------------------------------------------------------

    def state_store(self, cluster_name: str) -> StateStore:
        return self._store(cluster_name)

    def _store(self, cluster_name: str) -> DynamoDbStateStore:
        s = self.settings
        return DynamoDbStateStore(self._client("dynamodb", s.state_region), s.state_table, cluster_name)

    def _placement(self, cluster_name: str) -> Placement | None:
        record = self._store(cluster_name).get(PLACEMENT_KEY)
        if record is None:
            return None
        return Placement(**{f.name: record.data[f.name] for f in dataclasses.fields(Placement)})

    def _launch_settings(self, cluster_name: str) -> dict[str, Any]:
        """The image and disk the cluster was launched with: what a replacement node gets too."""
        record = self._store(cluster_name).get(PLACEMENT_KEY)
        return {k: record.data.get(k) for k in ("image", "disk_size", "shutdown")} if record else {}

    def _record_placement(self, cluster_name: str, placement: Placement, image: str, disk_size: int) -> None:
        # Merged: what autostop recorded (the shutdown behavior) stays for the nodes launched later.
        changes = dataclasses.asdict(placement) | {"image": image, "disk_size": disk_size}
        update_record(
            self._store(cluster_name), PLACEMENT_KEY, changes, f"where cluster {cluster_name!r} lives"
        )

    def _region_of(self, cluster_name: str) -> str | None:
        if self.region:
            return self.region
        placement = self._placement(cluster_name)
        return placement.region if placement else None

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        placement = self._placement(cluster_name)
        if placement is None:
            return ClusterInfo(cluster_name, "aws", self.region, self.zone)
        return ClusterInfo(
            cluster_name, "aws", placement.region, self.zone_name(placement.region, placement.zone)
        )

    def _zones(self, region: str) -> dict[str, str]:
        """Zone name -> zone id in `region`, as this account sees them."""
        with self._lock:
            cached = self._zone_ids.get(region)
        if cached is None:
            zones = self._client("ec2", region).describe_availability_zones()["AvailabilityZones"]
            cached = {z["ZoneName"]: z["ZoneId"] for z in zones}
            with self._lock:
                self._zone_ids[region] = cached
        return cached

    def zone_id(self, region: str, zone: str) -> str:
        """`zone` as the catalog names it (its id): a name (us-east-1a) is looked up, an id kept."""
        zones = self._zones(region)
        if zone in zones.values():
            return zone
        if zone not in zones:
            raise SpecError(f"zone: {zone} is not a zone of {region} (zones: {', '.join(sorted(zones))})")
        return zones[zone]

    def zone_name(self, region: str, zone_id: str) -> str:
        return next((name for name, zid in self._zones(region).items() if zid == zone_id), zone_id)

    def clusters(self) -> Sequence[str]:
        s = self.settings
        return cluster_names(self._client("dynamodb", s.state_region), s.state_table)

    def ssh_private_key(self, cluster_name: str) -> str:
        return self.settings.ssh_key_file

    # ---- reading membership ----------------------------------------------------------------------------

    def _members(self, cluster_name: str, region: str) -> list[Member]:
        ec2 = self._client("ec2", region)
        found: list[Member] = []
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{instances.TAG_CLUSTER}", "Values": [cluster_name]}]
        ):
            for reservation in page["Reservations"]:
                found.extend(instances.member_of(i) for i in reservation["Instances"])
        return found

    def nodes(self, cluster_name: str) -> list[Node]:
        region = self._region_of(cluster_name)
        if region is None:
            return []
        current = instances.current_members(self._members(cluster_name, region))
        return [self._node(rank, m, region) for rank, m in current.items()]

    def _node(self, rank: int, m: Member, region: str) -> Node:
        endpoint = self._endpoint(m)
        return Node(
            rank=rank,
            internal_ip=endpoint.internal_ip,
            ssh_host=endpoint.host,
            ssh_port=endpoint.port,
            ssh_user=endpoint.user,
            instance_id=m.instance_id,
            status=instances.status_of(m),
            gpus=catalog.accelerator_count("aws", m.instance_type),
            host_key=m.host_key,
            console_url=instances.console_url(region, m.instance_id),
        )

    def _endpoint(self, m: Member) -> Endpoint:
        if self._resolver is not None:
            found = self._resolver(m.instance_id)
            return Endpoint(
                str(found["host"]),
                int(found["port"]),
                str(found["user"]),
                str(found["internal_ip"]),
                found.get("host_key"),
            )
        s = self.settings
        host = m.private_ip if s.use_private_ip else (m.public_ip or m.private_ip)
        return Endpoint(host or "", 22, s.ssh_user, m.private_ip or "")

    # ---- provisioning ----------------------------------------------------------------------------------

    def plan(self, request: ProvisionRequest) -> list[Placement]:
        """The placements to try, best first: the optimizer's order over the aws catalog."""
        resources = request.resources or Resources()
        pin: dict[str, Any] = {"cloud": "aws"}
        if self.region:
            pin.update(region=self.region, zone=self.zone or resources.zone)
        zone = pin.get("zone") or resources.zone
        region = pin.get("region") or resources.region
        if zone and region:
            pin.update(region=region, zone=self.zone_id(region, zone))
        resources = resources.copy(**pin) if resources.cloud in (None, "aws") or self.region else resources
        choices = optimizer.plan(resources, request.num_nodes, clouds=["aws"])
        allowed = self.settings.regions
        placements: list[Placement] = []
        for c in choices:
            p = Placement(c.offering.region, c.offering.zone, c.offering.instance_type, c.use_spot)
            if (allowed is None or p.region in allowed) and p not in placements:
                placements.append(p)
        if not placements:
            raise ClusterError(
                f"aws: no placement in the allowed regions ({', '.join(allowed or ())}) fits the resources"
            )
        return placements

    def provision(self, request: ProvisionRequest) -> list[Node]:
        cluster = request.cluster_name
        recorded = self._placement(cluster)
        region = self.region or (recorded.region if recorded else None)
        members = self._members(cluster, region) if region else []
        current = instances.current_members(members)
        stopped = [
            m.instance_id for r, m in current.items() if m.state == "stopped" and r < request.num_nodes
        ]
        if stopped and region is not None:
            # Stopped by autostop: start them again (same disks, same host keys, new addresses).
            log.info("aws: %s: starting %d stopped instance(s)", cluster, len(stopped))
            self._client("ec2", region).start_instances(InstanceIds=stopped)
            members = self._members(cluster, region)
            current = instances.current_members(members)
        held = {r: m for r, m in current.items() if m.state in instances.LIVE_STATES}
        missing = [r for r in range(request.num_nodes) if r not in held]
        # Nodes already up fix the placement: the rest join them in the same zone, with the same type.
        placements = [recorded] if held and recorded is not None else self.plan(request)
        if missing:
            known = [m.instance_id for m in members]
            try:
                self._launch_somewhere(cluster, missing, placements, request, known)
            except BaseException:
                self._forget_if_empty(cluster)  # a cluster that never came up leaves no record either
                raise
        nodes = self.nodes(cluster)
        pending = [n for n in nodes if n.status is not NodeStatus.RUNNING]
        if pending:
            # Adopted nodes still booting (a provision retried mid-launch): wait for them like for new ones.
            region = self._region_of(cluster)
            assert region is not None
            self._wait_ready(cluster, region, [n.instance_id for n in pending])
            nodes = self.nodes(cluster)
        return nodes

    def _launch_somewhere(
        self,
        cluster: str,
        ranks: list[int],
        placements: Sequence[Placement],
        request: ProvisionRequest,
        known: list[str],
    ) -> list[str]:
        """Launch `ranks` in the first placement with room; with retry_until_up, keep going round."""
        return launch_with_failover(
            self.name,
            cluster,
            placements,
            lambda placement: self._launch(cluster, ranks, placement, request, known),
            request.retry_until_up,
        )

    def _forget_if_empty(self, cluster: str) -> None:
        if not self.nodes(cluster):
            self._store(cluster).delete_all()

    def _launch(
        self,
        cluster: str,
        ranks: list[int],
        placement: Placement,
        request: ProvisionRequest,
        known: list[str],
    ) -> list[str]:
        """Bring up `ranks` in `placement`; returns the instance ids. Ends what it made when it fails."""
        s = self.settings
        region = placement.region
        ec2 = self._client("ec2", region)
        resources = request.resources or Resources()
        key_name = network.ensure_key_pair(ec2, public_key_of(s.ssh_key_file))
        vpc = network.default_vpc(ec2, region)
        group = network.ensure_security_group(ec2, vpc, s.security_group, s.ssh_cidr)
        subnet = network.subnet_in_zone(ec2, vpc, self.zone_name(region, placement.zone))
        image, root_device = network.resolve_image(
            ec2,
            self._client("ssm", region),
            image_for(resources, region, "aws", "an AMI id (ami-...) or resolve:ssm:<parameter>"),
            placement.instance_type,
            region,
            self.image_parameters,
        )
        self._record_placement(cluster, placement, image, _disk_size(resources))
        day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        token = instances.launch_token(cluster, ranks, placement.label, known, day)
        adopted = [
            m.instance_id
            for m in self._members(cluster, region)
            if not m.ended
            and m.state in instances.LIVE_STATES
            and m.instance_id not in known
            and self._launch_tag(ec2, m.instance_id) == token
        ]
        if adopted:
            log.info(
                "aws: %s: found the %d instance(s) of an earlier try of this launch", cluster, len(adopted)
            )
            ids = adopted
        else:
            log.info("aws: %s: launching %d x %s", cluster, len(ranks), placement.label)
            ids = self._run_instances(
                ec2, cluster, ranks, placement, request, token, key_name, group, subnet, image, root_device
            )
        try:
            self._tag_ranks(ec2, ids, ranks, cluster)
            self._wait_ready(cluster, region, ids)
        except BaseException:
            self._end(region, ids)
            raise
        return ids

    def _launch_tag(self, ec2: Any, instance_id: str) -> str | None:
        for reservation in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]:
            for i in reservation["Instances"]:
                return instances.tags_of(i).get(instances.TAG_LAUNCH)
        return None

    def _run_instances(
        self,
        ec2: Any,
        cluster: str,
        ranks: list[int],
        placement: Placement,
        request: ProvisionRequest,
        token: str,
        key_name: str,
        group: str,
        subnet: str,
        image: str,
        root_device: str,
    ) -> list[str]:
        resources = request.resources or Resources()
        tags = [
            {"Key": instances.TAG_CLUSTER, "Value": cluster},
            {"Key": instances.TAG_LAUNCH, "Value": token},
            {"Key": instances.TAG_RANKS, "Value": instances.format_ranks(ranks)},
        ]
        if request.job_name:
            tags.append({"Key": instances.TAG_JOB, "Value": request.job_name[:255]})
        if len(ranks) == 1:
            tags += [
                {"Key": instances.TAG_RANK, "Value": str(ranks[0])},
                {"Key": "Name", "Value": f"{cluster}-{ranks[0]}"},
            ]
        args: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": placement.instance_type,
            "MinCount": len(ranks),
            "MaxCount": len(ranks),
            "KeyName": key_name,
            "ClientToken": token,
            "NetworkInterfaces": [
                {
                    "DeviceIndex": 0,
                    "SubnetId": subnet,
                    "Groups": [group],
                    "AssociatePublicIpAddress": not self.settings.use_private_ip,
                }
            ],
            "BlockDeviceMappings": [
                {
                    "DeviceName": root_device,
                    "Ebs": {
                        "VolumeSize": _disk_size(resources),
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ],
            # The node's own `shutdown` stops or ends it: autostop's dead-man switch needs no credentials.
            "InstanceInitiatedShutdownBehavior": _shutdown_behavior(
                resources, placement, self._launch_settings(cluster).get("shutdown")
            ),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags[:1]},
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        profile = self.settings.iam_instance_profile
        if profile:
            # The nodes' own identity: their role reaches the task's s3:// buckets, no key is sent to them.
            args["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        if placement.use_spot:
            args["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
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
            if instance_id is None:
                continue
            ec2.create_tags(
                Resources=[instance_id],
                Tags=[
                    {"Key": instances.TAG_RANK, "Value": str(rank)},
                    {"Key": "Name", "Value": f"{cluster}-{rank}"},
                ],
            )

    def _wait_ready(self, cluster: str, region: str, ids: list[str]) -> None:
        """Running (or a lost launch: NoCapacity for spot), host keys pinned, SSH answering; each bounded."""
        ec2 = self._client("ec2", region)
        by_id = self._wait_running(ec2, cluster, region, ids)
        for instance_id, member in by_id.items():
            if member.host_key is None:
                key, source = self._learn_host_key(ec2, member)
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

    def _wait_running(self, ec2: Any, cluster: str, region: str, ids: list[str]) -> dict[str, Member]:
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

    def _learn_host_key(self, ec2: Any, member: Member) -> tuple[str, str]:
        """The instance's SSH host key and where it was learned: console, first-contact (or emulator)."""
        if self._resolver is not None:
            key = self._endpoint(member).host_key
            if not key:
                raise ClusterError(f"aws: the endpoint resolver gave no host key for {member.instance_id}")
            return key, "emulator"
        deadline = time.monotonic() + self.console_timeout_s
        while time.monotonic() < deadline:
            try:
                output = (
                    ec2.get_console_output(InstanceId=member.instance_id, Latest=True).get("Output") or ""
                )
            except ClientError:
                output = ""
            key = host_key_from_console(output)
            if key:
                return key, "console"
            time.sleep(max(self.poll_s, 10.0))
        return self._first_contact_key(member), "first-contact"

    def _first_contact_key(self, member: Member) -> str:
        """The key a first SSH contact presents, kept only if that machine proves to be `member`."""
        import paramiko

        endpoint = self._endpoint(member)
        seen: list[paramiko.PKey] = []

        class _Remember(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
                seen.append(key)

        deadline = time.monotonic() + self.ssh_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(_Remember())
            try:
                client.connect(
                    endpoint.host,
                    endpoint.port,
                    username=endpoint.user,
                    key_filename=self.settings.ssh_key_file,
                    timeout=10,
                    allow_agent=False,
                    look_for_keys=False,
                )
                _, stdout, _ = client.exec_command(_INSTANCE_ID_COMMAND, timeout=30)
                answered = stdout.read().decode().strip()
            except (OSError, paramiko.SSHException) as e:
                last = e
                time.sleep(self.poll_s)
                continue
            finally:
                client.close()
            if answered != member.instance_id or not seen:
                raise ClusterError(
                    f"aws: the machine at {endpoint.host} says it is {answered or 'nothing'}, not "
                    f"{member.instance_id}; its host key is not pinned and the node is not used"
                )
            return f"{seen[0].get_name()} {seen[0].get_base64()}"
        raise ClusterError(f"aws: {member.instance_id} at {endpoint.host} never answered SSH: {last}")

    def _wait_ssh(self, nodes: list[Node]) -> None:
        wait_for_ssh(self.name, nodes, self.settings.ssh_key_file, self.ssh_timeout_s, self.poll_s)

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
        others = [
            p
            for p in self.plan(
                ProvisionRequest(
                    cluster_name,
                    1,
                    Resources(
                        instance_type=placement.instance_type,
                        use_spot=placement.use_spot,
                        infra=f"aws/{region}",
                    ),
                )
            )
            if p.region == region and p != placement
        ]
        launched = self._launch_settings(cluster_name)
        same = Resources(
            instance_type=placement.instance_type,
            use_spot=placement.use_spot,
            image_id=launched.get("image"),
            disk_size=launched.get("disk_size"),
        )
        request = ProvisionRequest(cluster_name, rank + 1, same)
        self._launch_somewhere(
            cluster_name, [rank], [placement, *others], request, [m.instance_id for m in members]
        )
        node = next((n for n in self.nodes(cluster_name) if n.rank == rank), None)
        if node is None or node.status is not NodeStatus.RUNNING:
            raise ClusterError(f"aws: the replacement for rank {rank} of {cluster_name!r} is not running")
        return node

    # ---- autostop ----------------------------------------------------------------------------------

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        # What `shutdown` does to the instance (stop or terminate) was set by prepare_autostop.
        return "sudo -n shutdown -h now || sudo -n poweroff || shutdown -h now"

    def prepare_autostop(self, cluster_name: str, down: bool) -> None:
        placement = self._placement(cluster_name)
        region = self._region_of(cluster_name)
        if placement is None or region is None:
            raise ClusterError(f"aws: cluster {cluster_name!r} not found; cannot set its autostop")
        if placement.use_spot and not down:
            raise SpecError(
                "resources.autostop: spot instances cannot be stopped, only ended; set `down: true` "
                "(or add --down to -i)"
            )
        behavior = "terminate" if down else "stop"
        ec2 = self._client("ec2", region)
        for m in self._members(cluster_name, region):
            if m.state in instances.LIVE_STATES and not m.ended:
                ec2.modify_instance_attribute(
                    InstanceId=m.instance_id, Attribute="instanceInitiatedShutdownBehavior", Value=behavior
                )
        self._record_shutdown(cluster_name, behavior)

    def _record_shutdown(self, cluster_name: str, behavior: str) -> None:
        update_record(
            self._store(cluster_name), PLACEMENT_KEY, {"shutdown": behavior}, "the autostop behavior"
        )

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


# Nitro instances carry their id as the DMI asset tag; otherwise ask the instance metadata (IMDSv2).
_INSTANCE_ID_COMMAND = (
    "cat /sys/devices/virtual/dmi/id/board_asset_tag 2>/dev/null | grep -E '^i-' || "
    'curl -s -m 5 -H "X-aws-ec2-metadata-token: $(curl -s -m 5 -X PUT '
    "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)\" "
    "http://169.254.169.254/latest/meta-data/instance-id"
)


def _shutdown_behavior(resources: Resources, placement: Placement, recorded: str | None) -> str:
    """`stop` for autostop without down on on-demand instances; `terminate` otherwise (one-time spot
    instances cannot stop). A node launched into a cluster (a replacement) does what the others do."""
    if recorded in ("stop", "terminate"):
        return recorded
    autostop = resources.autostop
    if isinstance(autostop, dict) and not autostop["down"] and not placement.use_spot:
        return "stop"
    return "terminate"


def _disk_size(resources: Resources) -> int:
    return int(resources.disk_size or DEFAULT_DISK_SIZE_GB)
