"""What the aws infra reads from its Airflow connection (type `aws`, default `aws_default`).

The amazon provider's own fields carry the credentials and the endpoint (login/password, role_arn,
region_name, endpoint_url, ...). airflow-sky's settings sit in the extra under `airflow_sky`:

    {"region_name": "us-east-1",
     "airflow_sky": {
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----...",   # or "ssh_key_file": "~/.ssh/sky"
        "ssh_user": "ubuntu",                 # the image's login user
        "ssh_cidr": "203.0.113.0/24",         # who may reach port 22 (default 0.0.0.0/0)
        "security_group": "sky-bastion",      # optional: a group of your own every node also joins
                                              # (each cluster has its own group without it)
        "state_table": "airflow-sky-state",   # DynamoDB table of the clusters' job records
        "state_region": "us-east-1",          # where that table lives (default: the connection's region)
        "use_private_ip": false,              # SSH to private addresses (Airflow inside the VPC)
        "regions": ["us-east-1", "us-west-2"],# the regions the optimizer may use (default: all)
        "iam_instance_profile": "sky-nodes",  # attached to every node: its role reads and writes the
                                              # task's s3:// buckets (no key is sent to the nodes)
        "port_sources": ["203.0.113.0/24"]    # who may reach a task's `resources.ports` (CIDR blocks,
                                              # IPv4 or IPv6; default 0.0.0.0/0, as SkyPilot)
     }}

`ssh_private_key` is a secret: Airflow masks extras with `private_key` in their name; it is written to a
0600 file of this process for SSH to read, never logged and never on a command line. Without a key in the
connection a key is made once under ~/.airflow_sky/keys (fine for one machine; a distributed Airflow needs
the key in the connection so that every worker has it).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.keys import sky_settings, ssh_key_of
from airflow_sky.infra.vm_cloud import VmSettings

DEFAULT_CONN_ID = "aws_default"
DEFAULT_REGION = "us-east-1"
_FIELDS = (
    "ssh_private_key",
    "ssh_key_file",
    "ssh_user",
    "ssh_cidr",
    "security_group",
    "state_table",
    "state_region",
    "use_private_ip",
    "regions",
    "iam_instance_profile",
    "port_sources",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AwsSettings(VmSettings):
    ssh_user: str = "ubuntu"
    security_group: str = "airflow-sky"
    state_table: str = "airflow-sky-state"
    state_region: str = DEFAULT_REGION
    iam_instance_profile: str | None = None  # a name or an ARN
    port_sources: tuple[str, ...] = ("0.0.0.0/0",)  # who may reach `resources.ports`


def settings_from_extra(conn_id: str, extra: dict[str, Any], conn_region: str | None) -> AwsSettings:
    """The connection's `airflow_sky` settings, validated; every error names the connection and field."""
    strings = (
        "ssh_user",
        "ssh_cidr",
        "security_group",
        "state_table",
        "state_region",
        "ssh_key_file",
        "iam_instance_profile",
    )
    raw, source = sky_settings(conn_id, extra, _FIELDS, strings, ("use_private_ip",))
    regions = raw.get("regions")
    values: dict[str, Any] = {
        k: raw[k]
        for k in (
            "ssh_user",
            "ssh_cidr",
            "security_group",
            "state_table",
            "use_private_ip",
            "iam_instance_profile",
        )
        if k in raw
    }
    if "port_sources" in raw:
        values["port_sources"] = _cidrs(raw["port_sources"], f"{source}.port_sources")
    return AwsSettings(
        conn_id=conn_id,
        ssh_key_file=ssh_key_of(f"aws-{conn_id}", raw, source),
        state_region=raw.get("state_region") or conn_region or DEFAULT_REGION,
        regions=tuple(regions) if regions else None,
        **values,
    )


def _cidrs(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(f'{where}: must be a non-empty list of CIDR blocks, e.g. ["203.0.113.0/24"]')
    for cidr in value:
        try:
            ipaddress.ip_network(cidr)
        except ValueError as e:
            raise SpecError(f"{where}: {cidr!r} is not a CIDR block ({e})") from e
    return tuple(value)
