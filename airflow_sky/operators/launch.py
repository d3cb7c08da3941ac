"""Launch: the barrier between setup and run. Checks the job's nodes are up, marks the job RUNNING."""

from __future__ import annotations

from typing import Any

from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.phases import check_run_nodes, set_status
from airflow_sky.operators.base import SkyBaseOperator


class SkyLaunchOperator(SkyBaseOperator):
    """Returns the nodes the run uses (the first num_nodes of the cluster, head first); run tasks map over it."""

    ui_color = "#c5cae9"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        handle = self.handle()
        cluster = self.hook(handle).cluster
        check_run_nodes(cluster, handle)
        set_status(cluster, handle, JobStatus.RUNNING)
        self.log.info(
            "Launching the run on %d nodes: %s",
            handle.num_run_nodes,
            ", ".join(n.internal_ip for n in handle.run_nodes),
        )
        return [n.to_dict() for n in handle.run_nodes]
