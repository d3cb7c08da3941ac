"""The jobs bucket from the launching machine's side: where it is configured, and the upload of a managed
job's local files into it (SkyPilot's `jobs.bucket`; the rules of what goes where: task.jobs_bucket).

Configured, first found wins:

1. `AIRFLOW_SKY_JOBS_BUCKET` (`s3://name[/prefix]` or `gs://name[/prefix]`), with
   `AIRFLOW_SKY_JOBS_ENDPOINT_URL` for an S3-compatible store;
2. the `jobs:` section of `~/.airflow_sky/config.yaml`: `bucket`, and `endpoint_url`.

The upload uses this machine's own credentials, as `sky jobs launch` does: the standard AWS chain for s3
(environment, `AWS_PROFILE`, `~/.aws/credentials`, SSO, an instance role) and application default
credentials for gs (`gcloud auth application-default login`, `GOOGLE_APPLICATION_CREDENTIALS`). The
deployment reads the files with its own Airflow connection, and must name the same bucket (`[sky]
jobs_bucket`, docs/deploy.md).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from airflow_sky.client.config_file import config_section
from airflow_sky.errors import SkyError, SpecError
from airflow_sky.node.sync import select_files
from airflow_sky.task.jobs_bucket import JobsBucket, LocalUpload

JOBS_BUCKET_ENV = "AIRFLOW_SKY_JOBS_BUCKET"
JOBS_ENDPOINT_ENV = "AIRFLOW_SKY_JOBS_ENDPOINT_URL"
SETTING = f"jobs.bucket in ~/.airflow_sky/config.yaml (or {JOBS_BUCKET_ENV})"
UPLOAD_THREADS = 16  # objects in flight at once: small files are latency-bound


@dataclasses.dataclass(frozen=True)
class JobsBucketConfig:
    bucket: JobsBucket
    endpoint_url: str | None = None  # an S3-compatible store's endpoint (s3 only)
    source: str = ""  # where it was set: named in errors


def jobs_bucket_config() -> JobsBucketConfig | None:
    """The configured jobs bucket (see the module's docstring for the order), or None when there is none."""
    uri = os.environ.get(JOBS_BUCKET_ENV, "").strip()
    if uri:
        endpoint = os.environ.get(JOBS_ENDPOINT_ENV) or None
        return _config(uri, endpoint, JOBS_BUCKET_ENV)
    section, path = config_section(
        "jobs", ("bucket", "endpoint_url"), "a mapping with bucket (s3://<bucket>[/<prefix>] or gs://...)"
    )
    if section is None or section.get("bucket") is None:
        return None
    endpoint = section.get("endpoint_url")
    if endpoint is not None and not isinstance(endpoint, str):
        raise SkyError(f"{path}: jobs.endpoint_url: must be a URL such as https://s3.example.com")
    return _config(section["bucket"], endpoint, f"{path}: jobs.bucket")


def _config(uri: Any, endpoint: str | None, source: str) -> JobsBucketConfig:
    bucket = JobsBucket.parse(uri, source)
    if endpoint and bucket.store != "s3":
        raise SpecError(f"{source}: an endpoint_url is for S3-compatible stores; {bucket.uri} is not s3://")
    return JobsBucketConfig(bucket, endpoint, source)


# ---- what to upload ----------------------------------------------------------------------------------


def object_key(bucket: JobsBucket, uri: str) -> str:
    """The key in `bucket` of a URI below it (`s3://b/p/run/workdir` -> `p/run/workdir`)."""
    root = f"{bucket.uri}/"
    if not uri.startswith(root):
        raise SpecError(f"{uri} is not below the jobs bucket {bucket.uri}")
    rest = uri.removeprefix(root)
    return f"{bucket.prefix}/{rest}" if bucket.prefix else rest


@dataclasses.dataclass(frozen=True)
class UploadFile:
    local: Path
    key: str  # the object's key in the jobs bucket
    size: int


def files_to_upload(bucket: JobsBucket, uploads: Sequence[LocalUpload]) -> list[UploadFile]:
    """Every object to write: a directory's files as a workdir sync selects them (its `.skyignore`, else
    its `.gitignore` files), each below the upload's prefix; a file as the one object at it."""
    files: list[UploadFile] = []
    for upload in uploads:
        key = object_key(bucket, upload.uri)
        path = Path(upload.local)
        if path.is_dir():
            for rel in select_files(path).files:
                local = path / rel
                files.append(UploadFile(local, f"{key}/{rel}", local.stat().st_size))
        elif path.is_file():
            files.append(UploadFile(path, key, path.stat().st_size))
        else:
            raise SpecError(f"{upload.field}: local path {upload.local} does not exist")
    return files


# ---- the stores --------------------------------------------------------------------------------------


class ObjectStore(Protocol):
    """The few calls an upload needs, on one bucket."""

    def check(self) -> None:
        """Raise SkyError naming the setting when the bucket is missing or not writable from here."""

    def put(self, local: Path, key: str, sent: Callable[[int], None]) -> None:
        """Write one object; `sent(n)` as bytes go out."""

    def delete(self, prefix: str) -> int:
        """Remove every object below `prefix` (ending in '/'); returns how many."""


class S3Store:
    """boto3 with the standard AWS credential chain (and an endpoint for S3-compatible stores)."""

    def __init__(self, config: JobsBucketConfig) -> None:
        try:
            import boto3
            import botocore.exceptions
        except ImportError as e:
            raise SkyError(f"{config.source}: s3:// needs boto3: pip install 'airflow-sky[aws]' ({e})") from e
        # botocore says at INFO which credentials it found; Airflow's logging would print that on the CLI.
        logging.getLogger("botocore.credentials").setLevel(logging.WARNING)
        self.errors = botocore.exceptions
        self.bucket = config.bucket.bucket
        self.config = config
        self.client = boto3.session.Session().client("s3", endpoint_url=config.endpoint_url)

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except self.errors.NoCredentialsError as e:
            raise SkyError(
                f"{self.config.source}: no AWS credentials on this machine for s3://{self.bucket}: set "
                "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws configure`"
            ) from e
        except self.errors.ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket"):
                raise SkyError(
                    f"{self.config.source}: bucket s3://{self.bucket} does not exist; create it "
                    f"(aws s3 mb s3://{self.bucket}) or name another"
                ) from e
            raise SkyError(
                f"{self.config.source}: s3://{self.bucket}: {code or e} with this machine's AWS credentials"
            ) from e
        except self.errors.EndpointConnectionError as e:
            raise SkyError(f"{self.config.source}: cannot reach the S3 endpoint: {e}") from e

    def put(self, local: Path, key: str, sent: Callable[[int], None]) -> None:
        self.client.upload_file(str(local), self.bucket, key, Callback=sent)

    def delete(self, prefix: str) -> int:
        count = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                count += len(keys)
        return count


class GcsStore:
    """google-cloud-storage with application default credentials (STORAGE_EMULATOR_HOST honoured)."""

    def __init__(self, config: JobsBucketConfig) -> None:
        try:
            import google.cloud.storage as storage
        except ImportError as e:
            raise SkyError(
                f"{config.source}: gs:// needs google-cloud-storage: pip install 'airflow-sky[gcp]' ({e})"
            ) from e
        self.config = config
        self.client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT"))
        self.bucket = self.client.bucket(config.bucket.bucket)

    def check(self) -> None:
        from google.api_core import exceptions

        try:
            exists = self.bucket.exists()
        except exceptions.GoogleAPIError as e:
            raise SkyError(
                f"{self.config.source}: gs://{self.bucket.name}: {e} with this machine's credentials"
            ) from e
        if not exists:
            raise SkyError(
                f"{self.config.source}: bucket gs://{self.bucket.name} does not exist; create it "
                f"(gcloud storage buckets create gs://{self.bucket.name}) or name another"
            )

    def put(self, local: Path, key: str, sent: Callable[[int], None]) -> None:
        self.bucket.blob(key).upload_from_filename(str(local))
        sent(local.stat().st_size)

    def delete(self, prefix: str) -> int:
        blobs = list(self.client.list_blobs(self.bucket, prefix=prefix))
        if blobs:
            self.bucket.delete_blobs(blobs)
        return len(blobs)


def open_store(config: JobsBucketConfig) -> ObjectStore:
    return S3Store(config) if config.bucket.store == "s3" else GcsStore(config)


# ---- the upload --------------------------------------------------------------------------------------


class UploadProgress(Protocol):
    """What an upload reports as it goes (the CLI draws it; `files` and `size` are totals)."""

    def started(self, uri: str, files: int, size: int) -> None: ...

    def advanced(self, files: int, size: int) -> None: ...

    def finished(self, seconds: float) -> None: ...


def upload(
    store: ObjectStore, files: Sequence[UploadFile], uri: str, progress: UploadProgress | None = None
) -> None:
    """Write `files` into the store, UPLOAD_THREADS at a time; `uri` is what `progress` shows."""
    started = time.monotonic()
    if progress is not None:
        progress.started(uri, len(files), sum(f.size for f in files))
    lock = threading.Lock()

    def sent(size: int) -> None:
        if progress is not None:
            with lock:
                progress.advanced(0, size)

    def one(file: UploadFile) -> None:
        store.put(file.local, file.key, sent)
        if progress is not None:
            with lock:
                progress.advanced(1, 0)

    with concurrent.futures.ThreadPoolExecutor(max_workers=UPLOAD_THREADS) as pool:
        for future in concurrent.futures.as_completed([pool.submit(one, f) for f in files]):
            future.result()  # the first failure stops the launch (pending uploads still finish)
    if progress is not None:
        progress.finished(time.monotonic() - started)


def run_prefix(bucket: JobsBucket, run_uri: str) -> str:
    """The key prefix (ending in '/') of a run's files: what `ObjectStore.delete` takes."""
    return object_key(bucket, run_uri) + "/"
