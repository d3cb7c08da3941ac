"""SSH keys of cloud connections: a key handed in as text (a connection's secret) becomes a 0600 file that
SSH can read; without one, a key is made once on this machine; the public half is what a cloud installs."""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.home import sky_home


def write_key_file(label: str, private_key: str) -> str:
    """`private_key` as a 0600 file of this user (content-addressed: a rotated key gets a new file)."""
    directory = sky_home() / "ssh" / "pool-keys"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    digest = hashlib.sha256(private_key.encode()).hexdigest()[:16]
    safe_label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    path = directory / f"{safe_label}-{digest}"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(private_key if private_key.endswith("\n") else private_key + "\n")
        os.replace(tmp, path)
    return str(path)


def key_file_from(value: str, source: str) -> str:
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        raise SpecError(f"{source}.ssh_key_file: {path} does not exist")
    return str(path)


def generated_key(label: str) -> Path:
    """A key made for this connection on this machine, once (ed25519, 0600): ~/.airflow_sky/keys/<label>."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    safe_label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    path = sky_home() / "keys" / safe_label
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


def ssh_key_of(label: str, raw: dict[str, Any], source: str) -> str:
    """The key file a cloud connection's settings name: `ssh_private_key` (text, written 0600),
    `ssh_key_file`, or else a key made for the connection on this machine."""
    if raw.get("ssh_private_key"):
        key = raw["ssh_private_key"]
        if not isinstance(key, str) or "PRIVATE KEY" not in key:
            raise SpecError(f"{source}.ssh_private_key: must be an OpenSSH/PEM private key text")
        return write_key_file(label, key)
    if raw.get("ssh_key_file"):
        return key_file_from(raw["ssh_key_file"], source)
    return str(generated_key(label))


def sky_settings(
    conn_id: str,
    extra: dict[str, Any],
    fields: tuple[str, ...],
    strings: tuple[str, ...],
    flags: tuple[str, ...],
) -> tuple[dict[str, Any], str]:
    """A connection's `airflow_sky` extra, checked (known fields, non-empty strings, booleans, `ssh_cidr` a
    CIDR block, `regions` a list), and the source that every error names."""
    source = f"Airflow connection {conn_id!r}: extra.airflow_sky"
    raw = extra.get("airflow_sky") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: must be a JSON object of airflow-sky settings")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise SpecError(f"{source}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(fields)})")
    for name in strings:
        if name in raw and (not isinstance(raw[name], str) or not raw[name].strip()):
            raise SpecError(f"{source}.{name}: must be a non-empty string")
    if "ssh_cidr" in raw:
        try:
            ipaddress.ip_network(raw["ssh_cidr"])
        except ValueError as e:
            raise SpecError(f"{source}.ssh_cidr: not a CIDR block ({e})") from e
    for flag in flags:
        if flag in raw and not isinstance(raw[flag], bool):
            raise SpecError(f"{source}.{flag}: must be true or false")
    regions = raw.get("regions")
    if regions is not None and (
        not isinstance(regions, list) or not regions or not all(isinstance(r, str) for r in regions)
    ):
        raise SpecError(f"{source}.regions: must be a non-empty list of region names")
    return raw, source
