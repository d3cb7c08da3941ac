"""Getting a task's files onto a node: the workdir (to ~/sky_workdir), local file_mounts, and its buckets
(copied or mounted by the node itself, node.buckets)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shlex
import time
from collections.abc import Callable

from airflow_sky.errors import SpecError
from airflow_sky.node.buckets import BucketPlan, attach_buckets
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container import deployment_settings, ensure_container
from airflow_sky.node.git_commit import checkout_task_workdir
from airflow_sky.node.paths import WORKDIR, remote_path
from airflow_sky.node.sync import sync_dir
from airflow_sky.task import StorageMount, Task, is_bucket_uri
from airflow_sky.task.container import ContainerSpec, registry_login


@dataclasses.dataclass(frozen=True)
class UploadResult:
    files_sent: int
    method: str


def local_uploads(task: Task) -> list[tuple[str, str]]:
    """(local source, remote destination) pairs: the workdir first, then local file_mounts."""
    uploads: list[tuple[str, str]] = []
    if task.resolved_workdir is not None:
        uploads.append((task.resolved_workdir, f"~/{WORKDIR}"))
    for dst, src in task.file_mounts.items():
        local = _local_source(src)
        if local is not None:
            uploads.append((task.resolve_local_path(local), dst))
    return uploads


def _local_source(src: str | StorageMount) -> str | None:
    """The local path of a mount that is synced (a plain path, or a storage mapping with a local `source`
    and no bucket `name`), else None: a named bucket's local source is uploaded to the bucket instead."""
    if isinstance(src, StorageMount):
        local = isinstance(src.source, str) and not is_bucket_uri(src.source) and not src.name
        return src.source if local and isinstance(src.source, str) else None
    return None if is_bucket_uri(src) else src


def upload_task_files(
    client: NodeClient,
    task: Task,
    log: Callable[[str], None],
    buckets: BucketPlan | None = None,
    *,
    git_commit: str | None = None,
    container: ContainerSpec | None = None,
    cluster_name: str = "",
) -> UploadResult:
    """Sync the workdir and local file_mounts to the node (rsync over SSH, SFTP where rsync is missing),
    then let the node copy or mount its buckets (`buckets`, from node.buckets.bucket_remotes), then start
    the node's container: `container`, or the task's own (`image_id: docker:`)."""
    container = container or task.container
    checkout_task_workdir(client, task, git_commit, log)  # a git workdir: cloned at the job's commit
    sent, method = 0, "none"
    for source, destination in local_uploads(task):
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
        log(
            f"synced {source} -> {destination} on rank {client.node.rank} "
            f"({method}, {sent} files sent, {time.monotonic() - started:.1f}s)"
        )
    if buckets is not None and buckets.mounts:
        attach_buckets(client, buckets, log)
    if container is not None:  # last: it binds the mounts' paths, which exist now
        runtime, options = deployment_settings()
        ensure_container(
            client,
            container,
            registry_login(task.envs_and_secrets),
            log,
            binds=[dst for dst in task.file_mounts if posixpath.isabs(dst)],
            deployment_options=options,
            preferred=runtime,
            cluster=cluster_name,
        )
    return UploadResult(sent, method)


def _put_file(client: NodeClient, source: str, destination: str) -> None:
    remote = remote_path(destination)
    parent = posixpath.dirname(remote)
    if parent:
        client.exec(f"mkdir -p {shlex.quote(parent)}", timeout=60)
    client.put(source, remote)
