"""An EC2 instance's SSH host key, known before anyone connects to it, so that every connection pins it.

Known from the launch: the worker makes an ed25519 host key for each launch and hands it to the instances
in their user data (cloud-init's `ssh_keys`, which replace the image's keys at first boot); the launch tags
the public half on the instances itself (`airflow-sky-host-key`, source `user-data`), so the very first
connection checks it, and a machine presenting any other key is refused.

An instance without that tag (launched by an earlier version) gets its key from the serial console, where
cloud-init prints the keys at first boot (the EC2 API is the authenticated channel), or, where it printed
only their fingerprints, from a first contact whose key must have one of them. Nothing is trusted on first
use: an instance whose console shows neither is refused.

Trust line: the user data (the private half) can be read from the instance's metadata by any process on
that node. A job there learns the host key of the machine it already runs on, which gains it nothing; the
key is made for one launch (its instances share it) and is never used again.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import time
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.host_keys import host_key_from_console
from airflow_sky.node.container_login import PREP_RUNNING

_FINGERPRINTS_BLOCK = re.compile(
    r"-----BEGIN SSH HOST KEY FINGERPRINTS-----(.*?)-----END SSH HOST KEY FINGERPRINTS-----", re.S
)
_SHA256 = re.compile(r"\bSHA256:([A-Za-z0-9+/]{43})\b")
PREP_SCRIPT = "/var/lib/cloud/airflow-sky-container-prep.sh"  # a container task's boot prep (root's)


@dataclasses.dataclass(frozen=True)
class HostKeySeed:
    """A host key made for one launch: the private half goes only into its user data."""

    private: str = dataclasses.field(repr=False)  # OpenSSH format; a secret, never logged
    public: str  # `ssh-ed25519 <base64>`, what the launch tags and every connection pins


def new_host_key() -> HostKeySeed:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return HostKeySeed(private, public.decode())


def user_data(seed: HostKeySeed, container_prep: str | None = None) -> str:
    """The cloud-config that makes `seed` the instance's only SSH host key (JSON is YAML: pure).

    `ssh_deletekeys` drops the image's keys and `ssh_genkeytypes: []` makes none besides, so the machine
    has no other key to present. `container_prep` (a container task: node/container_login.py's boot prep,
    which holds no secret) is written as a root script and started in the background once per instance;
    its running mark is made early (bootcmd, before SSH answers) so the job's sync waits for it."""
    config: dict[str, object] = {
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": seed.private, "ed25519_public": seed.public},
    }
    if container_prep is not None:
        config |= {
            "bootcmd": [["cloud-init-per", "instance", "airflow-sky-container-mark", "touch", PREP_RUNNING]],
            "write_files": [{"path": PREP_SCRIPT, "permissions": "0755", "content": container_prep}],
            "runcmd": [["sh", "-c", f"nohup /bin/bash {PREP_SCRIPT} >/dev/null 2>&1 &"]],
        }
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


def fingerprint(key: str) -> str:
    """`SHA256:<base64>` of `<type> <base64>`, as ssh-keygen -l (and cloud-init on the console) prints it."""
    blob = base64.b64decode(key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def console_fingerprints(console: str) -> set[str]:
    """The SHA256 fingerprints cloud-init printed between its fingerprint markers (none: an empty set)."""
    match = _FINGERPRINTS_BLOCK.search(console or "")
    return {f"SHA256:{m}" for m in _SHA256.findall(match.group(1))} if match else set()


def console_host_keys(
    ec2: Any, instance_id: str, timeout_s: float, poll_s: float
) -> tuple[str | None, set[str]]:
    """(the key, the fingerprints) cloud-init printed on the serial console, once it printed either;
    (None, empty) when it printed neither within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            output = ec2.get_console_output(InstanceId=instance_id, Latest=True).get("Output") or ""
        except ClientError:
            output = ""
        key, fingerprints = host_key_from_console(output), console_fingerprints(output)
        if key or fingerprints:
            return key, fingerprints
        left = deadline - time.monotonic()
        if left <= 0:
            return None, set()
        time.sleep(min(max(poll_s, 10.0), left))


def first_contact_key(
    instance_id: str, host: str, port: int, fingerprints: set[str], timeout_s: float, poll_s: float
) -> str:
    """The key a first SSH contact presents, kept only if its fingerprint is one the console printed."""
    import paramiko

    if not fingerprints:
        raise ClusterError(
            f"aws: {instance_id}: its host key is known neither from its launch nor from its console; "
            "a first contact is not trusted, so the node is not used (use an image that runs cloud-init)"
        )
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with paramiko.Transport((host, port)) as transport:
                transport.start_client(timeout=10)
                presented = transport.get_remote_server_key()
        except (OSError, paramiko.SSHException) as e:
            last = e
            time.sleep(poll_s)
            continue
        key = f"{presented.get_name()} {presented.get_base64()}"
        if fingerprint(key) not in fingerprints:
            raise ClusterError(
                f"aws: the machine at {host} presents host key {fingerprint(key)}, not one of those "
                f"{instance_id}'s console printed; its key is not pinned and the node is not used"
            )
        return key
    raise ClusterError(f"aws: {instance_id} at {host} never answered SSH: {last}")
