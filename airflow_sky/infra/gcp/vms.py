"""GCE VMs as cluster members: labels as the only state, what a VM needs, what its state means (pure).

Every VM of a cluster carries the labels

    airflow-sky-cluster   the cluster name (what `nodes` and `terminate` filter on)
    airflow-sky-rank      its rank (0 = head)
    airflow-sky-launch    the launch token (also in its name and its insert's request id)

and the network tags `airflow-sky` (SSH from the configured range) and `sky-<cluster>` (all traffic between
the cluster's VMs). Its name is `<cluster>-<rank>-<token>`: a retried insert meets the VM it made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from typing import Any

from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.host_keys import preferred_key

LABEL_CLUSTER = "airflow-sky-cluster"
LABEL_RANK = "airflow-sky-rank"
LABEL_LAUNCH = "airflow-sky-launch"
SSH_TAG = "airflow-sky"

LIVE_STATUSES = ("PROVISIONING", "STAGING", "RUNNING")
# Operation error codes that mean "no room here": try the next placement in the optimizer's order.
STOCKOUT_ERRORS = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "QUOTA_EXCEEDED",
        "RESOURCE_NOT_FOUND",  # the machine or accelerator type is not offered in this zone
    }
)
# Machine families whose type carries its GPUs; n1 takes them as guestAccelerators.
_GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")
_ACCELERATOR_TYPES = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
}
# The deep-learning images Google publishes (Ubuntu, NVIDIA driver, CUDA): an image family is global, so
# every region gets the family's newest image.
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"


def own_labels(cluster: str, rank: int, token: str) -> dict[str, str]:
    """The labels airflow-sky keeps on a cluster's VMs (a task's `labels` never replace them)."""
    return {LABEL_CLUSTER: cluster, LABEL_RANK: str(rank), LABEL_LAUNCH: token}


def network_tag(cluster: str) -> str:
    return f"sky-{cluster}"[:63].rstrip("-")


def internal_firewall(cluster: str) -> str:
    return f"sky-{cluster}-internal"[:63].rstrip("-")


def vm_name(cluster: str, rank: int, token: str) -> str:
    return f"{cluster[:40]}-{rank}-{token[:8]}"


def request_id(token: str, rank: int) -> str:
    """The insert's request id: a UUID derived from the launch, so GCE drops a retried insert."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"airflow-sky/{token}/{rank}"))


def launch_token(cluster: str, ranks: list[int], placement: str, known: list[str], salt: str) -> str:
    text = "|".join([cluster, ",".join(map(str, ranks)), placement, ",".join(sorted(known)), salt])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class FastNetwork:
    """`network_tier: best` on a VM: its compact placement policy (a relative URL) and its GPU NICs."""

    resource_policy: str
    gpu_interfaces: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class DiskSpec:
    """The boot disk's type (from `disk_tier`) and provisioned IOPS, where the type takes them."""

    type: str = "pd-balanced"
    iops: int | None = None


def placement_policy_name(cluster: str) -> str:
    return f"sky-{cluster}-compact"[:63].rstrip("-")


def ports_firewall(cluster: str) -> str:
    return f"sky-{cluster}-ports"[:63].rstrip("-")


@dataclasses.dataclass(frozen=True)
class Vm:
    name: str
    zone: str
    rank: int | None
    status: str
    spot: bool
    created: str
    machine_type: str
    internal_ip: str | None
    external_ip: str | None
    launch: str | None

    @property
    def instance_id(self) -> str:
        """The VM's name: what a Node's instance_id is on gcp."""
        return self.name


def vm_of(instance: dict[str, Any]) -> Vm:
    labels = instance.get("labels") or {}
    nic = (instance.get("networkInterfaces") or [{}])[0]
    access = (nic.get("accessConfigs") or [{}])[0]
    rank = labels.get(LABEL_RANK, "")
    return Vm(
        name=instance["name"],
        zone=str(instance.get("zone", "")).rsplit("/", 1)[-1],
        rank=int(rank) if rank.isdigit() else None,
        status=str(instance.get("status", "")),
        spot=(instance.get("scheduling") or {}).get("provisioningModel") == "SPOT",
        created=str(instance.get("creationTimestamp", "")),
        machine_type=str(instance.get("machineType", "")).rsplit("/", 1)[-1],
        internal_ip=nic.get("networkIP"),
        external_ip=access.get("natIP"),
        launch=labels.get(LABEL_LAUNCH),
    )


def status_of(vm: Vm, preempted: bool) -> NodeStatus:
    if vm.status == "RUNNING":
        return NodeStatus.RUNNING
    if vm.status in ("PROVISIONING", "STAGING"):
        return NodeStatus.UNREACHABLE  # not usable yet; provisioning waits it out
    if preempted:
        return NodeStatus.PREEMPTED
    # GCE calls a stopped VM TERMINATED; it still exists (deleted VMs are gone), its disk kept.
    if vm.status in ("STOPPING", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED") and not vm.spot:
        return NodeStatus.STOPPED
    return NodeStatus.TERMINATED


def current_vms(vms: list[Vm]) -> dict[int, Vm]:
    """The VM holding each rank: the newest live one, else the newest."""
    best: dict[int, Vm] = {}
    for vm in vms:
        if vm.rank is None:
            continue
        held = best.get(vm.rank)
        if held is None or (vm.status in LIVE_STATUSES, vm.created) > (
            held.status in LIVE_STATUSES,
            held.created,
        ):
            best[vm.rank] = vm
    return dict(sorted(best.items()))


def host_key_from_guest_attributes(items: list[dict[str, Any]]) -> str | None:
    """The guest environment publishes the VM's host keys under `hostkeys/`: key = type, value = base64."""
    return preferred_key(
        (str(i.get("key")), str(i.get("value")))
        for i in items
        if i.get("namespace", "hostkeys") == "hostkeys"
    )


def instance_body(
    *,
    name: str,
    zone: str,
    machine_type: str,
    accelerator: str | None,
    accelerator_count: int,
    spot: bool,
    image: str,
    disk_gb: int,
    network: str,
    labels: dict[str, str],
    tags: list[str],
    ssh_user: str,
    public_key: str,
    external_ip: bool,
    self_delete: bool,
    service_account: str | None = None,
    fast: FastNetwork | None = None,
    disk: DiskSpec | None = None,
    startup_script: str | None = None,
) -> dict[str, Any]:
    """The instances.insert body of one node. `startup_script`: a container task's boot prep (root, every
    boot: node/container_login.py); it holds no secret (the metadata server shows it to the node's jobs)."""
    gpus = accelerator is not None
    disk = disk or DiskSpec()
    interface: dict[str, Any] = {"network": f"global/networks/{network}"}
    if external_ip:
        interface["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    if fast is not None:
        interface["nicType"] = "GVNIC"
    scheduling: dict[str, Any] = {
        # GPU VMs cannot live-migrate, nor can VMs in a compact placement policy; spot VMs are deleted when
        # preempted (recovery makes a new one).
        "onHostMaintenance": "TERMINATE" if gpus or spot or fast is not None else "MIGRATE",
        "automaticRestart": not spot,
        "provisioningModel": "SPOT" if spot else "STANDARD",
    }
    if spot:
        scheduling["instanceTerminationAction"] = "DELETE"
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "labels": labels,
        "tags": {"items": tags},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": image,
                    "diskSizeGb": str(disk_gb),
                    "diskType": f"zones/{zone}/diskTypes/{disk.type}",
                    "labels": labels,
                    **({"provisionedIops": str(disk.iops)} if disk.iops else {}),
                },
            }
        ],
        "networkInterfaces": [interface, *(fast.gpu_interfaces if fast else [])],
        "metadata": {
            "items": [
                {"key": "ssh-keys", "value": f"{ssh_user}:{public_key} {ssh_user}"},
                {"key": "enable-guest-attributes", "value": "TRUE"},
                {"key": "install-nvidia-driver", "value": "True"},
                *([{"key": "startup-script", "value": startup_script}] if startup_script else []),
            ]
        },
        "scheduling": scheduling,
    }
    scopes = []
    if self_delete:
        # Autodown: the node deletes itself through the API with its own service account (compute scope).
        scopes.append("https://www.googleapis.com/auth/compute")
    if service_account:
        # The task's gs:// buckets, read and written by the node as this account (no key is sent to it).
        scopes.append("https://www.googleapis.com/auth/devstorage.read_write")
    if fast is not None:
        body["resourcePolicies"] = [fast.resource_policy]
    if scopes:
        body["serviceAccounts"] = [{"email": service_account or "default", "scopes": scopes}]
    if gpus and not machine_type.startswith(_GPU_FAMILIES):
        kind = _ACCELERATOR_TYPES.get(str(accelerator), f"nvidia-{str(accelerator).lower()}")
        body["guestAccelerators"] = [
            {
                "acceleratorType": f"zones/{zone}/acceleratorTypes/{kind}",
                "acceleratorCount": accelerator_count,
            }
        ]
    return body


# Autostop's action on a VM: `down` deletes the VM through the API with a token of its own service account
# (from the metadata server); `stop` (or a failed delete) shuts it down, which stops a GCE VM.
_METADATA = "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1"
SELF_DELETE = (
    f"t=$({_METADATA}/instance/service-accounts/default/token | python3 -c "
    "'import json,sys; print(json.load(sys.stdin)[\"access_token\"])') && "
    f"z=$({_METADATA}/instance/zone) && n=$({_METADATA}/instance/name) && p=$({_METADATA}/project/project-id) && "
    'curl -sf -X DELETE -H "Authorization: Bearer $t" '
    '"https://compute.googleapis.com/compute/v1/projects/$p/zones/${z##*/}/instances/$n"'
)


def console_url(project: str, zone: str, name: str) -> str:
    """The VM's page in the Google Cloud console (the node's extra link in the Airflow UI)."""
    return f"https://console.cloud.google.com/compute/instancesDetail/zones/{zone}/instances/{name}?project={project}"
