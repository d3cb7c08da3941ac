"""Sync: the workdir (to ~/sky_workdir) and local file_mounts, onto one node (mapped over nodes)."""

from __future__ import annotations

from typing import Any

from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.operators.links import SkyNodeConsoleLink


class SkySyncOperator(SkyBaseOperator):
    """Uploads the workdir and file_mounts to `node` (rsync over SSH, SFTP where rsync is missing; buckets
    through S3Hook/GCSHook with `aws_conn_id`/`gcp_conn_id`).

    Returns {"rank", "files_sent", "method"}. Re-syncs send only changed files.
    """

    ui_color = "#fff3c4"
    operator_extra_links = (SkyNodeConsoleLink(),)

    def __init__(
        self,
        *,
        node: dict[str, Any] | Any = None,
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node = node
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        handle = self.handle()
        node = handle.node(int(self.node["rank"]))
        result = self.hook(handle).sync_task_files(
            node, self.sky_task, self.log.info, self.aws_conn_id, self.gcp_conn_id
        )
        return {"rank": node.rank, "files_sent": result.files_sent, "method": result.method}
