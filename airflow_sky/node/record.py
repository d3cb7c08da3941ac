"""A node as the infra reports it: the address, user and pinned host key that SSH needs, and its status.

The record is plain data that every layer above passes around; what a node *is* (an EC2 instance, a host of
a pool, a local process) stays inside its infra driver.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class NodeStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    UNREACHABLE = "UNREACHABLE"
    STOPPED = "STOPPED"  # stopped by autostop: its disk is kept, and provisioning the cluster starts it again
    # A preemption notice came: still up (and reachable) until its deadline; to be replaced, as if lost.
    PREEMPTING = "PREEMPTING"


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a cluster as the infra reports it. Rank 0 is the head."""

    rank: int
    internal_ip: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    instance_id: str
    status: NodeStatus = NodeStatus.RUNNING
    gpus: float = 0
    host_key: str | None = None  # "<type> <base64>", pinned at provision time
    console_url: str | None = None  # the machine's page in its cloud's console (an extra link in the UI)
    preempt_at: float | None = None  # PREEMPTING: when the cloud takes it (epoch seconds, the infra's word)

    @property
    def known_hosts_line(self) -> str | None:
        """The node's pinned host key as an OpenSSH known_hosts line (`[host]:port` off port 22), or None."""
        if not self.host_key:
            return None
        host = self.ssh_host if self.ssh_port == 22 else f"[{self.ssh_host}]:{self.ssh_port}"
        return f"{host} {self.host_key}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["status"] = NodeStatus(values.get("status", NodeStatus.RUNNING.value))
        return cls(**values)
