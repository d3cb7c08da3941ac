"""A managed job's local files in a jobs bucket (SkyPilot's `jobs.bucket`), as pure rules.

A managed job runs on the deployment's workers, which cannot read the launching machine's files. With a
jobs bucket configured, `airflow-sky jobs launch` uploads them under a prefix of the run and submits a task
that reads them from there, each node copying them itself (COPY mode):

    <jobs bucket>/<run id>/workdir         the workdir       -> file_mounts ~/sky_workdir: {source, mode: COPY}
    <jobs bucket>/<run id>/mounts/<n>      n-th local mount  -> file_mounts <dst>: {source, mode: COPY}

A directory's files go below its prefix; a single file is the one object at it (the node copies it to the
destination path itself). A pipeline's task i (from 1) uses `<run id>/task-<i>/...`. The deployment removes
`<jobs bucket>/<run id>/` when the run ends, and nothing else (`checked_uploads_uri`).
"""

from __future__ import annotations

import dataclasses
import re

from airflow_sky.errors import SpecError
from airflow_sky.task.mounts import WORKDIR_ON_NODE, StorageMount, is_bucket_uri
from airflow_sky.task.storage import COPY, BucketMount, parse_bucket_uri
from airflow_sky.task.task import Task

WORKDIR_MOUNT = f"~/{WORKDIR_ON_NODE}"  # where a workdir lands on every node (scripts run there)
# A run id that is one plain path segment: it names a prefix, never a parent or a sibling of one.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+~-]*$")


@dataclasses.dataclass(frozen=True)
class JobsBucket:
    """A jobs bucket: `s3://name[/prefix]` or `gs://name[/prefix]`."""

    store: str  # s3 | gcs
    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, uri: str, setting: str) -> JobsBucket:
        """Check `uri` as the value of `setting` (named in the error)."""
        if not isinstance(uri, str) or not is_bucket_uri(uri.strip()):
            raise SpecError(
                f"{setting}: {uri!r} is not a bucket URI; write s3://<bucket>[/<prefix>] or gs://..."
            )
        parsed = parse_bucket_uri(setting, uri.strip())
        return cls(parsed.store, parsed.bucket, parsed.prefix)

    @property
    def uri(self) -> str:
        return BucketMount(destination="", store=self.store, bucket=self.bucket, prefix=self.prefix).uri

    def run_uri(self, run_id: str) -> str:
        """Where the files of run `run_id` go (the prefix its end removes)."""
        if not _RUN_ID.match(run_id) or ".." in run_id:
            raise SpecError(
                f"run id {run_id!r}: not one plain path segment; it cannot name a jobs bucket prefix"
            )
        return f"{self.uri}/{run_id}"


def job_files_uri(run_uri: str, index: int, jobs: int) -> str:
    """Where the files of a run's job `index` go: the run's prefix, or `task-<n>` below it in a pipeline."""
    return run_uri if jobs == 1 else f"{run_uri}/task-{index + 1}"


@dataclasses.dataclass(frozen=True)
class LocalUpload:
    """One local path to upload before the job is submitted."""

    field: str  # what the task wrote: `workdir` or `file_mounts.<dst>`
    local: str  # the absolute path on the launching machine (a directory or a file)
    uri: str  # where it goes: a prefix for a directory's files, the object itself for a file


def local_paths(task: Task) -> list[str]:
    """The task's fields that name paths on the launching machine, as `field (path)`: a local workdir, and
    file_mounts whose source is a local path (plain, or a storage mapping's `source`). Bucket URIs and
    buckets named without a local source are not among them."""
    fields = [f"workdir ({task.workdir})"] if isinstance(task.workdir, str) else []
    for dst, src in task.file_mounts.items():
        if isinstance(src, str):
            if not is_bucket_uri(src):
                fields.append(f"file_mounts.{dst} ({src})")
        elif isinstance(src.source, tuple):
            fields.append(f"file_mounts.{dst}.source ({', '.join(src.source)})")
        elif isinstance(src.source, str) and not is_bucket_uri(src.source):
            fields.append(f"file_mounts.{dst}.source ({src.source})")
    return fields


def translate_local_paths(task: Task, files_uri: str) -> tuple[Task, list[LocalUpload]]:
    """The task as a managed job's deployment gets it, and the uploads to make first.

    The workdir becomes a COPY of `<files_uri>/workdir` at ~/sky_workdir and each local file_mount a COPY of
    `<files_uri>/mounts/<n>` at its destination (n counts the local mounts from 0, in file_mounts order); the
    rest of the task is unchanged. `task` itself is left as it is. A local path this cannot carry (a named
    bucket's local `source`, a list of sources, a local source in a mount mode) raises SpecError saying why.
    """
    uploads: list[LocalUpload] = []
    mounts: dict[str, str | StorageMount] = {}
    copied = 0  # local file_mounts so far: the n of mounts/<n>
    if isinstance(task.workdir, str):
        if WORKDIR_MOUNT in task.file_mounts:
            raise SpecError(
                f"file_mounts.{WORKDIR_MOUNT}: the workdir lands there on every node; drop the workdir or "
                "this mount"
            )
        uri = f"{files_uri}/workdir"
        uploads.append(LocalUpload("workdir", task.resolve_local_path(task.workdir), uri))
        mounts[WORKDIR_MOUNT] = StorageMount(source=uri, mode=COPY)
    for dst, src in task.file_mounts.items():
        local = _local_source(dst, src)
        if local is None:
            mounts[dst] = src
            continue
        uri = f"{files_uri}/mounts/{copied}"
        copied += 1
        uploads.append(LocalUpload(f"file_mounts.{dst}", task.resolve_local_path(local), uri))
        mounts[dst] = StorageMount(source=uri, mode=COPY)
    if not uploads:
        return task, []
    translated = Task.from_dict(task.to_dict(), source="the managed job's task", base_dir=task.base_dir)
    translated.workdir = None
    translated.file_mounts = mounts
    # What the deployment will load: the rewritten task must be a valid one.
    Task.from_dict(translated.to_dict(), source="the managed job's task (its local paths uploaded)")
    return translated, uploads


def _local_source(dst: str, src: str | StorageMount) -> str | None:
    """The local path a file_mount copies from (None for a bucket), or SpecError when a managed job cannot
    carry it."""
    if isinstance(src, str):
        return None if is_bucket_uri(src) else src
    field = f"file_mounts.{dst}"
    if isinstance(src.source, tuple):
        raise SpecError(
            f"{field}.source: a list of local paths cannot be uploaded for a managed job; give one directory "
            "(or one mount each)"
        )
    if not isinstance(src.source, str) or is_bucket_uri(src.source):
        return None
    if src.name:
        raise SpecError(
            f"{field}.source ({src.source}): a named bucket's local source is uploaded by the machine that "
            f"runs the job, and a managed job's is the deployment; upload it into bucket {src.name} yourself "
            "and drop `source`, or mount it as a plain local path (it is then uploaded to the jobs bucket)"
        )
    if (src.mode or "MOUNT") != COPY or src.store:
        raise SpecError(
            f"{field}: a local source in {src.mode or 'MOUNT'} mode needs a bucket `name`; or give the local "
            "path as a plain string (copied to every node)"
        )
    return src.source


def checked_uploads_uri(uri: object, configured: str | None, run_id: str, field: str = "uploads") -> str:
    """The prefix a run's end may remove: `uri` (from the run conf), only when it is `<jobs bucket>/<run id>`
    of this run and of the deployment's own jobs bucket (`configured`, `[sky] jobs_bucket`). A conf can
    thus never have the deployment delete another prefix, another run's files, or another bucket."""
    setting = "[sky] jobs_bucket (AIRFLOW__SKY__JOBS_BUCKET)"
    if not isinstance(uri, str) or not is_bucket_uri(uri):
        raise SpecError(f"{field}: must be the bucket URI of the run's uploaded files, got {uri!r}")
    if not configured:
        raise SpecError(
            f"{field}: {uri}: this deployment has no {setting}; set it to the jobs.bucket of the machines "
            "that launch jobs, so that it can fetch and later remove their files"
        )
    expected = JobsBucket.parse(configured, setting).run_uri(run_id)
    given = JobsBucket.parse(uri, field).uri
    if given != expected:
        raise SpecError(
            f"{field}: {uri} is not this run's prefix {expected} of the deployment's {setting} "
            f"({configured}); jobs.bucket on the launching machine must name the same bucket"
        )
    return expected
