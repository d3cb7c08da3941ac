"""Bucket file_mounts (`s3://`, `gs://`): objects copied onto a node, read through Airflow's ObjectStoragePath.

SkyPilot mounts buckets on the nodes; airflow-sky copies them (MOUNT is accepted and copied, as documented)
before setup runs: the worker lists the objects and streams each one to the node over SFTP.
"""

from __future__ import annotations

import functools
import posixpath
import shlex
import shutil
from collections.abc import Callable, Iterator
from typing import IO, Any
from urllib.parse import urlparse

from airflow_sky.errors import SkyError, SpecError
from airflow_sky.node.client import NodeClient
from airflow_sky.node.paths import remote_path
from airflow_sky.node.storage import storage_path
from airflow_sky.task import StorageMount

_CHUNK = 1024 * 1024


def bucket_source(source: str | StorageMount, destination: str = "") -> str:
    """The bucket URI of a file_mounts source (a URI, or a storage mapping with `source` or `store`+`name`)."""
    uri = source if isinstance(source, str) else source.source
    if isinstance(uri, str):
        if urlparse(uri).scheme not in ("s3", "gs"):
            raise SpecError(
                f"file_mounts.{destination}: {uri!r}: only s3:// and gs:// buckets are supported (or a local path)"
            )
        return uri
    if isinstance(source, StorageMount) and source.name and source.store:
        scheme = {"s3": "s3", "gcs": "gs"}.get(source.store.lower())
        if scheme:
            return f"{scheme}://{source.name}"
    shown = source.to_dict() if isinstance(source, StorageMount) else source
    raise SpecError(
        f"file_mounts.{destination}: storage {shown} is not supported: use source: s3://..., gs://... or a path"
    )


def _objects(
    uri: str, aws_conn_id: str | None, gcp_conn_id: str | None
) -> Iterator[tuple[str, Callable[[], IO[bytes]]]]:
    """(path relative to the URI, opener of a streaming body) for every object under the URI."""
    base = storage_path(uri, aws_conn_id, gcp_conn_id, field="file_mounts")
    prefix = base.path.rstrip("/")
    for key in sorted(base.fs.find(base.path)):
        if key.endswith("/"):
            continue  # a "folder" marker object
        relative = key[len(prefix) :].lstrip(
            "/"
        )  # "" when the URI names one object: it lands at the destination
        yield relative, functools.partial(_open, base / relative if relative else base)


def _open(path: Any) -> IO[bytes]:
    stream: IO[bytes] = path.open("rb")
    return stream


def copy_bucket(
    client: NodeClient,
    uri: str,
    destination: str,
    log: Callable[[str], None],
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
) -> int:
    """Copy every object under `uri` to `destination` on the node (streamed); returns the object count."""
    base = remote_path(destination)
    copied = 0
    made: set[str] = set()
    for relative, open_body in _objects(uri, aws_conn_id, gcp_conn_id):
        target = posixpath.join(base, relative) if relative else base
        parent = posixpath.dirname(target)
        if parent and parent not in made:
            client.exec(f"mkdir -p {shlex.quote(parent)}", timeout=60)
            made.add(parent)
        body = open_body()
        try:
            with client.open_remote(target, "wb") as out:
                shutil.copyfileobj(body, out, _CHUNK)
        finally:
            body.close()
        copied += 1
    if copied == 0:
        raise SkyError(f"file_mounts: {uri} holds no objects (nothing to copy to {destination})")
    log(f"copied {copied} objects from {uri} -> {destination} on rank {client.node.rank}")
    return copied
