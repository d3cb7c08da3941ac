"""Sync: the workdir (to ~/sky_workdir) and local file_mounts, onto one node (mapped over nodes)."""

from __future__ import annotations

import os
import posixpath
import shlex
import time
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote.client import NodeClient
from airflow_sky.remote.shell import WORKDIR
from airflow_sky.remote.sync import sync_dir
from airflow_sky.spec import StorageMount, Task, is_bucket_uri


def local_uploads(task: Task) -> list[tuple[str, str]]:
    """(local source, remote destination) pairs: the workdir first, then local file_mounts."""
    uploads: list[tuple[str, str]] = []
    if task.resolved_workdir is not None:
        uploads.append((task.resolved_workdir, f"~/{WORKDIR}"))
    for dst, src in task.file_mounts.items():
        if isinstance(src, StorageMount) or is_bucket_uri(src):
            raise SpecError(
                f"file_mounts.{dst}: bucket and storage mounts are not supported yet; use a local path"
            )
        uploads.append((task.resolve_local_path(src), dst))
    return uploads


class SkySyncOperator(SkyBaseOperator):
    """Uploads the workdir and local file_mounts to `node` (rsync over SSH, SFTP where rsync is missing).

    Returns {"rank", "files_sent", "method"}. Re-syncs send only changed files.
    """

    ui_color = "#fff3c4"

    def __init__(self, *, node: dict[str, Any] | Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node = node

    def execute(self, context: Any) -> dict[str, Any]:
        handle = self.handle()
        node = handle.node(int(self.node["rank"]))
        uploads = local_uploads(self.sky_task)
        sent, method = 0, "none"
        with self.hook(handle).client(node) as client:
            for source, destination in uploads:
                started = time.monotonic()
                if os.path.isdir(source):
                    result = sync_dir(client, source, destination)
                    sent += len(result.files_sent)
                    method = result.method
                elif os.path.isfile(source):
                    _put_file(client, source, destination)
                    sent += 1
                    method = "sftp"
                else:
                    raise SpecError(f"file_mounts: local path {source} does not exist")
                self.log.info(
                    "synced %s -> %s on rank %d (%s, %d files sent, %.1fs)",
                    source,
                    destination,
                    node.rank,
                    method,
                    sent,
                    time.monotonic() - started,
                )
        return {"rank": node.rank, "files_sent": sent, "method": method}


def _put_file(client: NodeClient, source: str, destination: str) -> None:
    remote = destination[2:] if destination.startswith("~/") else destination
    parent = posixpath.dirname(remote)
    if parent:
        client.exec(f"mkdir -p {shlex.quote(parent)}", timeout=60)
    client.put(source, remote)
