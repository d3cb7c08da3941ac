"""Launch: the barrier between setup and run. Checks the job's nodes are up, marks the job RUNNING."""

from __future__ import annotations

from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote import queue


class SkyLaunchOperator(SkyBaseOperator):
    """Returns the nodes the run uses (the first num_nodes of the cluster, head first); run tasks map over it."""

    ui_color = "#c5cae9"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        handle = self.handle()
        hook = self.hook(handle)
        current = {n.rank: n for n in hook.nodes()}
        missing = [
            n.rank
            for n in handle.run_nodes
            if n.rank not in current or current[n.rank].instance_id != n.instance_id
        ]
        if missing:
            raise ClusterError(
                f"cluster {handle.cluster_name}: nodes of rank {missing} changed or vanished since provisioning"
            )
        with hook.client(handle.nodes[0]) as head:
            queue.update_record(head, handle.job_id, status=queue.JobStatus.RUNNING)
        self.log.info(
            "Launching the run on %d nodes: %s",
            handle.num_run_nodes,
            ", ".join(n.internal_ip for n in handle.run_nodes),
        )
        return [n.to_dict() for n in handle.run_nodes]
