"""Collect: gather what the run left (each rank's return.json, artifacts) and mark the job SUCCEEDED."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_sky.errors import JobFailed
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.job_progress import final_metrics
from airflow_sky.operators.base import PROGRESS_XCOM_KEY, RESULT_XCOM_KEY, SkyBaseOperator


class SkyCollectOperator(SkyBaseOperator):
    """Returns the head's return.json value (the job's result for downstream tasks).

    Every rank's value is pushed under the XCom key `ranks` (a list in rank order). With `artifacts`, the
    listed files are streamed from the head (`artifacts_from="all"`: from every rank, into `rank-<r>/`) to
    `artifacts_to` (a local directory, s3:// or gs://), and {remote path: uri} is pushed under `artifacts`.
    The job's final progress (gang.job_progress.final_metrics: step, total, metrics, each rank's last step
    and metrics, recoveries) is pushed under `progress` (None when the job reported none).

    With `outlets` (Airflow assets: a checkpoint prefix, an artifact), each gets an asset event when the job
    succeeded, whose extra says which job it came from: `output_extra` (a sweep's trial and its params), the
    cluster, job id, last step, the head's result and the uploaded artifacts; `output_partition` (a sweep's
    `trial-<i>`) is the event's partition key, so a DAG scheduled on the asset by partition runs once per
    trial however close together the trials end.
    """

    template_fields: Sequence[str] = ("cluster", "sky_task", "artifacts", "artifacts_to")
    ui_color = "#dcedc8"

    def __init__(
        self,
        *,
        run_follow_task_id: str,
        artifacts: Sequence[str] | None = None,
        artifacts_to: str | None = None,
        artifacts_from: str = "head",
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        output_extra: dict[str, Any] | None = None,
        output_partition: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_extra = dict(output_extra or {})
        self.output_partition = output_partition
        self.run_follow_task_id = run_follow_task_id
        self.artifacts = list(artifacts or [])
        self.artifacts_to = artifacts_to
        self.artifacts_from = artifacts_from
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Any) -> Any:
        handle = self.latest_handle(context)
        ti = context["ti"]
        pushed = ti.xcom_pull(task_ids=[self.run_follow_task_id], key=RESULT_XCOM_KEY) or []
        by_rank = {int(entry["rank"]): entry.get("value") for entry in pushed if isinstance(entry, dict)}
        ranks = [by_rank.get(node.rank) for node in handle.run_nodes]
        ti.xcom_push(key="ranks", value=ranks)
        # Pushed even when None (no report came): a downstream pull of job_progress() then finds None.
        progress = self.job.progress(with_history=False)
        reported = progress is not None and progress["reported_ranks"] > 0
        final = final_metrics(progress) if progress and reported else None
        ti.xcom_push(key=PROGRESS_XCOM_KEY, value=final)
        uploaded: dict[str, str] | None = None
        hook = self.hook(handle)
        if self.artifacts:
            if not self.artifacts_to:
                raise JobFailed("artifacts were listed but artifacts_to is not set")
            every_rank = self.artifacts_from == "all"
            uploaded = hook.upload_artifacts(
                handle.run_nodes if every_rank else handle.run_nodes[:1],
                self.artifacts,
                self.artifacts_to,
                every_rank,
                self.log.info,
                aws_conn_id=self.aws_conn_id,
                gcp_conn_id=self.gcp_conn_id,
            )
            ti.xcom_push(key="artifacts", value=uploaded)
        self.job.set_status(JobStatus.SUCCEEDED)  # the run's verdict wrote it already, as a rule
        if self.outlets:
            extra = {
                **self.output_extra,
                "cluster": handle.cluster_name,
                "job_id": handle.job_id,
                "step": (final or {}).get("step"),
                "result": ranks[0] if ranks else None,
                "artifacts": uploaded,
            }
            for outlet in self.outlets:
                event = context["outlet_events"][outlet]
                event.extra = extra
                if self.output_partition:
                    event.add_partitions(self.output_partition)
            self.log.info(
                "Asset event(s) for %s: %s", ", ".join(str(getattr(o, "uri", o)) for o in self.outlets), extra
            )
        self.log.info(
            "Job %d on %s succeeded on %d nodes", handle.job_id, handle.cluster_name, handle.num_run_nodes
        )
        return ranks[0] if ranks else None
