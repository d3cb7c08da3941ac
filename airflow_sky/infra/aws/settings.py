"""What the aws infra reads from its Airflow connection (type `aws`, default `aws_default`).

The amazon provider's own fields carry the credentials and the endpoint (login/password, role_arn,
region_name, endpoint_url, ...). airflow-sky's settings sit in the extra under `airflow_sky`:

    {"region_name": "us-east-1",
     "airflow_sky": {
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----...",   # or "ssh_key_file": "~/.ssh/sky"
        "ssh_user": "ubuntu",                 # the image's login user
        "ssh_cidr": "203.0.113.0/24",         # who may reach port 22 (default 0.0.0.0/0)
        "security_group": "airflow-sky",      # created per VPC when missing
        "state_table": "airflow-sky-state",   # DynamoDB table of the clusters' job records
        "state_region": "us-east-1",          # where that table lives (default: the connection's region)
        "use_private_ip": false,              # SSH to private addresses (Airflow inside the VPC)
        "regions": ["us-east-1", "us-west-2"] # the regions the optimizer may use (default: all)
     }}

`ssh_private_key` is a secret: Airflow masks extras with `private_key` in their name; it is written to a
0600 file of this process for SSH to read, never logged and never on a command line. Without a key in the
connection a key is made once under ~/.airflow_sky/keys (fine for one machine; a distributed Airflow needs
the key in the connection so that every worker has it).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.home import sky_home
from airflow_sky.infra.keys import write_key_file

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
)


@dataclasses.dataclass(frozen=True)
class AwsSettings:
    conn_id: str
    ssh_key_file: str
    ssh_user: str = "ubuntu"
    ssh_cidr: str = "0.0.0.0/0"
    security_group: str = "airflow-sky"
    state_table: str = "airflow-sky-state"
    state_region: str = DEFAULT_REGION
    use_private_ip: bool = False
    regions: tuple[str, ...] | None = None


def settings_from_extra(conn_id: str, extra: dict[str, Any], conn_region: str | None) -> AwsSettings:
    """The connection's `airflow_sky` settings, validated; every error names the connection and field."""
    source = f"Airflow connection {conn_id!r}: extra.airflow_sky"
    raw = extra.get("airflow_sky") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: must be a JSON object of airflow-sky settings")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise SpecError(f"{source}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(_FIELDS)})")
    for name in ("ssh_user", "ssh_cidr", "security_group", "state_table", "state_region", "ssh_key_file"):
        if name in raw and (not isinstance(raw[name], str) or not raw[name].strip()):
            raise SpecError(f"{source}.{name}: must be a non-empty string")
    if "ssh_cidr" in raw:
        try:
            ipaddress.ip_network(raw["ssh_cidr"])
        except ValueError as e:
            raise SpecError(f"{source}.ssh_cidr: not a CIDR block ({e})") from e
    if "use_private_ip" in raw and not isinstance(raw["use_private_ip"], bool):
        raise SpecError(f"{source}.use_private_ip: must be true or false")
    regions = raw.get("regions")
    if regions is not None and (
        not isinstance(regions, list) or not regions or not all(isinstance(r, str) for r in regions)
    ):
        raise SpecError(f"{source}.regions: must be a non-empty list of region names")
    values: dict[str, Any] = {
        k: raw[k]
        for k in ("ssh_user", "ssh_cidr", "security_group", "state_table", "use_private_ip")
        if k in raw
    }
    return AwsSettings(
        conn_id=conn_id,
        ssh_key_file=_key_file(conn_id, raw, source),
        state_region=raw.get("state_region") or conn_region or DEFAULT_REGION,
        regions=tuple(regions) if regions else None,
        **values,
    )


def _key_file(conn_id: str, raw: dict[str, Any], source: str) -> str:
    if raw.get("ssh_private_key"):
        key = raw["ssh_private_key"]
        if not isinstance(key, str) or "PRIVATE KEY" not in key:
            raise SpecError(f"{source}.ssh_private_key: must be an OpenSSH/PEM private key text")
        return write_key_file(f"aws-{conn_id}", key)
    if raw.get("ssh_key_file"):
        path = Path(os.path.expanduser(raw["ssh_key_file"]))
        if not path.is_file():
            raise SpecError(f"{source}.ssh_key_file: {path} does not exist")
        return str(path)
    return str(generated_key(conn_id))


def generated_key(conn_id: str) -> Path:
    """A key made for this connection on this machine, once (ed25519, 0600)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in conn_id)
    path = sky_home() / "keys" / f"aws-{safe_id}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.replace(tmp, path)
    return path


def public_key_of(key_file: str) -> str:
    """`<type> <base64>` of the private key in `key_file` (what EC2 imports as a key pair)."""
    from cryptography.hazmat.primitives import serialization

    data = Path(key_file).read_bytes()
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except ValueError:
        key = serialization.load_pem_private_key(data, password=None)  # type: ignore[assignment]
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode()
