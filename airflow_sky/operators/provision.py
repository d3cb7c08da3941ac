"""Provision: bring the cluster up (or reuse it) and register the job in the cluster's queue."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from airflow_sky.gang.job import sanitize_cluster_name
from airflow_sky.gang.phases import check_exec_nodes, register_job
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.operators.base import SkyBaseOperator


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
        retry_until_up: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.must_exist = must_exist
        self.retry_until_up = retry_until_up
        self.cluster_name = cluster_name
        self.infra = infra
        self.down = down

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.mask_secrets()
        run_id = context["run_id"]
        name = sanitize_cluster_name(self.cluster_name or default_cluster_name(self.dag_id, run_id))
        hook = SkyClusterHook(name, self.infra, self.conn_id)
        hook.check_autostop(self.sky_task)
        current = hook.nodes()
        existed = bool(current)
        if self.must_exist:
            check_exec_nodes(name, self.infra, current, self.sky_task.num_nodes, "TASK.yaml")
        self.log.info(
            "%s cluster %s on %s (%d nodes)",
            "Reusing" if existed else "Launching",
            name,
            self.infra,
            self.sky_task.num_nodes,
        )
        try:
            hook.provision(self.sky_task, retry_until_up=self.retry_until_up)
            nodes = hook.running_nodes(expected=self.sky_task.num_nodes)
            hook.arm_autostop(self.sky_task, nodes)
            handle = register_job(
                hook.cluster, self.sky_task, nodes, submit_key=f"{self.dag_id}/{run_id}/{self.task_id}"
            )
        except BaseException:
            if not existed:  # half a cluster runs no job: nothing of this run's may be left behind
                self.log.warning("Provisioning failed; removing what was created for cluster %s", name)
                hook.terminate()
            raise
        self.log.info("Job %d on cluster %s (SKYPILOT_TASK_ID=%s)", handle.job_id, name, handle.sky_task_id)
        for node in handle.nodes:
            self.log.info(
                "node rank %d: %s (%s, %s)", node.rank, node.internal_ip, node.instance_id, node.status.value
            )
        # Without the nodes: every task renders this XCom as a template field, and the job state has them.
        context["ti"].xcom_push(key="handle", value=handle.to_dict(nodes=False))
        return [n.to_dict() for n in handle.nodes]
