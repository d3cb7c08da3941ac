"""Provision: bring the cluster up (or reuse it) and register the job in the cluster's queue."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_sky import envs, events
from airflow_sky.errors import ClusterError
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.job import JobHandle, sanitize_cluster_name
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote import queue


def default_cluster_name(dag_id: str, run_id: str) -> str:
    """One cluster per DAG run, so overlapping runs never share nodes: `<dag>-<hash of run id>`."""
    return sanitize_cluster_name(f"{dag_id[:28]}-{hashlib.sha1(run_id.encode()).hexdigest()[:6]}")


class SkyProvisionOperator(SkyBaseOperator):
    """Brings up `num_nodes` nodes (idempotent) and allocates the job id; returns the JobHandle as a dict.

    XComs: the return value is every node of the cluster (a list of dicts, head first: sync and setup map
    over it); the key `handle` holds the JobHandle as a dict, which every other task of the job reads.
    A failure after nodes were created for this run tears them down here, since a teardown does not run
    when its setup task failed.
    """

    template_fields: Sequence[str] = ("cluster_name", "sky_task")
    ui_color = "#c8e6c9"

    def __init__(
        self,
        *,
        cluster_name: str | None = None,
        infra: str = "local",
        down: bool = True,
        must_exist: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.must_exist = must_exist
        self.cluster_name = cluster_name
        self.infra = infra
        self.down = down

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.mask_secrets()
        run_id = context["run_id"]
        name = sanitize_cluster_name(self.cluster_name or default_cluster_name(self.dag_id, run_id))
        hook = SkyClusterHook(name, self.infra, self.conn_id)
        existed = bool(hook.nodes())
        if self.must_exist and not existed:
            raise ClusterError(
                f"cluster {name!r} does not exist on {self.infra}; launch it first: airflow-sky launch -c {name} TASK.yaml"
            )
        self.log.info(
            "%s cluster %s on %s (%d nodes)",
            "Reusing" if existed else "Launching",
            name,
            self.infra,
            self.sky_task.num_nodes,
        )
        try:
            hook.provision(self.sky_task)
            nodes = hook.running_nodes(expected=self.sky_task.num_nodes)
            handle = self._register_job(hook, nodes, submit_key=f"{self.dag_id}/{run_id}/{self.task_id}")
        except BaseException:
            if not existed and self.down:
                self.log.warning("Provisioning failed; removing what was created for cluster %s", name)
                hook.terminate()
            raise
        for node in handle.nodes:
            self.log.info(
                "node rank %d: %s (%s, %s)", node.rank, node.internal_ip, node.instance_id, node.status.value
            )
        context["ti"].xcom_push(key="handle", value=handle.to_dict())
        events.publish(events.Event("job", self.step, data=handle.to_dict()))
        return [n.to_dict() for n in handle.nodes]

    def _register_job(self, hook: SkyClusterHook, nodes: list[Any], submit_key: str) -> JobHandle:
        submitted_at = datetime.now(UTC)
        with hook.client(nodes[0]) as head:
            job_id, created = queue.allocate_job(
                head,
                submit_key,
                {
                    "name": self.sky_task.name,
                    "submitted_at": submitted_at.isoformat(),
                    "submit_key": submit_key,
                    "num_nodes": self.sky_task.num_nodes,
                    "cluster_name": hook.cluster_name,
                    "infra": self.infra,
                },
            )
            if not created:  # a retried provision: same job, same SKYPILOT_TASK_ID
                record = queue.read_record(head, job_id) or {}
                submitted_at = datetime.fromisoformat(record.get("submitted_at", submitted_at.isoformat()))
            sky_task_id = envs.make_task_id(hook.cluster_name, job_id, submitted_at)
            queue.update_record(head, job_id, sky_task_id=sky_task_id, status=queue.JobStatus.PENDING)
        if len(nodes) < self.sky_task.num_nodes:
            raise ClusterError(
                f"cluster {hook.cluster_name} has {len(nodes)} nodes; the task needs {self.sky_task.num_nodes}"
            )
        self.log.info("Job %d on cluster %s (SKYPILOT_TASK_ID=%s)", job_id, hook.cluster_name, sky_task_id)
        return JobHandle(
            cluster_name=hook.cluster_name,
            infra=self.infra,
            job_id=job_id,
            sky_task_id=sky_task_id,
            nodes=tuple(nodes),
            num_run_nodes=self.sky_task.num_nodes,
        )
