"""SkyClusterHook: a cluster's nodes (read from its infra), SSH access to them, and per-node job envs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from airflow.sdk import BaseHook

from airflow_sky import envs
from airflow_sky.clouds.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.clouds.registry import get_cloud
from airflow_sky.errors import ClusterError
from airflow_sky.job import JobHandle, Phase
from airflow_sky.remote.client import NodeClient
from airflow_sky.spec import Task

T = TypeVar("T")

# Bounded fan-out: one sshd drops about a third of 64 simultaneous connections at default MaxStartups.
MAX_PARALLEL_SSH = 16


class SkyClusterHook(BaseHook):
    """Talks to one cluster: provisioning through its Cloud driver, commands through SSH.

    :param cluster_name: the cluster (instances are found by this name on the infra).
    :param infra: `local`, `ssh/<pool>`, `aws[/region]`, `gcp[/region]`.
    :param conn_id: the Airflow connection with the infra's credentials (clouds other than local).
    """

    conn_name_attr = "conn_id"
    hook_name = "airflow-sky cluster"

    def __init__(self, cluster_name: str, infra: str = "local", conn_id: str | None = None) -> None:
        super().__init__()
        self.cluster_name = cluster_name
        self.infra = infra or "local"
        self.conn_id = conn_id
        self._cloud: Cloud | None = None

    @property
    def cloud(self) -> Cloud:
        if self._cloud is None:
            self._cloud = get_cloud(self.infra, self.conn_id)
        return self._cloud

    def get_conn(self) -> Cloud:
        return self.cloud

    # ---- cluster ---------------------------------------------------------------------------------------

    def provision(self, task: Task, min_nodes: int | None = None) -> list[Node]:
        """Bring the cluster to at least the task's node count; an existing larger cluster is kept as is."""
        wanted = max(task.num_nodes, min_nodes or 0)
        existing = self.cloud.nodes(self.cluster_name)
        running = [n for n in existing if n.status is NodeStatus.RUNNING]
        if len(existing) >= wanted and len(running) == len(existing):
            return existing
        request = ProvisionRequest(self.cluster_name, max(wanted, len(existing)), task.resources)
        return self.cloud.provision(request)

    def nodes(self) -> list[Node]:
        return self.cloud.nodes(self.cluster_name)

    def running_nodes(self, expected: int | None = None) -> list[Node]:
        """The cluster's nodes, all RUNNING; a clear error otherwise."""
        nodes = self.nodes()
        if not nodes:
            raise ClusterError(f"cluster {self.cluster_name!r} does not exist on {self.infra}")
        down = [f"rank {n.rank} is {n.status.value}" for n in nodes if n.status is not NodeStatus.RUNNING]
        if down:
            raise ClusterError(f"cluster {self.cluster_name!r} is not healthy: {', '.join(down)}")
        if expected is not None and len(nodes) < expected:
            raise ClusterError(
                f"cluster {self.cluster_name!r} has {len(nodes)} nodes; the job needs {expected}"
            )
        return nodes

    def terminate(self) -> None:
        self.cloud.terminate(self.cluster_name)

    def cluster_info(self) -> ClusterInfo:
        return self.cloud.cluster_info(self.cluster_name)

    # ---- SSH -------------------------------------------------------------------------------------------

    def client(self, node: Node, conn_retry_attempts: int = 3) -> NodeClient:
        """A connection to `node`; a poller that retries on its own passes conn_retry_attempts=1, so a
        node that is gone is noticed at once instead of after the SSH hook's waits between attempts."""
        return NodeClient(
            node, self.cloud.ssh_private_key(self.cluster_name), conn_retry_attempts=conn_retry_attempts
        )

    @contextlib.contextmanager
    def clients(self, nodes: Sequence[Node], conn_retry_attempts: int = 3) -> Iterator[dict[int, NodeClient]]:
        """One connection per node (rank -> client), closed on exit."""
        opened = {node.rank: self.client(node, conn_retry_attempts) for node in nodes}
        try:
            yield opened
        finally:
            for client in opened.values():
                client.close()

    @staticmethod
    def fan_out(items: Sequence[Any], fn: Any) -> list[Any]:
        """Run fn(item) for every item with bounded parallelism; results in input order, first error raised."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SSH, len(items))) as pool:
            return list(pool.map(fn, items))

    # ---- env -------------------------------------------------------------------------------------------

    def phase_env(self, task: Task, handle: JobHandle, phase: Phase, rank: int) -> envs.NodeEnv:
        """The env of `rank`'s setup or run script: SKYPILOT_* from the job's nodes, plus envs and secrets."""
        nodes = handle.phase_nodes(phase)
        ips = [n.internal_ip for n in nodes]
        info = self.cluster_info()
        # What the infra really gave each node (a local node has none, whatever the task asked for).
        gpus = max(math.ceil(n.gpus) for n in nodes)
        build = envs.setup_envs if phase == "setup" else envs.run_envs
        node_envs = build(task, ips, info, handle.sky_task_id, gpus)
        return node_envs[[n.rank for n in nodes].index(rank)]
