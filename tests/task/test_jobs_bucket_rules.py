"""A managed job's local files in the jobs bucket, as pure rules (task.jobs_bucket): what `jobs launch`
uploads where, the task the deployment gets instead, and the only prefix a run's end may remove."""

from __future__ import annotations

import pytest

from airflow_sky import SpecError, Task
from airflow_sky.task import StorageMount
from airflow_sky.task.jobs_bucket import (
    JobsBucket,
    LocalUpload,
    checked_uploads_uri,
    job_files_uri,
    local_paths,
    translate_local_paths,
)
from airflow_sky.task.storage import bucket_mounts

RUN = "sky-job-20261203-101500-a1b2c3"
FILES = f"s3://sky-jobs/uploads/{RUN}"


def test_the_workdir_and_local_mounts_become_copies_of_their_uploads_and_buckets_stay(tmp_path):
    task = Task.from_yaml_str(
        """
name: train
workdir: .
envs: {DATA: s3://data-bucket/train}
secrets: {TOKEN: t0k}
file_mounts:
  /data: $DATA
  ~/ckpt: {name: ckpt-bucket, store: s3, mode: MOUNT}
  ~/conf/settings.json: ./settings.json
  /inputs: {source: ./inputs, mode: COPY}
  relative/dir: ../shared
run: python train.py
""",
        base_dir=str(tmp_path / "code"),
    )
    before = task.to_dict()
    translated, uploads = translate_local_paths(task, FILES)

    assert task.to_dict() == before  # the caller's task is left as it is
    code = tmp_path / "code"
    assert uploads == [
        LocalUpload("workdir", str(code), f"{FILES}/workdir"),
        LocalUpload("file_mounts.~/conf/settings.json", str(code / "settings.json"), f"{FILES}/mounts/0"),
        LocalUpload("file_mounts./inputs", str(code / "inputs"), f"{FILES}/mounts/1"),
        LocalUpload("file_mounts.~/sky_workdir/relative/dir", str(tmp_path / "shared"), f"{FILES}/mounts/2"),
    ]
    mapping = translated.to_dict()
    assert "workdir" not in mapping
    assert mapping["file_mounts"] == {
        "~/sky_workdir": {"source": f"{FILES}/workdir", "mode": "COPY"},
        "/data": "s3://data-bucket/train",
        "~/ckpt": {"name": "ckpt-bucket", "store": "s3", "mode": "MOUNT"},
        "~/conf/settings.json": {"source": f"{FILES}/mounts/0", "mode": "COPY"},
        "/inputs": {"source": f"{FILES}/mounts/1", "mode": "COPY"},
        "~/sky_workdir/relative/dir": {"source": f"{FILES}/mounts/2", "mode": "COPY"},
    }
    assert (translated.name, translated.run, translated.secrets) == (
        "train",
        "python train.py",
        {"TOKEN": "t0k"},
    )
    # What the deployment loads: a valid task whose every mount is a bucket, each upload copied to its node.
    loaded = Task.from_dict(mapping)
    assert local_paths(loaded) == []
    copies = {m.destination: m.uri for m in bucket_mounts(loaded, "s3") if m.mode == "COPY"}
    assert copies["~/sky_workdir"] == f"{FILES}/workdir"
    assert copies["~/conf/settings.json"] == f"{FILES}/mounts/0"


def test_a_task_without_local_paths_is_submitted_as_it_is(tmp_path):
    task = Task(
        run="true",
        workdir={"url": "https://github.com/org/repo.git"},
        file_mounts={"/data": "gs://data-bucket/x", "~/out": {"name": "out-bucket", "store": "gcs"}},
    )
    translated, uploads = translate_local_paths(task, FILES)
    assert translated is task and uploads == []
    assert local_paths(task) == []


def test_local_paths_lists_only_paths_of_this_machine():
    task = Task(
        run="true",
        workdir="./code",
        file_mounts={
            "/a": "s3://bucket-a/x",
            "/b": "./b",
            "/c": {"source": "gs://bucket-c"},
            "/d": {"name": "bucket-d"},
            "/e": {"source": "./e", "mode": "COPY"},
            "/f": {"name": "bucket-f", "source": "./f"},
        },
    )
    assert local_paths(task) == [
        "workdir (./code)",
        "file_mounts./b (./b)",
        "file_mounts./e.source (./e)",
        "file_mounts./f.source (./f)",
    ]


@pytest.mark.parametrize(
    ("mounts", "workdir", "message"),
    [
        ({"~/sky_workdir": "./other"}, ".", r"file_mounts.~/sky_workdir: the workdir lands there"),
        (
            {"/f": {"name": "bucket-f", "source": "./f"}},
            None,
            r"file_mounts./f.source \(./f\): a named bucket's local source .* upload it into bucket bucket-f yourself",
        ),
        (
            {"/m": StorageMount(source="./m", mode="MOUNT")},
            None,
            r"file_mounts./m: a local source in MOUNT mode needs a bucket `name`",
        ),
    ],
)
def test_a_local_path_a_managed_job_cannot_carry_is_refused_saying_why(mounts, workdir, message):
    task = Task(run="true", workdir=workdir, file_mounts=mounts)
    with pytest.raises(SpecError, match=message):
        translate_local_paths(task, FILES)


def test_a_list_of_local_sources_is_refused():
    task = Task(run="true")
    task.file_mounts = {"/l": StorageMount(source=("./a", "./b"), mode="COPY")}
    with pytest.raises(SpecError, match=r"file_mounts./l.source: a list of local paths"):
        translate_local_paths(task, FILES)


def test_the_jobs_bucket_setting_is_checked_and_names_the_setting():
    bucket = JobsBucket.parse("s3://sky-jobs/uploads/", "jobs.bucket")
    assert (bucket.store, bucket.bucket, bucket.prefix, bucket.uri) == (
        "s3",
        "sky-jobs",
        "uploads",
        "s3://sky-jobs/uploads",
    )
    assert bucket.run_uri(RUN) == FILES
    assert JobsBucket.parse("gs://team-jobs", "jobs.bucket").run_uri(RUN) == f"gs://team-jobs/{RUN}"
    with pytest.raises(SpecError, match=r"jobs.bucket: 'my-bucket' is not a bucket URI; write s3://"):
        JobsBucket.parse("my-bucket", "jobs.bucket")
    with pytest.raises(SpecError, match=r"jobs.bucket: 'r2://x-bucket': only s3:// and gs://"):
        JobsBucket.parse("r2://x-bucket", "jobs.bucket")
    for run_id in ("../other", "a/b", ".hidden", ""):
        with pytest.raises(SpecError, match="not one plain path segment"):
            bucket.run_uri(run_id)


def test_a_pipelines_tasks_get_a_folder_each():
    assert job_files_uri(FILES, 0, 1) == FILES
    assert [job_files_uri(FILES, i, 3) for i in range(3)] == [f"{FILES}/task-{i}" for i in (1, 2, 3)]


def test_a_run_may_remove_only_its_own_prefix_of_the_deployments_jobs_bucket():
    configured = "s3://sky-jobs/uploads"
    assert checked_uploads_uri(FILES, configured, RUN) == FILES
    assert checked_uploads_uri(FILES + "/", configured + "/", RUN) == FILES
    refused = {
        "another run's files": "s3://sky-jobs/uploads/sky-job-20261203-101500-ffffff",
        "the whole jobs bucket": "s3://sky-jobs/uploads",
        "the bucket": "s3://sky-jobs",
        "a folder below the run": f"{FILES}/workdir",
        "another prefix": f"s3://sky-jobs/data/{RUN}",
        "another bucket": f"s3://production-data/uploads/{RUN}",
        "another store": f"gs://sky-jobs/uploads/{RUN}",
    }
    for what, uri in refused.items():
        try:
            checked_uploads_uri(uri, configured, RUN)
        except SpecError as e:
            assert "is not this run's prefix" in str(e) and "must name the same bucket" in str(e), what
        else:
            pytest.fail(f"{what} ({uri}) was accepted")
    with pytest.raises(SpecError, match=r"this deployment has no \[sky\] jobs_bucket"):
        checked_uploads_uri(FILES, None, RUN)
    with pytest.raises(SpecError, match="must be the bucket URI"):
        checked_uploads_uri(["s3://x"], configured, RUN)
