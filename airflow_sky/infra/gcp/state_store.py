"""The gcp infra's StateStore: one JSON object per record in a Cloud Storage bucket, written conditionally.

The job records must outlive any node and must not live on an Airflow worker, so on GCP they live in a
Cloud Storage bucket (uniform bucket-level access, created on first use by `ensure_bucket`), under
`<prefix>/<cluster>/<key>.json`. A record's version is its object's generation: a write carries
`ifGenerationMatch` (the generation read, or 0 for "no object yet"), so of two racing writers exactly one
wins and the other gets 412 Precondition Failed; Cloud Storage is strongly consistent for reads after
writes, metadata and listings. A read takes the generation from the metadata, then downloads at exactly
that generation, so the data and the version it returns belong together. A record's write time is its
object's `updated`, set by Cloud Storage: one clock for every writer.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from google.api_core.exceptions import Conflict, GoogleAPIError, NotFound, PreconditionFailed
from google.auth.exceptions import GoogleAuthError
from google.cloud.storage import Client

from airflow_sky.errors import ClusterError
from airflow_sky.infra.state_store import StateStore, Versioned, is_cluster_store, validate_key

DEFAULT_PREFIX = "airflow-sky/clusters"
_READ_ATTEMPTS = 5  # a read retries when a writer replaces the record between its metadata and its data
_ready_buckets: set[tuple[int, str]] = set()
_ready_lock = threading.Lock()


def _reason(error: Exception) -> str:
    """The error's message on one line (GoogleAPICallError.message leaves out the method and URL)."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(str(message).split())


def _failure(bucket: str, doing: str, error: Exception) -> ClusterError:
    code = getattr(error, "code", None)
    if code == 403:
        what = f"gcp: no access to the state bucket {bucket!r} ({doing})"
    elif code == 404:
        what = f"gcp: the state bucket {bucket!r} does not exist ({doing})"
    else:
        what = f"gcp: the state bucket {bucket!r} answered an error ({doing})"
    return ClusterError(f"{what}: {_reason(error)}")


def ensure_bucket(client: Client, bucket: str, location: str) -> None:
    """Create the state bucket when it does not exist (idempotent; racing creators are fine)."""
    key = (id(client), bucket)
    with _ready_lock:
        if key in _ready_buckets:
            return
    try:
        found = client.lookup_bucket(bucket)
    except (GoogleAPIError, GoogleAuthError) as e:
        raise _failure(bucket, "reading the bucket", e) from e
    if found is None:
        new = client.bucket(bucket)
        new.iam_configuration.uniform_bucket_level_access_enabled = True
        new.labels = {"airflow-sky": "state"}
        try:
            client.create_bucket(new, location=location)
        except Conflict:
            pass  # created meanwhile by another caller
        except (GoogleAPIError, GoogleAuthError) as e:
            raise ClusterError(
                f"gcp: cannot create the state bucket {bucket!r} in {location!r}: {_reason(e)}"
            ) from e
    with _ready_lock:
        _ready_buckets.add(key)


class GcsStateStore(StateStore):
    """One cluster's records in the state bucket; `client` is a google.cloud.storage Client."""

    def __init__(self, client: Client, bucket: str, cluster: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self.bucket = bucket
        self.cluster = cluster
        self.root = f"{prefix}/{cluster}"
        self._bucket = client.bucket(bucket)

    def _name(self, key: str) -> str:
        return f"{self.root}/{validate_key(key)}.json"

    def get(self, key: str) -> Versioned | None:
        """The record at `key`, or None (also when the bucket is missing: a write or a listing says so)."""
        name = self._name(key)
        try:
            for _ in range(_READ_ATTEMPTS):
                found = self._bucket.get_blob(name)
                if found is None:
                    return None
                generation = int(found.generation)
                try:
                    raw = self._bucket.blob(name).download_as_bytes(if_generation_match=generation)
                except PreconditionFailed:
                    continue  # replaced since the metadata was read: read again
                except NotFound:
                    return None  # deleted since
                updated = found.updated.timestamp() if found.updated is not None else None
                return Versioned(generation, json.loads(raw), updated)
        except (GoogleAPIError, GoogleAuthError) as e:
            raise _failure(self.bucket, f"reading {name!r}", e) from e
        raise ClusterError(
            f"gcp: the record {name!r} in the state bucket {self.bucket!r} changed on each of "
            f"{_READ_ATTEMPTS} reads; too many writers"
        )

    def put(self, key: str, data: dict[str, Any], expected_version: int | None) -> Versioned | None:
        name = self._name(key)
        blob = self._bucket.blob(name)
        try:
            blob.upload_from_string(
                json.dumps(data, sort_keys=True),
                content_type="application/json",
                if_generation_match=0 if expected_version is None else expected_version,
            )
        except PreconditionFailed:
            return None
        except (GoogleAPIError, GoogleAuthError) as e:
            raise _failure(self.bucket, f"writing {name!r}", e) from e
        updated = blob.updated.timestamp() if blob.updated is not None else None
        return Versioned(int(blob.generation), data, updated)

    def keys(self, prefix: str) -> list[str]:
        start = f"{self.root}/{validate_key(prefix)}/"
        try:
            blobs = list(self._client.list_blobs(self.bucket, prefix=start, delimiter="/"))
        except (GoogleAPIError, GoogleAuthError) as e:
            raise _failure(self.bucket, f"listing {start!r}", e) from e
        found = []
        for blob in blobs:
            rest = blob.name[len(start) :]
            if rest.endswith(".json") and len(rest) > len(".json"):
                found.append(f"{prefix}/{rest.removesuffix('.json')}")
        return sorted(found)

    def delete_all(self) -> None:
        """Remove every record of the cluster (its teardown). A missing bucket holds nothing to remove."""
        start = f"{self.root}/"
        try:
            blobs = list(self._client.list_blobs(self.bucket, prefix=start))
        except NotFound:
            return
        except (GoogleAPIError, GoogleAuthError) as e:
            raise _failure(self.bucket, f"listing {start!r}", e) from e
        for listed in blobs:
            try:
                # A fresh blob: the listed one names its generation, and deleting a replaced generation
                # would miss the record that replaced it.
                self._bucket.blob(listed.name).delete()
            except NotFound:
                pass  # deleted meanwhile
            except (GoogleAPIError, GoogleAuthError) as e:
                raise _failure(self.bucket, f"deleting {listed.name!r}", e) from e


def cluster_names(client: Client, bucket: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Clusters with records in the bucket (one listing with a delimiter: the prefixes, no objects)."""
    start = f"{prefix}/"
    try:
        pages = client.list_blobs(bucket, prefix=start, delimiter="/")
        for _ in pages:  # `prefixes` fills as the pages are read
            pass
    except (GoogleAPIError, GoogleAuthError) as e:
        raise _failure(bucket, f"listing {start!r}", e) from e
    names = (p[len(start) :].rstrip("/") for p in pages.prefixes)
    return sorted(n for n in names if is_cluster_store(n))
