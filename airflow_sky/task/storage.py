"""Bucket file_mounts with SkyPilot's meaning (`reference/storage.rst`), as pure rules.

    /data: s3://bucket/prefix                      COPY: fetched to the node's disk before setup
    /data: {source: s3://bucket/prefix}            MOUNT (the default mode of a storage mapping)
    /ckpt: {name: ckpt}                            the bucket `ckpt` on the infra's store, created if absent
    /ckpt: {name: ckpt, store: s3, mode: MOUNT_CACHED}
    /ds:   {name: ds, source: ./local, mode: COPY} created, `./local` uploaded first, then copied
    /tmp:  {name: t, persistent: false}            deleted at teardown when airflow-sky created it

Nothing here talks to a store; `bucket_mounts` turns a task's file_mounts into BucketMount records, and
`mount_notes` says where what a field does differs from SkyPilot.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from urllib.parse import urlparse

from airflow_sky.errors import SpecError
from airflow_sky.task.mounts import StorageMount, is_bucket_uri
from airflow_sky.task.task import Task

COPY, MOUNT, MOUNT_CACHED = "COPY", "MOUNT", "MOUNT_CACHED"
MODES = (COPY, MOUNT, MOUNT_CACHED)
STORES = ("s3", "gcs")  # what nodes can reach (rclone remotes); SkyPilot's other stores are refused
_SCHEME_OF_STORE = {"s3": "s3", "gcs": "gs"}
_STORE_OF_SCHEME = {scheme: store for store, scheme in _SCHEME_OF_STORE.items()}
# The store a bucket named without `store` lives on, by infra (SkyPilot: the task's cloud).
STORE_OF_INFRA = {"aws": "s3", "gcp": "gcs"}
# S3's and GCS's common bucket name rule (3-63 chars, lower case, digits, '.', '-'; alnum at both ends).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class BucketMount:
    """One bucket file_mount: where it lands on every node, which bucket, how, and its lifecycle."""

    destination: str  # the node path as written in file_mounts (`/ckpt`, `~/data`)
    store: str  # s3 | gcs
    bucket: str
    prefix: str = ""  # a folder inside the bucket ("" for the whole bucket)
    mode: str = MOUNT
    create: bool = False  # a named bucket (SkyPilot's `name`): created when absent
    upload: str | None = None  # a local source (absolute path) uploaded into the bucket before the job
    persistent: bool = True  # False: a bucket airflow-sky created is deleted at teardown

    @property
    def uri(self) -> str:
        return f"{_SCHEME_OF_STORE[self.store]}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def bucket_uri(self) -> str:
        return f"{_SCHEME_OF_STORE[self.store]}://{self.bucket}"

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> BucketMount:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})  # type: ignore[arg-type]


def default_store(infra: str | None, configured: str | None = None) -> str | None:
    """The store of a bucket named without `store`: the infra's own (aws: s3, gcp: gcs), else `configured`
    (`[sky] default_store` for local and ssh)."""
    cloud = (infra or "local").split("/", 1)[0].lower()
    return STORE_OF_INFRA.get(cloud) or (configured.lower() if configured else None)


def has_bucket_mounts(task: Task) -> bool:
    """Whether any file_mount is a bucket (a URI, or a mapping naming one): cheap, nothing checked."""
    for source in task.file_mounts.values():
        if isinstance(source, str):
            if is_bucket_uri(source):
                return True
        elif source.name or (isinstance(source.source, str) and is_bucket_uri(source.source)):
            return True
    return False


def bucket_mounts(task: Task, store_default: str | None = None) -> list[BucketMount]:
    """The task's bucket file_mounts, checked; a local path (or a mapping with only a local `source`) is
    not one of them (it is synced). Raises SpecError naming the field and what is allowed."""
    mounts = []
    for destination, source in task.file_mounts.items():
        try:
            mount = _bucket_mount(task, destination, source, store_default)
        except SpecError as e:  # a bucket name or path may hold a substituted secret
            raise SpecError(task.hide_secrets(str(e))) from None
        if mount is not None:
            mounts.append(mount)
    return mounts


def _bucket_mount(
    task: Task, destination: str, source: str | StorageMount, store_default: str | None
) -> BucketMount | None:
    field = f"file_mounts.{destination}"
    if isinstance(source, str):
        # SkyPilot: a bucket URI given as a plain string is copied.
        return _from_uri(field, destination, source, COPY) if is_bucket_uri(source) else None
    mode = source.mode or MOUNT
    if mode not in MODES:
        raise SpecError(f"{field}.mode: {source.mode!r}; use one of {', '.join(MODES)}")
    persistent = True if source.persistent is None else bool(source.persistent)
    if isinstance(source.source, tuple):
        raise SpecError(
            f"{field}.source: a list of local paths is not supported; give one directory (or one mount each)"
        )
    if isinstance(source.source, str) and is_bucket_uri(source.source):
        mount = _from_uri(f"{field}.source", destination, source.source, mode)
        if source.name and source.name != mount.bucket:
            raise SpecError(
                f"{field}: name {source.name!r} and source {source.source!r} name different buckets; "
                "drop `name` (the source names the bucket)"
            )
        if source.store and source.store != mount.store:
            raise SpecError(f"{field}.store: {source.store!r} does not match the source {source.source!r}")
        return dataclasses.replace(mount, persistent=persistent)
    if not source.name:
        if mode != COPY or source.store:
            # A local source with no bucket name: SkyPilot would invent a bucket; say what to write.
            raise SpecError(
                f"{field}: a local source in {mode} mode needs a bucket `name` (SkyPilot creates and uploads "
                "it); or give the local path as a plain string to sync it"
            )
        return None  # {source: ./dir, mode: COPY}: synced like a plain local path
    store = source.store or store_default
    if store is None:
        infra = task.resources.infra or "local"
        raise SpecError(
            f"{field}: bucket {source.name!r} has no `store`, and infra {infra} has no store of its own; "
            "write `store: s3` (or gcs), or set [sky] default_store (AIRFLOW__SKY__DEFAULT_STORE)"
        )
    if store not in STORES:
        raise SpecError(f"{field}.store: {store!r} is not supported; use one of {', '.join(STORES)}")
    _check_bucket_name(f"{field}.name", source.name)
    upload = task.resolve_local_path(source.source) if isinstance(source.source, str) else None
    return BucketMount(
        destination=destination,
        store=store,
        bucket=source.name,
        mode=mode,
        create=True,
        upload=upload,
        persistent=persistent,
    )


def parse_bucket_uri(field: str, uri: str) -> BucketMount:
    """A bucket URI (`s3://bucket[/prefix]`, `gs://...`) checked as file_mounts URIs are (a BucketMount
    without a destination); SpecError naming `field`."""
    return _from_uri(field, "", uri, COPY)


def _from_uri(field: str, destination: str, uri: str, mode: str) -> BucketMount:
    parsed = urlparse(uri)
    store = _STORE_OF_SCHEME.get(parsed.scheme.lower())
    if store is None:
        raise SpecError(
            f"{field}: {uri!r}: only s3:// and gs:// buckets are supported (SkyPilot's other stores are not)"
        )
    _check_bucket_name(field, parsed.netloc)
    return BucketMount(
        destination=destination, store=store, bucket=parsed.netloc, prefix=parsed.path.strip("/"), mode=mode
    )


def _check_bucket_name(field: str, name: str) -> None:
    if not _BUCKET_NAME.match(name) or ".." in name:
        raise SpecError(
            f"{field}: {name!r} is not a bucket name: 3-63 characters, lower-case letters, digits, '.', '-' "
            "or '_', starting and ending with a letter or digit"
        )


def shared_mount_paths(mounts: list[BucketMount]) -> list[str]:
    """Destinations every node mounts at one absolute path (outside its home): on one machine's filesystem
    (local nodes) that needs a mount namespace per node."""
    return [m.destination for m in mounts if m.mode != COPY and not m.destination.startswith("~")]


def mount_notes(mounts: list[BucketMount]) -> list[str]:
    """What airflow-sky does with these mounts where a SkyPilot user might expect otherwise (said once, at
    check and launch)."""
    notes = []
    for mount in mounts:
        if not mount.persistent and not mount.create:
            notes.append(
                f"file_mounts.{mount.destination}: persistent: false deletes only a bucket airflow-sky "
                f"creates (one given by `name`); {mount.bucket_uri} is given by URI and is kept"
            )
    return notes
