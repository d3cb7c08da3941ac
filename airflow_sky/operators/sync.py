"""Sync: the workdir (to ~/sky_workdir) and local file_mounts onto one node (mapped over nodes), then the
start of that node's setup."""

from __future__ import annotations

from typing import Any

from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.operators.links import SkyNodeConsoleLink


class SkySyncOperator(SkyBaseOperator):
    """Uploads the workdir and local file_mounts to `node` (rsync over SSH, SFTP where rsync is missing) and
    has the node copy or mount its buckets (rclone on the node, credentials from the connections the
    provision task recorded), then starts the task's setup on it, detached.

    A node's setup needs only that node's files, so no barrier is lost by starting it here; the setup follow
    tasks stream and judge it. Returns {"rank", "files_sent", "method"} (and "setup_pid" when setup started).
    Re-syncs send only changed files; a retry attaches to a setup already started.

    :param start_setup: start the setup after the sync (default). False only syncs: for DAGs that start
        setup with their own SkyStartOperator tasks.
    """

    ui_color = "#fff3c4"
    operator_extra_links = (SkyNodeConsoleLink(),)

    def __init__(
        self,
        *,
        node: dict[str, Any] | Any = None,
        start_setup: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node = node
        self.start_setup = start_setup

    def execute(self, context: Any) -> dict[str, Any]:
        self.mask_secrets()
        handle = self.handle()
        hook = self.hook(handle)
        node = handle.node(int(self.node["rank"]))
        result = hook.sync_task_files(
            node,
            self.sky_task,
            self.log.info,
            hook.bucket_plan(handle, self.sky_task),
            git_commit=handle.git_commit,
            container_image=handle.container_image,
        )
        summary: dict[str, Any] = {
            "rank": node.rank,
            "files_sent": result.files_sent,
            "method": result.method,
        }
        if self.start_setup and self.sky_task.setup is not None:
            start = self.job.start(self.sky_task, "setup", node.rank)
            if start.skipped:
                self.log.info("Setup not started on rank %d: %s", node.rank, start.skipped)
            else:
                verb = "Started" if start.started else "Attached to"
                self.log.info("%s setup on rank %d (pid %s)", verb, node.rank, start.pid)
                summary["setup_pid"] = start.pid
        return summary
