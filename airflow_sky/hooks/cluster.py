"""SkyClusterHook: the one door from Airflow to a cluster's infra and nodes.

Operators and triggers reach clouds and nodes only through this hook: it builds the plain `Cluster` object
(infra.cluster) from the infra name and the Airflow connection, does the per-node file work (sync,
artifacts) over SSH, and hands the Cluster to the gang core for everything a job does on its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseHook

from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import artifacts
from airflow_sky.node.files import UploadResult, upload_task_files
from airflow_sky.task import Task


class SkyClusterHook(BaseHook):
    """Talks to one cluster: provisioning through its Cloud driver, commands and files through SSH.

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
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        """The plain Cluster object the gang core works with (built once, lazily)."""
        if self._cluster is None:
            self._cluster = open_cluster(self.cluster_name, self.infra, self.conn_id)
        return self._cluster

    def get_conn(self) -> Cluster:
        return self.cluster

    # ---- cluster ---------------------------------------------------------------------------------------

    def provision(self, task: Task, retry_until_up: bool = False) -> list[Node]:
        """Bring the cluster to at least the task's node count; an existing larger cluster is kept as is.

        retry_until_up: when no placement has capacity, keep trying (with backoff) instead of failing.
        """
        return self.cluster.provision(
            task.num_nodes, task.resources, job_name=task.name, retry_until_up=retry_until_up
        )

    def check_autostop(self, task: Task) -> None:
        """Refuse resources.autostop on an infra whose nodes cannot stop themselves (before provisioning)."""
        self.cluster.autostop_for(task.resources)

    def arm_autostop(self, task: Task, nodes: list[Node]) -> None:
        """Arm every node's autostop watcher (resources.autostop); nothing without it."""
        autostop = self.cluster.arm_autostop(nodes, task.resources)
        if autostop is not None:
            self.log.info(
                "Autostop armed on %d node(s): each stops itself after %d idle minute(s)",
                len(nodes),
                autostop.idle_s // 60,
            )

    def nodes(self) -> list[Node]:
        return self.cluster.nodes()

    def running_nodes(self, expected: int | None = None) -> list[Node]:
        return self.cluster.running_nodes(expected)

    def terminate(self) -> None:
        self.cluster.terminate()

    # ---- files -----------------------------------------------------------------------------------------

    def sync_task_files(
        self,
        node: Node,
        task: Task,
        log: Callable[[str], None],
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        git_commit: str | None = None,
    ) -> UploadResult:
        """The workdir and file_mounts (local paths and buckets) onto `node`."""
        with self.cluster.client(node) as client:
            return upload_task_files(client, task, log, aws_conn_id, gcp_conn_id, git_commit=git_commit)

    def upload_artifacts(
        self,
        nodes: Sequence[Node],
        paths: Sequence[str],
        destination: str,
        per_rank: bool,
        log: Callable[[str], None],
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
    ) -> dict[str, Any]:
        """Stream `paths` from each of `nodes` to `destination`; returns {artifact: uri}."""
        with self.cluster.clients(nodes) as clients:
            return artifacts.upload_artifacts(
                clients, nodes, paths, destination, per_rank, log, aws_conn_id, gcp_conn_id
            )
