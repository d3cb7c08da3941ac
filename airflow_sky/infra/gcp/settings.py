"""What the gcp infra reads from its Airflow connection (type `google_cloud_platform`, default
`google_cloud_default`).

The google provider's own fields carry the credentials and the project (key file, key JSON, ADC,
impersonation). airflow-sky's settings sit in the extra under `airflow_sky`:

    {"project": "my-project",
     "airflow_sky": {
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----...",   # or "ssh_key_file": "~/.ssh/sky"
        "ssh_user": "gcpuser",                # the user the key is installed for (instance metadata)
        "ssh_cidr": "203.0.113.0/24",         # who may reach port 22 (default 0.0.0.0/0)
        "network": "default",                 # the VPC network the nodes join
        "state_bucket": "my-sky-state",       # GCS bucket of the job records (default <project>-airflow-sky-state)
        "state_location": "US",               # where that bucket is created when missing
        "use_private_ip": false,              # SSH to private addresses (Airflow inside the VPC)
        "regions": ["us-central1"],           # the regions the optimizer may use (default: all)
        "project": "my-project",              # overrides the connection's project
        "service_account": "nodes@my-project.iam.gserviceaccount.com",  # the nodes' own identity: they
                                              # read and write the task's gs:// buckets with it
        "ports_source_ranges": ["0.0.0.0/0"], # who may reach a task's `ports` (default: anyone, as SkyPilot)
        "gpu_networks": ["gpu-net-1", "gpu-net-2/gpu-sub-2"]  # `network_tier: best` on A3/A4: the VPC
                                              # networks of the type's GPU NICs, one each ("NETWORK": its
                                              # subnetwork of the same name in the cluster's region)
     }}

Emulators and private endpoints: `compute_endpoint` and `storage_endpoint` replace the APIs' addresses,
and `anonymous_credentials: true` (only with http:// endpoints on this machine) sends no credentials.
`ssh_private_key` is a secret: Airflow masks extras with `private_key` in their name; it becomes a 0600
file of this process for SSH to read, never logged and never on a command line.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.keys import sky_settings, ssh_key_of
from airflow_sky.infra.vm_cloud import VmSettings

DEFAULT_CONN_ID = "google_cloud_default"
_STRINGS = (
    "ssh_key_file",
    "ssh_user",
    "ssh_cidr",
    "network",
    "state_bucket",
    "state_location",
    "project",
    "compute_endpoint",
    "storage_endpoint",
    "service_account",
)
_LISTS = ("ports_source_ranges", "gpu_networks")
_FIELDS = (*_STRINGS, *_LISTS, "ssh_private_key", "use_private_ip", "regions", "anonymous_credentials")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # a GCE resource name


@dataclasses.dataclass(frozen=True, kw_only=True)
class GcpSettings(VmSettings):
    project: str
    ssh_user: str = "gcpuser"
    network: str = "default"
    state_bucket: str = ""
    state_location: str = "US"
    compute_endpoint: str | None = None
    storage_endpoint: str | None = None
    anonymous_credentials: bool = False
    service_account: str | None = None
    ports_source_ranges: tuple[str, ...] = ("0.0.0.0/0",)
    gpu_networks: tuple[tuple[str, str], ...] = ()  # (network, subnetwork) of each GPU NIC, in order


def settings_from_extra(conn_id: str, extra: dict[str, Any], conn_project: str | None) -> GcpSettings:
    """The connection's `airflow_sky` settings, validated; every error names the connection and field."""
    raw, source = sky_settings(conn_id, extra, _FIELDS, _STRINGS, ("use_private_ip", "anonymous_credentials"))
    if raw.get("anonymous_credentials"):
        for name in ("compute_endpoint", "storage_endpoint"):
            if not str(raw.get(name, "")).startswith(("http://127.", "http://localhost")):
                raise SpecError(
                    f"{source}.anonymous_credentials: only for emulators: {name} must be an http:// "
                    "address on this machine"
                )
    project = raw.get("project") or conn_project
    if not project:
        raise SpecError(f"{source}: no project: set the connection's project (or airflow_sky.project)")
    regions = raw.get("regions")
    kept = ("ssh_user", "ssh_cidr", "network", "state_location", "use_private_ip", "service_account")
    endpoints = ("compute_endpoint", "storage_endpoint", "anonymous_credentials")
    values: dict[str, Any] = {k: raw[k] for k in (*kept, *endpoints) if k in raw}
    lists = {name: _string_list(raw, name, source) for name in _LISTS if name in raw}
    for cidr in lists.get("ports_source_ranges", ()):
        try:
            ipaddress.ip_network(cidr)
        except ValueError as e:
            raise SpecError(f"{source}.ports_source_ranges: {cidr!r} is not a CIDR block ({e})") from e
    if "ports_source_ranges" in lists:
        values["ports_source_ranges"] = lists["ports_source_ranges"]
    if "gpu_networks" in lists:
        values["gpu_networks"] = tuple(_network_pair(n, source) for n in lists["gpu_networks"])
    return GcpSettings(
        conn_id=conn_id,
        project=project,
        ssh_key_file=ssh_key_of(f"gcp-{conn_id}", raw, source),
        state_bucket=raw.get("state_bucket") or f"{project}-airflow-sky-state",
        regions=tuple(regions) if regions else None,
        **values,
    )


def _string_list(raw: dict[str, Any], name: str, source: str) -> tuple[str, ...]:
    value = raw[name]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise SpecError(f"{source}.{name}: must be a non-empty list of strings")
    return tuple(value)


def _network_pair(entry: str, source: str) -> tuple[str, str]:
    """ "NETWORK" (its subnetwork of the same name) or "NETWORK/SUBNETWORK", each a GCE resource name."""
    network, _, subnetwork = entry.partition("/")
    subnetwork = subnetwork or network
    for name in (network, subnetwork):
        if not _NAME.match(name):
            raise SpecError(
                f"{source}.gpu_networks: {entry!r}: {name!r} is not a GCE resource name (lower-case letters, "
                "digits and '-', starting with a letter, at most 63); write NETWORK or NETWORK/SUBNETWORK"
            )
    return network, subnetwork
