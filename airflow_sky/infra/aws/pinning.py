"""An EC2 instance's SSH host key, learned once at provision time so that every later connection pins it.

First from the serial console, where cloud-init prints the keys at first boot (the EC2 API is the
authenticated channel). When the console has not shown them within its deadline, the key is taken at
first contact over SSH, kept only if the machine answering proves to be the instance (its instance id in
the DMI asset tag or the instance metadata matches).
"""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.host_keys import host_key_from_console

# Nitro instances carry their id as the DMI asset tag; otherwise ask the instance metadata (IMDSv2).
INSTANCE_ID_COMMAND = (
    "cat /sys/devices/virtual/dmi/id/board_asset_tag 2>/dev/null | grep -E '^i-' || "
    'curl -s -m 5 -H "X-aws-ec2-metadata-token: $(curl -s -m 5 -X PUT '
    "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)\" "
    "http://169.254.169.254/latest/meta-data/instance-id"
)


def console_host_key(ec2: Any, instance_id: str, timeout_s: float, poll_s: float) -> str | None:
    """The key cloud-init printed on the serial console, or None when it has not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            output = ec2.get_console_output(InstanceId=instance_id, Latest=True).get("Output") or ""
        except ClientError:
            output = ""
        key = host_key_from_console(output)
        if key:
            return key
        time.sleep(max(poll_s, 10.0))
    return None


def first_contact_key(
    instance_id: str, host: str, port: int, user: str, key_file: str, timeout_s: float, poll_s: float
) -> str:
    """The key a first SSH contact presents, kept only if that machine proves to be `instance_id`."""
    import paramiko

    seen: list[paramiko.PKey] = []

    class _Remember(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            seen.append(key)

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_Remember())
        try:
            client.connect(
                host,
                port,
                username=user,
                key_filename=key_file,
                timeout=10,
                allow_agent=False,
                look_for_keys=False,
            )
            _, stdout, _ = client.exec_command(INSTANCE_ID_COMMAND, timeout=30)
            answered = stdout.read().decode().strip()
        except (OSError, paramiko.SSHException) as e:
            last = e
            time.sleep(poll_s)
            continue
        finally:
            client.close()
        if answered != instance_id or not seen:
            raise ClusterError(
                f"aws: the machine at {host} says it is {answered or 'nothing'}, not "
                f"{instance_id}; its host key is not pinned and the node is not used"
            )
        return f"{seen[0].get_name()} {seen[0].get_base64()}"
    raise ClusterError(f"aws: {instance_id} at {host} never answered SSH: {last}")
