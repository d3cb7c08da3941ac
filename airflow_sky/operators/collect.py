"""Collect: gather what the run left (each rank's return.json) and mark the job SUCCEEDED."""

from __future__ import annotations

from typing import Any

from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote import queue


class SkyCollectOperator(SkyBaseOperator):
    """Returns the head's return.json value (the job's result for downstream tasks).

    Every rank's value is pushed under the XCom key `ranks` (a list in rank order).
    """

    ui_color = "#dcedc8"

    def __init__(self, *, run_follow_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_follow_task_id = run_follow_task_id

    def execute(self, context: Any) -> Any:
        handle = self.latest_handle(context)
        ti = context["ti"]
        values = ti.xcom_pull(task_ids=self.run_follow_task_id, map_indexes=list(range(handle.num_run_nodes)))
        ranks = list(values) if isinstance(values, list | tuple) else [values]
        ti.xcom_push(key="ranks", value=ranks)
        with self.hook(handle).client(handle.nodes[0]) as head:
            queue.update_record(
                head, handle.job_id, status=queue.JobStatus.SUCCEEDED, exit_codes=[0] * handle.num_run_nodes
            )
        self.log.info(
            "Job %d on %s succeeded on %d nodes", handle.job_id, handle.cluster_name, handle.num_run_nodes
        )
        return ranks[0] if ranks else None
