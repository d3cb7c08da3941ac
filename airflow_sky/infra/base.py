"""The Cloud interface every infra implements, and the records it exchanges.

The cloud is the source of truth: membership and ranks are read back from the infra (instance tags, or the
local state dir), never from a file on an Airflow worker.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.ledger import Billing
from airflow_sky.infra.state_store import StateStore
from airflow_sky.node.record import Node, NodeStatus
from airflow_sky.task import Resources
from airflow_sky.task.envs import ClusterInfo

__all__ = ["Cloud", "ClusterInfo", "Endpoint", "Node", "NodeStatus", "ProvisionRequest", "StateStore"]


@dataclasses.dataclass(frozen=True)
class ProvisionRequest:
    """What a cloud needs to bring up nodes: the task's resources, already validated."""

    cluster_name: str
    num_nodes: int
    resources: Resources | None = None
    job_name: str | None = None  # the task that asks (a tag on cloud instances)
    retry_until_up: bool = False  # on no capacity anywhere: keep trying, with backoff, instead of failing


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where SSH reaches an instance, and the address the other nodes reach it at."""

    host: str
    port: int
    user: str
    internal_ip: str
    host_key: str | None = None  # only from an emulator's resolver: its play node's key

    @classmethod
    def resolved(cls, found: dict[str, Any]) -> Endpoint:
        """What an emulator's resolver answered (see provisioning.resolver_from_env)."""
        host_key = found.get("host_key")
        port, user, ip = int(found["port"]), str(found["user"]), str(found["internal_ip"])
        return cls(str(found["host"]), port, user, ip, host_key)

    def node(
        self,
        rank: int,
        instance_id: str,
        status: NodeStatus,
        gpus: float,
        host_key: str | None,
        console_url: str | None = None,
    ) -> Node:
        """The node that this endpoint reaches (its host key: the one pinned for it, passed in)."""
        return Node(
            rank,
            self.internal_ip,
            self.host,
            self.port,
            self.user,
            instance_id,
            status,
            gpus,
            host_key,
            console_url,
        )


class Cloud(abc.ABC):
    """One infra. Implementations are registered in airflow_sky.infra.registry."""

    name: str
    # How many clusters a reader of the whole fleet asks at once: a store over the network answers many
    # reads at once; local files are read faster by one thread (more only contend for the GIL).
    concurrent_reads = 16

    @abc.abstractmethod
    def provision(self, request: ProvisionRequest) -> list[Node]:
        """Bring the cluster to `num_nodes` running nodes (idempotent: count what exists, create the rest).

        On failure, everything this call created is removed before the error propagates.
        """

    @abc.abstractmethod
    def nodes(self, cluster_name: str) -> list[Node]:
        """The cluster's nodes ordered by rank, each with its current status. No side effects."""

    @abc.abstractmethod
    def replace(self, cluster_name: str, rank: int) -> Node:
        """Bring up a fresh node that takes over `rank` (a new address, an empty disk)."""

    @abc.abstractmethod
    def terminate(self, cluster_name: str) -> None:
        """Remove every node of the cluster; a no-op for an unknown cluster."""

    @abc.abstractmethod
    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        """Cloud, region and zone for SKYPILOT_CLUSTER_INFO."""

    @abc.abstractmethod
    def ssh_private_key(self, cluster_name: str) -> str:
        """Path of the private key that opens the cluster's nodes."""

    def key_file_for(self, cluster_name: str, node: Node) -> str:
        """Path of the private key that opens `node` (the cluster's key, unless the infra has one per node)."""
        return self.ssh_private_key(cluster_name)

    @abc.abstractmethod
    def state_store(self, cluster_name: str) -> StateStore:
        """Where the cluster's job state lives: kept by the infra, surviving the loss of any node."""

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        """The shell command with which a node of the cluster stops itself (down: ends itself for good)."""
        raise ClusterError(
            f"resources.autostop: the {self.name} infra has no way for a node to stop itself; leave "
            "autostop out (and use --down to end the cluster with the job)"
        )

    def prepare_autostop(self, cluster_name: str, down: bool) -> None:  # noqa: B027 - optional hook
        """Make the infra's side of autostop ready (e.g. what a shutdown does to an instance)."""

    # How long the cloud warns before it takes a spot node, where its API does not report the notice itself
    # (the watcher then waits this long for a node that says it got one: gang.notice_claims); 0: no wait.
    notice_window_s: float = 0.0
    reports_notices = False  # whether nodes() says PREEMPTING for a node whose notice came (local does)
    notice_interval_s: float = 2.0  # how often a node asks for its notice

    def notice_check(self, cluster_name: str) -> str | None:
        """A shell command a node runs to learn of its coming preemption: it prints the epoch second the
        node goes at once a notice is out, nothing before (None: this infra gives no notice)."""
        return None

    def node_bucket_identity(self) -> frozenset[str]:
        """The bucket stores the nodes reach with their own identity (none unless the infra attaches one)."""
        return frozenset()

    def network_env(self, cluster_name: str) -> dict[str, str]:
        """Env every rank's setup and run scripts get for the cluster's network (e.g. NCCL over EFA with
        `network_tier: best`); read from what the infra provisioned, not from the task. None by default."""
        return {}

    def opened_ports(self, cluster_name: str) -> tuple[str, ...]:
        """The ports (`8080`, `10000-10010`) opened to the cluster's nodes at provision, as recorded by the
        infra (`resources.ports`); what `status --endpoints` lists."""
        return ()

    def check_config(self) -> None:  # noqa: B027 - optional hook: most infras have nothing to check
        """Refuse a bad local configuration (a pool file, a credential) before anything connects."""

    def check_resources(self, resources: Resources | None, num_nodes: int) -> None:  # noqa: B027 - optional
        """Refuse, before a launch starts, resources this infra can never give (ClusterError naming the
        field); what depends on capacity at the time is the provision's to find out."""

    def clusters(self) -> Sequence[str]:
        """Names of the clusters this infra knows about."""
        return []

    def billing(self, cluster_name: str) -> Billing | None:
        """What one node of the cluster costs by the hour (its instance type, the catalog's price); None
        where nothing is billed by the hour (local nodes, ssh pool hosts)."""
        return None
