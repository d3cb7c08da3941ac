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

`network_tier: best` adds the cluster's compact placement policy, gVNIC and the type's GPU NICs (fabric.py);
`ports` a firewall rule of exactly those ports; `disk_tier` and `labels` shape each VM (vm_fields.py). All
are recorded with the cluster: `network_env` and `opened_ports` read them back; teardown removes them.

Host keys are pinned from the guest attributes (`hostkeys/`, published by the guest environment over the
metadata server, read through the authenticated API), or else from the serial console (cloud-init's block).
The SSH key reaches the VMs through instance metadata (`ssh-keys`). Spot VMs are deleted when preempted;
`nodes` reports the rank PREEMPTED when GCE's `compute.instances.preempted` operation names its VM.

The skeleton of a provision (stopped VMs, missing ranks, failover, waiting) is infra/provisioner.py's; this
driver supplies its GCE primitives. The cluster's record: placement.py; the connection's clients:
connection.py; the firewall rules: network.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable
from typing import Any

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra import catalog, notices, optimizer, provisioner, provisioning
from airflow_sky.infra.base import Endpoint, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.gcp import network, vm_fields, vms
from airflow_sky.infra.gcp.api import GceError
from airflow_sky.infra.gcp.fabric import fabric_of
from airflow_sky.infra.gcp.placement import GcpClusterRecords, Placement
from airflow_sky.infra.host_keys import host_key_from_console
from airflow_sky.infra.keys import public_key_of
from airflow_sky.infra.provisioner import LaunchOrder, Survey
from airflow_sky.infra.provisioning import NoCapacity, disk_size_gb, image_for
from airflow_sky.infra.vm_cloud import SHUTDOWN
from airflow_sky.task import Resources

log = logging.getLogger(__name__)

# For emulators only: "module:function" taking (vm name) and returning {"host", "port", "user",
# "internal_ip", "host_key"} of a machine that plays the VM (the tests' local nodes).
ENDPOINT_RESOLVER_ENV = "AIRFLOW_SKY_GCP_ENDPOINT_RESOLVER"


class GcpCloud(GcpClusterRecords):
    name = "gcp"
    notice_window_s = notices.GCP_WINDOW_S  # GCE reports a noticed spot VM running (gang.notice_claims)

    def notice_check(self, cluster_name: str) -> str | None:
        return notices.gcp_check(notices.metadata_url(notices.GCP_METADATA_URL))

    default_image = vms.DEFAULT_IMAGE
    host_key_timeout_s = 300.0  # for the guest environment (or cloud-init) to publish the host keys

    def __init__(self, location: str = "", conn_id: str | None = None) -> None:
        super().__init__(conn_id)
        self._pin(location, ENDPOINT_RESOLVER_ENV)

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
        gpus = catalog.accelerator_count("gcp", vm.machine_type)
        url = vms.console_url(self.settings.project, vm.zone, vm.name)
        return self._endpoint(vm).node(rank, vm.name, vms.status_of(vm, preempted), gpus, host_key, url)

    def _endpoint(self, vm: vms.Vm) -> Endpoint:
        return self._endpoint_of(vm.name, vm.internal_ip, vm.external_ip)

    # ---- provisioning ----------------------------------------------------------------------------------

    def plan(self, request: ProvisionRequest) -> list[Placement]:
        """The placements to try, best first: the optimizer's order over the gcp catalog."""
        resources = request.resources or Resources()
        pin: dict[str, Any] = {"cloud": "gcp"}
        if self.region:
            pin.update(region=self.region, zone=self.zone or resources.zone)
        resources = resources.copy(**pin) if resources.cloud in (None, "gcp") or self.region else resources
        candidates = [
            Placement(o.region, o.zone, o.instance_type, c.use_spot, o.accelerator, o.accelerator_count)
            for c in optimizer.plan(resources, request.num_nodes, clouds=["gcp"])
            for o in [c.offering]
        ]
        if resources.network_tier == "best":
            candidates = self._honouring_best(candidates)
        return provisioner.allowed_placements("gcp", candidates, self.settings.regions, "fits")

    def _honouring_best(self, candidates: list[Placement]) -> list[Placement]:
        """The placements whose type can honour `network_tier: best` here; none: refused with the reasons."""
        networks = self.settings.gpu_networks
        refusals = {p.machine_type: vm_fields.best_refusal(p.machine_type, networks) for p in candidates}
        kept = [p for p in candidates if refusals[p.machine_type] is None]
        if candidates and not kept:
            reasons = sorted({r for r in refusals.values() if r})
            raise SpecError("network_tier: best cannot be honoured on gcp: " + "; ".join(reasons))
        return kept

    def provision(self, request: ProvisionRequest) -> list[Node]:
        nodes = provisioner.provision(self, request)
        if provisioning.container_note(request.resources):  # Docker and the image's pull, from each VM's boot
            provisioning.report_container_prep("gcp", request.cluster_name, nodes, self.settings.ssh_key_file)
        ports = (request.resources or Resources()).ports
        if ports:  # also on a cluster that was already up: the rule becomes exactly the ports asked
            network.ensure_ports(self.api, self.settings, request.cluster_name, ports)
            self._update_record(request.cluster_name, {"ports": list(ports)})
        return nodes

    def network_env(self, cluster_name: str) -> dict[str, str]:
        """The NCCL env of the GPU NICs the cluster was provisioned with (its record: type and tier)."""
        record = self._record(cluster_name) or {}
        fabric = fabric_of(str(record.get("machine_type", "")))
        if record.get("network_tier") != "best" or fabric is None:
            return {}
        return dict(fabric.nccl_env)

    def opened_ports(self, cluster_name: str) -> tuple[str, ...]:
        return tuple((self._record(cluster_name) or {}).get("ports") or ())

    # ---- the provisioner's primitives (provisioner.VmDriver) -----------------------------------------

    def recorded_placement(self, cluster: str) -> Placement | None:
        return self._placement(cluster)

    def survey(self, cluster: str, recorded: Placement | None) -> Survey[vms.Vm]:
        zone = recorded.zone if recorded else self.zone
        current = vms.current_vms(self._vms(cluster, zone)) if zone else {}
        return Survey(current, [v.name for v in current.values()])

    def restartable(self, instance: vms.Vm) -> bool:
        return instance.status == "TERMINATED" and not instance.spot  # a spot VM is deleted, never stopped

    def is_live(self, instance: vms.Vm) -> bool:
        return instance.status in vms.LIVE_STATUSES

    def start(self, cluster: str, stopped: list[vms.Vm]) -> None:
        log.info("gcp: %s: starting %d stopped VM(s)", cluster, len(stopped))
        for vm in stopped:
            op = self.api.start_instance(vm.zone, vm.name, vms.request_id(f"start-{vm.name}-{vm.created}", 0))
            self.api.wait_zone_operation(vm.zone, op, self.running_timeout_s)

    def record_size(self, cluster: str, num_nodes: int) -> None:
        self._update_record(cluster, {"num_nodes": num_nodes})

    def forget_if_empty(self, cluster: str) -> None:
        zone = self._zone_of(cluster)
        if zone is None or not self._vms(cluster, zone):
            self._forget(cluster)

    def wait_ready(self, cluster: str, instance_ids: list[str]) -> None:
        placement = self._placement(cluster)
        assert placement is not None  # the VMs waited for were launched there
        self._wait_ready(cluster, placement, instance_ids)

    def launch(self, order: LaunchOrder, placement: Placement) -> list[str]:
        """Bring up the order's ranks in `placement`; returns the VM names. Deletes what it made on failure."""
        cluster, ranks, request, known = order.cluster, order.ranks, order.request, order.known
        s = self.settings
        resources = request.resources or Resources()
        autostop = resources.autostop if isinstance(resources.autostop, dict) else None
        forms = "an image (projects/P/global/images/NAME or .../images/family/F)"
        image = image_for(resources, placement.region, "gcp", forms) or self.default_image
        if note := provisioning.container_note(resources):
            log.info("gcp: %s: %s", cluster, note)
        disk = disk_size_gb(resources)
        best = resources.network_tier == "best"
        labels = vm_fields.vm_labels(
            vms.own_labels(cluster, 0, ""), resources.labels
        )  # refused before any call
        self._update_record(
            cluster,
            dataclasses.asdict(placement)
            | {"num_nodes": max(request.num_nodes, max(ranks) + 1), "image": image, "disk_size": disk}
            | {"network_tier": resources.network_tier, "disk_tier": resources.disk_tier}
            | {"labels": resources.labels, "policy_region": placement.region if best else None}
            | {"container": resources.image_id if note else None},  # a replacement pulls it at boot too
        )
        network.ensure_firewalls(self.api, s, cluster)
        disk_spec = vms.DiskSpec(
            vm_fields.disk_type(placement.machine_type, resources.disk_tier),
            vm_fields.disk_iops(placement.machine_type, resources.disk_tier),
        )
        day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        token = vms.launch_token(cluster, ranks, placement.label, known, day)
        public_key = public_key_of(s.ssh_key_file)
        names = [vms.vm_name(cluster, rank, token) for rank in ranks]
        log.info("gcp: %s: creating %d x %s", cluster, len(ranks), placement.label)
        operations: list[str] = []
        try:
            fast = self._fast_network(cluster, placement) if best else None
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
                    labels=labels | vms.own_labels(cluster, rank, token),
                    tags=[vms.SSH_TAG, vms.network_tag(cluster)],
                    ssh_user=s.ssh_user,
                    public_key=public_key,
                    external_ip=not s.use_private_ip,
                    self_delete=bool(autostop and autostop["down"]),
                    service_account=s.service_account,
                    fast=fast,
                    disk=disk_spec,
                    startup_script=provisioning.boot_prep(resources, s.ssh_user),
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
            self._undo_launch(cluster, placement, names, best)
            if e.code in vms.STOCKOUT_ERRORS:
                raise NoCapacity(placement, e.code, str(e)) from e
            raise ClusterError(f"gcp: creating VMs in {placement.label} failed: {e}") from e
        except BaseException:
            self._undo_launch(cluster, placement, names, best)
            raise
        return names

    def _fast_network(self, cluster: str, placement: Placement) -> vms.FastNetwork:
        """`network_tier: best`: the cluster's compact placement policy, and the type's GPU NICs."""
        policy = network.ensure_placement_policy(self.api, placement.region, cluster)
        fabric = fabric_of(placement.machine_type)
        networks = self.settings.gpu_networks
        refusal = vm_fields.best_refusal(placement.machine_type, networks)
        if fabric is None or refusal:  # plan() keeps only types that can; a recorded placement may not
            raise SpecError(f"network_tier: best cannot be honoured: {refusal}")
        return vms.FastNetwork(policy, vm_fields.gpu_interfaces(fabric, placement.region, networks))

    def _undo_launch(self, cluster: str, placement: Placement, names: list[str], best: bool) -> None:
        """Delete this launch's VMs; a placement policy no VM of the cluster uses any more goes too (the
        next placement may be in another region)."""
        self._delete(placement.zone, names)
        if best and not self._vms(cluster, placement.zone):
            self.api.delete_resource_policy(placement.region, vms.placement_policy_name(cluster))

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
            image_id=record.get("container") or record.get("image"),
            disk_size=record.get("disk_size"),
            network_tier=record.get("network_tier"),
            disk_tier=record.get("disk_tier"),
            labels=record.get("labels"),
        )
        request = ProvisionRequest(cluster_name, int(record.get("num_nodes", rank + 1)), same)
        order = LaunchOrder(request, [rank], [v.name for v in current.values()])
        return provisioner.replace(self, order, [placement])

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
        self._forget(cluster_name, {z.rsplit("-", 1)[0] for z in by_zone})

    def _forget(self, cluster_name: str, regions: Iterable[str] = ()) -> None:
        """The cluster's rules, placement policy and records (its VMs are gone). The policy's region is
        recorded; without a record, it is looked for in the regions the cluster's VMs were found in."""
        record = self._record(cluster_name)
        if record is not None:
            regions = [record["policy_region"]] if record.get("policy_region") else []
        network.remove_cluster_rules(self.api, cluster_name, sorted(regions))
        self._store(cluster_name).delete_all()

    # ---- autostop ----------------------------------------------------------------------------------

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        return f"{vms.SELF_DELETE} || {SHUTDOWN}" if down else SHUTDOWN

    def prepare_autostop(self, cluster_name: str, down: bool) -> None:
        placement = self._placement(cluster_name)
        self._refuse_stopping_spot(placement is not None and placement.use_spot, down, "VMs")
