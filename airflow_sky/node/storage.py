"""Object stores through Airflow's ObjectStoragePath: one path API for s3://, gs://, file:// and local paths.

The store's filesystem comes from the provider that owns the scheme (amazon: s3fs with the `aws_conn_id`
connection, installed with `apache-airflow-providers-amazon[s3fs]`; google: gcsfs with the `gcp_conn_id`
connection), so credentials, endpoints and emulators are configured the way Airflow configures them
everywhere else.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from airflow_sky.errors import SkyError, SpecError

if TYPE_CHECKING:  # imported where used: a sync without buckets (the CLI's exec) loads no Airflow
    from airflow.sdk import ObjectStoragePath

SCHEMES = ("s3", "gs", "file")
_DEFAULT_CONN = {"s3": "aws_default", "gs": "google_cloud_default"}
_INSTALL = {"s3": "'apache-airflow-providers-amazon[s3fs]'", "gs": "'airflow-sky[gcp]'"}


def storage_path(
    uri: str, aws_conn_id: str | None = None, gcp_conn_id: str | None = None, field: str = "uri"
) -> ObjectStoragePath:
    """The ObjectStoragePath of `uri` (a plain path is a local file); `field` names the setting in errors."""
    from airflow.sdk import ObjectStoragePath

    scheme = urlparse(uri).scheme
    if scheme == "":
        return ObjectStoragePath("file://" + os.path.abspath(os.path.expanduser(uri)))
    if scheme not in SCHEMES:
        raise SpecError(f"{field}: unsupported store {uri!r}; use a local path, file://, s3:// or gs://")
    conn_id = {"s3": aws_conn_id, "gs": gcp_conn_id}.get(scheme) or _DEFAULT_CONN.get(scheme)
    path = ObjectStoragePath(uri, conn_id=conn_id)
    try:
        path.fs  # noqa: B018  # builds the store's filesystem now: a missing provider is a clear error here
    except ImportError as e:
        raise SkyError(
            f"{field}: {scheme}:// needs the provider's filesystem: pip install {_INSTALL.get(scheme, '')} ({e})"
        ) from e
    return path
