"""Artifacts: files a job leaves on its nodes, streamed to a local directory, S3 or GCS by the collect task.

Destinations: a local directory (`/data/runs/1` or `file:///data/runs/1`), `s3://bucket/prefix/` or
`gs://bucket/prefix/`, all through Airflow's ObjectStoragePath (node.storage). Files are streamed from the
node's SFTP channel into the store; nothing is read whole into memory.
"""

from __future__ import annotations

import posixpath
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import IO
from urllib.parse import urlparse

from airflow_sky.errors import JobFailed, SpecError
from airflow_sky.node.client import NodeClient, UnsafeRemoteFile
from airflow_sky.node.paths import remote_path
from airflow_sky.node.record import Node
from airflow_sky.node.storage import SCHEMES, storage_path

_CHUNK = 1024 * 1024


def destination_uri(base: str, artifact: str, rank: int | None) -> str:
    """Where one artifact goes: `<base>/<file name>`, or `<base>/rank-<r>/<file name>` when every rank uploads."""
    name = posixpath.basename(artifact.rstrip("/"))
    if name in ("", "~", ".", ".."):
        raise SpecError(f"artifacts: {artifact!r} does not name a file")
    parts = [base.rstrip("/")]
    if rank is not None:
        parts.append(f"rank-{rank}")
    parts.append(name)
    return "/".join(parts)


def validate_destination(base: str) -> None:
    scheme = urlparse(base).scheme
    if scheme not in ("", *SCHEMES):
        raise SpecError(
            f"artifacts_to: unsupported destination {base!r}; use a local directory, s3://... or gs://..."
        )


def upload_stream(stream: IO[bytes], uri: str, aws_conn_id: str | None, gcp_conn_id: str | None) -> None:
    """Copy a readable binary stream to `uri` (a local path, file://, s3:// or gs://) without holding it in memory."""
    target = storage_path(uri, aws_conn_id, gcp_conn_id, field="artifacts_to")
    if target.protocol == "file":
        target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        shutil.copyfileobj(stream, out, _CHUNK)


def upload_artifacts(
    clients: Mapping[int, NodeClient],
    nodes: Sequence[Node],
    paths: Sequence[str],
    destination: str,
    per_rank: bool,
    log: Callable[[str], None],
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
) -> dict[str, str]:
    """Stream every path from every node to `destination` (into `rank-<r>/` with `per_rank`).

    Returns {path: uri} ({`rank<r>:path`: uri} with `per_rank`); a missing file is a JobFailed naming it.
    """
    validate_destination(destination)
    uploaded: dict[str, str] = {}
    for node in nodes:
        client = clients[node.rank]
        for path in paths:
            uri = destination_uri(destination, path, node.rank if per_rank else None)
            try:
                # A regular file only, read up to the size it had when opened: a job's link to /dev/zero
                # or a FIFO must not stream forever into the destination.
                with client.open_regular(remote_path(path)) as (stream, _size):
                    stream.prefetch()  # pipelined reads: SFTP round trips overlap
                    upload_stream(stream, uri, aws_conn_id, gcp_conn_id)  # type: ignore[arg-type]
            except FileNotFoundError as e:
                raise JobFailed(f"artifact {path} is missing on rank {node.rank} ({node.internal_ip})") from e
            except UnsafeRemoteFile as e:
                raise JobFailed(f"artifact {path} on rank {node.rank} ({node.internal_ip}): {e}") from e
            log(f"artifact {path} (rank {node.rank}) -> {uri}")
            uploaded[f"rank{node.rank}:{path}" if per_rank else path] = uri
    return uploaded
