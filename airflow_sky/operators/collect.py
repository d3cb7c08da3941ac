"""Collect: gather what the run left (each rank's return.json, artifacts) and mark the job SUCCEEDED."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_sky import artifacts as artifact_io
from airflow_sky.errors import JobFailed
from airflow_sky.job import JobHandle
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote import queue
from airflow_sky.remote.client import NodeClient


class SkyCollectOperator(SkyBaseOperator):
    """Returns the head's return.json value (the job's result for downstream tasks).

    Every rank's value is pushed under the XCom key `ranks` (a list in rank order). With `artifacts`, the
    listed files are streamed from the head (`artifacts_from="all"`: from every rank, into `rank-<r>/`) to
    `artifacts_to` (a local directory, s3:// or gs://), and {remote path: uri} is pushed under `artifacts`.
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_follow_task_id = run_follow_task_id
        self.artifacts = list(artifacts or [])
        self.artifacts_to = artifacts_to
        self.artifacts_from = artifacts_from
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Any) -> Any:
        handle = self.latest_handle(context)
        ti = context["ti"]
        values = ti.xcom_pull(task_ids=self.run_follow_task_id, map_indexes=list(range(handle.num_run_nodes)))
        ranks = list(values) if isinstance(values, list | tuple) else [values]
        ti.xcom_push(key="ranks", value=ranks)
        hook = self.hook(handle)
        with hook.clients(list(handle.run_nodes)) as clients:
            if self.artifacts:
                ti.xcom_push(key="artifacts", value=self._upload_artifacts(handle, clients))
            queue.update_record(
                clients[handle.run_nodes[0].rank],
                handle.job_id,
                status=queue.JobStatus.SUCCEEDED,
                exit_codes=[0] * handle.num_run_nodes,
            )
        self.log.info(
            "Job %d on %s succeeded on %d nodes", handle.job_id, handle.cluster_name, handle.num_run_nodes
        )
        return ranks[0] if ranks else None

    def _upload_artifacts(self, handle: JobHandle, clients: dict[int, NodeClient]) -> dict[str, str]:
        if not self.artifacts_to:
            raise JobFailed("artifacts were listed but artifacts_to is not set")
        artifact_io.validate_destination(self.artifacts_to)
        every_rank = self.artifacts_from == "all"
        sources = handle.run_nodes if every_rank else handle.run_nodes[:1]
        uploaded: dict[str, str] = {}
        for node in sources:
            client = clients[node.rank]
            for path in self.artifacts:
                uri = artifact_io.destination_uri(self.artifacts_to, path, node.rank if every_rank else None)
                try:
                    with client.open_remote(artifact_io.remote_path(path)) as stream:
                        stream.prefetch()  # pipelined reads: SFTP round trips overlap
                        artifact_io.upload_stream(stream, uri, self.aws_conn_id, self.gcp_conn_id)  # type: ignore[arg-type]
                except FileNotFoundError as e:
                    raise JobFailed(
                        f"artifact {path} is missing on rank {node.rank} ({node.internal_ip})"
                    ) from e
                self.log.info("artifact %s (rank %d) -> %s", path, node.rank, uri)
                uploaded[f"rank{node.rank}:{path}" if every_rank else path] = uri
        return uploaded
