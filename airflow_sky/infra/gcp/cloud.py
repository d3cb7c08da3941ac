"""The gcp infra: a cluster is a set of GCE VMs found by their labels, made through the google provider.

`infra: gcp` lets the optimizer choose region, zone and machine type (cheapest first); `gcp/<region>` or
`gcp/<region>/<zone>` pins it. Provisioning, in one placement (zone, machine type, spot or not):

1. the firewall rules: SSH from `ssh_cidr` to the `airflow-sky` tag (shared), and all traffic between the
   VMs of the cluster's own tag (`sky-<cluster>`, removed with the cluster);
2. one insert per missing rank, each named `<cluster>-<rank>-<token>` and sent with a request id derived
   from the launch (a retried provision gets the same VMs, never more); labels are the only state;
3. the insert operations are polled to the end; the VMs waited for, each with a deadline, until RUNNING,
   their host keys published and SSH answering;
4. a failure after an insert deletes what this provision made. A stock-out or quota error moves on to the
   next placement in the optimizer's order; `retry_until_up` starts the list again, with backoff.

Host keys are pinned from the guest attributes (`hostkeys/`, published by the guest environment over the
metadata server, read through the authenticated API), or else from the serial console (cloud-init's block).
The SSH key reaches the VMs through instance metadata (`ssh-keys`). Spot VMs are deleted when preempted;
`nodes` reports the rank PREEMPTED when GCE's `compute.instances.preempted` operation names its VM.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra import catalog, optimizer
from airflow_sky.infra.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.api import ComputeApi, GceError
from airflow_sky.infra.gcp.settings import DEFAULT_CONN_ID, GcpSettings, settings_from_extra
from airflow_sky.infra.gcp.state_store import GcsStateStore, cluster_names, ensure_bucket
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
DEFAULT_DISK_SIZE_GB = 256
# For emulators only: "module:function" taking (vm name) and returning {"host", "port", "user",
# "internal_ip", "host_key"} of a machine that plays the VM (the tests' local nodes).
ENDPOINT_RESOLVER_ENV = "AIRFLOW_SKY_GCP_ENDPOINT_RESOLVER"


@dataclasses.dataclass(frozen=True)
class Placement:
    region: str
    zone: str
    machine_type: str
    use_spot: bool
    accelerator: str | None = None
    accelerator_count: int = 0

    @property
    def label(self) -> str:
        return f"{self.zone} {self.machine_type}{' (spot)' if self.use_spot else ''}"


class GcpCloud(Cloud):
    name = "gcp"
    default_image = vms.DEFAULT_IMAGE

    def __init__(self, location: str = "", conn_id: str | None = None) -> None:
        parts = [p for p in (location or "").split("/") if p]
        if len(parts) > 2:
            raise SpecError(f"infra: gcp takes gcp, gcp/<region> or gcp/<region>/<zone>, got gcp/{location}")
        self.region = parts[0] if parts else None
        self.zone = parts[1] if len(parts) > 1 else None
        self.conn_id = conn_id or DEFAULT_CONN_ID
        self._settings: GcpSettings | None = None
        self._api: ComputeApi | None = None
        self._storage: Any = None
        self._lock = threading.Lock()
        self._resolver = resolver_from_env(ENDPOINT_RESOLVER_ENV)
        self.running_timeout_s = 600.0
        self.host_key_timeout_s = 300.0
        self.ssh_timeout_s = 600.0
        self.poll_s = 3.0

    # ---- connection ------------------------------------------------------------------------------------

    def _hook(self) -> Any:
        from airflow.providers.google.cloud.hooks.compute import ComputeEngineHook

        return ComputeEngineHook(gcp_conn_id=self.conn_id)

    @property
    def settings(self) -> GcpSettings:
        if self._settings is None:
            try:
                extras = dict(self._hook().extras)
            except Exception as e:  # Airflow raises its own not-found types, which differ between contexts
                raise SpecError(f"gcp: Airflow connection {self.conn_id!r} cannot be read: {e}") from e
            project = extras.get("project") or extras.get("extra__google_cloud_platform__project")
            self._settings = settings_from_extra(self.conn_id, extras, project)
        return self._settings

    def _credentials(self) -> Any:
        if self.settings.anonymous_credentials:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return self._hook().get_credentials()

    @property
    def api(self) -> ComputeApi:
        with self._lock:
            if self._api is None:
                s = self.settings
                self._api = ComputeApi(s.project, self._credentials(), s.compute_endpoint)
                self._api.poll_s = min(self._api.poll_s, self.poll_s)
            return self._api

    def _storage_client(self) -> Any:
        with self._lock:
            if self._storage is None:
                from google.cloud.storage import Client

                s = self.settings
                options = {"api_endpoint": s.storage_endpoint} if s.storage_endpoint else None
                self._storage = Client(
                    project=s.project, credentials=self._credentials(), client_options=options
                )
            return self._storage

    def node_bucket_identity(self) -> frozenset[str]:
        return frozenset({"gcs"}) if self.settings.service_account else frozenset()

    def check_config(self) -> None:
        try:
            self._credentials()
        except Exception as e:  # google.auth's DefaultCredentialsError, a key file that does not parse, ...
            raise SpecError(
                f"gcp: no usable Google credentials for connection {self.conn_id!r}: {e} (see docs/infra-gcp.md)"
            ) from e
        public_key_of(self.settings.ssh_key_file)

    # ---- where a cluster lives -----------------------------------------------------------------------

    def state_store(self, cluster_name: str) -> StateStore:
        return self._store(cluster_name)

    def _store(self, cluster_name: str) -> GcsStateStore:
        s = self.settings
        ensure_bucket(self._storage_client(), s.state_bucket, s.state_location)
        return GcsStateStore(self._storage_client(), s.state_bucket, cluster_name)

    def _record(self, cluster_name: str) -> dict[str, Any] | None:
        record = self._store(cluster_name).get(PLACEMENT_KEY)
        return record.data if record else None

    def _placement(self, cluster_name: str) -> Placement | None:
        data = self._record(cluster_name)
        if data is None:
            return None
        return Placement(**{f.name: data[f.name] for f in dataclasses.fields(Placement) if f.name in data})

    def _update_record(self, cluster_name: str, changes: dict[str, Any]) -> None:
        update_record(
            self._store(cluster_name), PLACEMENT_KEY, changes, f"where cluster {cluster_name!r} lives"
        )

    def _zone_of(self, cluster_name: str) -> str | None:
        placement = self._placement(cluster_name)
        if placement is not None:
            return placement.zone
        return self.zone

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        placement = self._placement(cluster_name)
        if placement is None:
            return ClusterInfo(cluster_name, "gcp", self.region, self.zone)
        return ClusterInfo(cluster_name, "gcp", placement.region, placement.zone)

    def clusters(self) -> Sequence[str]:
        s = self.settings
        ensure_bucket(self._storage_client(), s.state_bucket, s.state_location)
        return cluster_names(self._storage_client(), s.state_bucket)

    def ssh_private_key(self, cluster_name: str) -> str:
        return self.settings.ssh_key_file

    # ---- reading membership ----------------------------------------------------------------------------

    def _vms(self, cluster_name: str, zone: str) -> list[vms.Vm]:
        return [vms.vm_of(i) for i in self.api.list_instances(zone, vms.LABEL_CLUSTER, cluster_name)]

    def nodes(self, cluster_name: str) -> list[Node]:
        record = self._record(cluster_name) or {}
        zone = record.get("zone") or self.zone
        if zone is None:
            return []
        current = vms.current_vms(self._vms(cluster_name, zone))
        spot = bool(record.get("use_spot")) or any(v.spot for v in current.values())
        preempted = self.api.preempted(zone) if spot else set()
        keys: dict[str, str] = record.get("host_keys") or {}
        nodes = [
            self._node(rank, vm, vm.name in preempted, keys.get(vm.name)) for rank, vm in current.items()
        ]
        # A preempted spot VM is deleted: its rank is gone from the labels; GCE's operation still names it.
        for rank in range(int(record.get("num_nodes", 0))):
            if rank not in current:
                lost = sorted(n for n in preempted if n.startswith(f"{cluster_name[:40]}-{rank}-"))
                if lost:
                    user = self.settings.ssh_user
                    nodes.append(Node(rank, "", "", 22, user, lost[-1], status=NodeStatus.PREEMPTED))
        return sorted(nodes, key=lambda n: n.rank)

    def _node(self, rank: int, vm: vms.Vm, preempted: bool, host_key: str | None) -> Node:
        endpoint = self._endpoint(vm)
        return Node(
            rank=rank,
            internal_ip=str(endpoint["internal_ip"]),
            ssh_host=str(endpoint["host"]),
            ssh_port=int(endpoint["port"]),
            ssh_user=str(endpoint["user"]),
            instance_id=vm.name,
            status=vms.status_of(vm, preempted),
            gpus=catalog.accelerator_count("gcp", vm.machine_type),
            host_key=host_key,
            console_url=vms.console_url(self.settings.project, vm.zone, vm.name),
        )

    def _endpoint(self, vm: vms.Vm) -> dict[str, Any]:
        if self._resolver is not None:
            return self._resolver(vm.name)
        s = self.settings
        host = vm.internal_ip if s.use_private_ip else (vm.external_ip or vm.internal_ip)
        return {"host": host or "", "port": 22, "user": s.ssh_user, "internal_ip": vm.internal_ip or ""}

    # ---- provisioning ----------------------------------------------------------------------------------

    def plan(self, request: ProvisionRequest) -> list[Placement]:
        """The placements to try, best first: the optimizer's order over the gcp catalog."""
        resources = request.resources or Resources()
        pin: dict[str, Any] = {"cloud": "gcp"}
        if self.region:
            pin.update(region=self.region, zone=self.zone or resources.zone)
        resources = resources.copy(**pin) if resources.cloud in (None, "gcp") or self.region else resources
        allowed = self.settings.regions
        placements: list[Placement] = []
        for c in optimizer.plan(resources, request.num_nodes, clouds=["gcp"]):
            o = c.offering
            p = Placement(o.region, o.zone, o.instance_type, c.use_spot, o.accelerator, o.accelerator_count)
            if (allowed is None or p.region in allowed) and p not in placements:
                placements.append(p)
        if not placements:
            raise ClusterError(f"gcp: no placement in the allowed regions ({', '.join(allowed or ())}) fits")
        return placements

    def provision(self, request: ProvisionRequest) -> list[Node]:
        cluster = request.cluster_name
        recorded = self._placement(cluster)
        zone = recorded.zone if recorded else self.zone
        current = vms.current_vms(self._vms(cluster, zone)) if zone else {}
        stopped = [
            v for r, v in current.items() if v.status == "TERMINATED" and not v.spot and r < request.num_nodes
        ]
        if stopped and zone is not None:
            # Stopped by autostop: start them again (same disks, same host keys, new addresses).
            log.info("gcp: %s: starting %d stopped VM(s)", cluster, len(stopped))
            for vm in stopped:
                op = self.api.start_instance(
                    zone, vm.name, vms.request_id(f"start-{vm.name}-{vm.created}", 0)
                )
                self.api.wait_zone_operation(zone, op, self.running_timeout_s)
            current = vms.current_vms(self._vms(cluster, zone))
        held = {r: v for r, v in current.items() if v.status in vms.LIVE_STATUSES}
        missing = [r for r in range(request.num_nodes) if r not in held]
        placements = [recorded] if held and recorded is not None else self.plan(request)
        if missing:
            known = [v.name for v in current.values()]
            try:
                self._launch_somewhere(cluster, missing, placements, request, known)
            except BaseException:
                self._forget_if_empty(cluster)
                raise
        else:
            self._update_record(cluster, {"num_nodes": max(request.num_nodes, len(held))})
        nodes = self.nodes(cluster)
        pending = [n for n in nodes if n.status is not NodeStatus.RUNNING]
        if pending:
            placement = self._placement(cluster)
            assert placement is not None
            self._wait_ready(cluster, placement, [n.instance_id for n in pending])
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
        zone = self._zone_of(cluster)
        if zone is None or not self._vms(cluster, zone):
            self._store(cluster).delete_all()
            self.api.delete_firewall(vms.internal_firewall(cluster))

    def _launch(
        self,
        cluster: str,
        ranks: list[int],
        placement: Placement,
        request: ProvisionRequest,
        known: list[str],
    ) -> list[str]:
        s = self.settings
        resources = request.resources or Resources()
        autostop = resources.autostop if isinstance(resources.autostop, dict) else None
        forms = "an image (projects/P/global/images/NAME or .../images/family/F)"
        image = image_for(resources, placement.region, "gcp", forms) or self.default_image
        disk = int(resources.disk_size or DEFAULT_DISK_SIZE_GB)
        self._update_record(
            cluster,
            dataclasses.asdict(placement)
            | {"num_nodes": max(request.num_nodes, max(ranks) + 1), "image": image, "disk_size": disk},
        )
        self._ensure_firewalls(cluster)
        day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        token = vms.launch_token(cluster, ranks, placement.label, known, day)
        public_key = public_key_of(s.ssh_key_file)
        names = [vms.vm_name(cluster, rank, token) for rank in ranks]
        log.info("gcp: %s: creating %d x %s", cluster, len(ranks), placement.label)
        operations: list[str] = []
        try:
            for rank, name in zip(ranks, names, strict=True):
                body = vms.instance_body(
                    name=name,
                    zone=placement.zone,
                    machine_type=placement.machine_type,
                    accelerator=placement.accelerator,
                    accelerator_count=placement.accelerator_count,
                    spot=placement.use_spot,
                    image=image,
                    disk_gb=disk,
                    network=s.network,
                    labels={vms.LABEL_CLUSTER: cluster, vms.LABEL_RANK: str(rank), vms.LABEL_LAUNCH: token},
                    tags=[vms.SSH_TAG, vms.network_tag(cluster)],
                    ssh_user=s.ssh_user,
                    public_key=public_key,
                    external_ip=not s.use_private_ip,
                    self_delete=bool(autostop and autostop["down"]),
                    service_account=s.service_account,
                )
                try:
                    operations.append(
                        self.api.insert_instance(placement.zone, body, vms.request_id(token, rank))
                    )
                except GceError as e:
                    if e.code != "alreadyExists":  # a retried launch meets the VM it made: adopt it
                        raise
            for op in operations:
                self.api.wait_zone_operation(placement.zone, op, self.running_timeout_s)
            self._wait_ready(cluster, placement, names)
        except GceError as e:
            self._delete(placement.zone, names)
            if e.code in vms.STOCKOUT_ERRORS:
                raise NoCapacity(placement, e.code, str(e)) from e
            raise ClusterError(f"gcp: creating VMs in {placement.label} failed: {e}") from e
        except BaseException:
            self._delete(placement.zone, names)
            raise
        return names

    def _ensure_firewalls(self, cluster: str) -> None:
        s = self.settings
        network = f"global/networks/{s.network}"
        if self.api.firewall("airflow-sky-ssh") is None:
            self.api.insert_firewall(
                {
                    "name": "airflow-sky-ssh",
                    "network": network,
                    "direction": "INGRESS",
                    "sourceRanges": [s.ssh_cidr],
                    "targetTags": [vms.SSH_TAG],
                    "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                    "description": "airflow-sky: SSH to cluster nodes",
                }
            )
        tag = vms.network_tag(cluster)
        if self.api.firewall(vms.internal_firewall(cluster)) is None:
            self.api.insert_firewall(
                {
                    "name": vms.internal_firewall(cluster),
                    "network": network,
                    "direction": "INGRESS",
                    "sourceTags": [tag],
                    "targetTags": [tag],
                    "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
                    "description": f"airflow-sky: all traffic between the nodes of cluster {cluster}",
                }
            )

    def _wait_ready(self, cluster: str, placement: Placement, names: list[str]) -> None:
        """RUNNING, host keys pinned, SSH answering; each bounded."""
        zone = placement.zone
        deadline = time.monotonic() + self.running_timeout_s
        while True:
            found = {v.name: v for v in self._vms(cluster, zone) if v.name in names}
            gone = [n for n in names if n not in found] or [
                n for n, v in found.items() if v.status in ("STOPPING", "TERMINATED")
            ]
            if gone:
                raise GceError("ZONE_RESOURCE_POOL_EXHAUSTED", f"VM(s) {', '.join(gone)} gone while starting")
            if all(v.status == "RUNNING" for v in found.values()):
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"gcp: VM(s) of {cluster} not RUNNING after {self.running_timeout_s:.0f} s"
                )
            time.sleep(self.poll_s)
        keys = dict((self._record(cluster) or {}).get("host_keys") or {})
        for name, vm in found.items():
            if name not in keys:
                keys[name] = self._learn_host_key(vm)
        self._update_record(cluster, {"host_keys": keys})
        ranked = {vm.name: (rank, vm) for rank, vm in vms.current_vms(self._vms(cluster, zone)).items()}
        nodes = [self._node(*ranked[n], False, keys.get(n)) for n in names if n in ranked]
        self._wait_ssh(nodes)

    def _learn_host_key(self, vm: vms.Vm) -> str:
        if self._resolver is not None:
            key = self._resolver(vm.name).get("host_key")
            if not key:
                raise ClusterError(f"gcp: the endpoint resolver gave no host key for {vm.name}")
            return str(key)
        deadline = time.monotonic() + self.host_key_timeout_s
        while time.monotonic() < deadline:
            key = vms.host_key_from_guest_attributes(self.api.guest_attributes(vm.zone, vm.name, "hostkeys/"))
            key = key or host_key_from_console(self.api.serial_output(vm.zone, vm.name))
            if key:
                return key
            time.sleep(max(self.poll_s, 5.0))
        raise ClusterError(
            f"gcp: {vm.name} published no host key (guest attributes or serial console) within "
            f"{self.host_key_timeout_s:.0f} s; its key cannot be pinned, so it is not used"
        )

    def _wait_ssh(self, nodes: list[Node]) -> None:
        wait_for_ssh(self.name, nodes, self.settings.ssh_key_file, self.ssh_timeout_s, self.poll_s)

    # ---- replacing and ending ------------------------------------------------------------------------

    def replace(self, cluster_name: str, rank: int) -> Node:
        record = self._record(cluster_name)
        placement = self._placement(cluster_name)
        if placement is None or record is None:
            raise ClusterError(f"gcp: cluster {cluster_name!r} not found; cannot replace rank {rank}")
        current = vms.current_vms(self._vms(cluster_name, placement.zone))
        old = current.get(rank)
        if old is not None:
            self._delete(placement.zone, [old.name])
        same = Resources(
            instance_type=placement.machine_type,
            use_spot=placement.use_spot,
            image_id=record.get("image"),
            disk_size=record.get("disk_size"),
        )
        request = ProvisionRequest(cluster_name, int(record.get("num_nodes", rank + 1)), same)
        known = [v.name for v in current.values()]
        self._launch_somewhere(cluster_name, [rank], [placement], request, known)
        node = next((n for n in self.nodes(cluster_name) if n.rank == rank), None)
        if node is None or node.status is not NodeStatus.RUNNING:
            raise ClusterError(f"gcp: the replacement for rank {rank} of {cluster_name!r} is not running")
        return node

    def _delete(self, zone: str, names: list[str]) -> None:
        operations = []
        for name in names:
            op = self.api.delete_instance(zone, name, vms.request_id(f"delete-{name}", 0))
            if op is not None:
                operations.append(op)
        for op in operations:
            try:
                self.api.wait_zone_operation(zone, op, self.running_timeout_s)
            except GceError as e:
                log.warning("gcp: deleting in %s: %s", zone, e)

    def terminate(self, cluster_name: str) -> None:
        zone = self._zone_of(cluster_name)
        if zone is not None:
            found = [(zone, v.name) for v in self._vms(cluster_name, zone)]
        else:  # the record is gone: look in every zone for VMs with the cluster's label
            found = [
                (str(i.get("zone", "")).rsplit("/", 1)[-1], str(i["name"]))
                for i in self.api.list_all_instances(vms.LABEL_CLUSTER, cluster_name)
            ]
        by_zone: dict[str, list[str]] = {}
        for z, name in found:
            by_zone.setdefault(z, []).append(name)
        for z, names in by_zone.items():
            log.info("gcp: %s: deleting %d VM(s) in %s", cluster_name, len(names), z)
            self._delete(z, names)
        self.api.delete_firewall(vms.internal_firewall(cluster_name))
        self._store(cluster_name).delete_all()

    # ---- autostop ----------------------------------------------------------------------------------

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        return f"{vms.SELF_DELETE} || {vms.SHUTDOWN}" if down else vms.SHUTDOWN

    def prepare_autostop(self, cluster_name: str, down: bool) -> None:
        placement = self._placement(cluster_name)
        if placement is not None and placement.use_spot and not down:
            raise SpecError(
                "resources.autostop: spot VMs cannot be stopped, only ended; set `down: true` "
                "(or add --down to -i)"
            )
