"""SkyPilot's storage rules as airflow-sky reads them (task.storage): which mounts are buckets, their store,
mode and lifecycle, and the errors that name the field."""

from __future__ import annotations

import pytest

from airflow_sky import SpecError, Task
from airflow_sky.task.storage import BucketMount, bucket_mounts, default_store, mount_notes


def _mounts(file_mounts: dict[str, object], store: str | None = None) -> list[BucketMount]:
    return bucket_mounts(Task(run="x", file_mounts=file_mounts), store)  # type: ignore[arg-type]


def test_a_bucket_uri_string_is_copied_and_a_storage_mapping_mounts_by_default():
    copy, mount = _mounts({"/a": "s3://data/train", "/b": {"source": "gs://models"}})
    assert (copy.store, copy.bucket, copy.prefix, copy.mode, copy.create) == (
        "s3",
        "data",
        "train",
        "COPY",
        False,
    )
    assert (mount.store, mount.bucket, mount.mode, mount.uri) == ("gcs", "models", "MOUNT", "gs://models")


def test_a_named_bucket_takes_the_infras_store_and_is_created():
    assert default_store("aws/us-east-1") == "s3"
    assert default_store("gcp") == "gcs"
    assert default_store("local") is None
    assert default_store("ssh/pool", "S3") == "s3"
    (mount,) = _mounts({"/checkpoint": {"name": "ckpt", "mode": "MOUNT_CACHED"}}, "s3")
    assert (mount.uri, mount.create, mount.persistent, mount.mode) == (
        "s3://ckpt",
        True,
        True,
        "MOUNT_CACHED",
    )


def test_a_named_bucket_without_a_store_on_local_names_the_setting():
    with pytest.raises(SpecError, match=r"file_mounts\./ckpt: bucket 'ckpt' has no `store`.*default_store"):
        _mounts({"/ckpt": {"name": "ckpt"}})


def test_a_named_bucket_with_a_local_source_is_uploaded_from_the_tasks_directory():
    task = Task(
        run="x", file_mounts={"~/ds": {"name": "ds-up", "source": "data", "store": "s3", "mode": "COPY"}}
    )
    task.base_dir = "/srv/project"
    (mount,) = bucket_mounts(task)
    assert (mount.upload, mount.mode, mount.create) == ("/srv/project/data", "COPY", True)


def test_a_local_source_without_a_name_is_synced_not_a_bucket():
    assert _mounts({"~/cfg": {"source": "/srv/cfg", "mode": "COPY"}}) == []
    assert _mounts({"~/cfg": "/srv/cfg"}) == []


@pytest.mark.parametrize(
    ("file_mounts", "message"),
    [
        (
            {"/x": {"source": "/srv/cfg"}},
            r"file_mounts\./x: a local source in MOUNT mode needs a bucket `name`",
        ),
        ({"/x": {"name": "a", "store": "s3"}}, r"file_mounts\./x\.name: 'a' is not a bucket name"),
        ({"/x": "s3://Bad_Bucket/p"}, r"file_mounts\./x: 'Bad_Bucket' is not a bucket name"),
        (
            {"/x": {"name": "r2b", "store": "r2"}},
            r"file_mounts\./x\.store: 'r2' is not supported; use one of s3, gcs",
        ),
        (
            {"/x": {"name": "other", "source": "s3://data"}},
            r"name 'other' and source 's3://data' name different",
        ),
        ({"/x": {"source": ["/a", "/b"], "name": "lst"}}, r"file_mounts\./x\.source: a list of local paths"),
        ({"/x": "r2://bucket/x"}, r"only s3:// and gs:// buckets are supported"),
    ],
)
def test_unsupported_storage_names_the_field_and_what_is_allowed(file_mounts, message):
    with pytest.raises(SpecError, match=message):
        _mounts(file_mounts, "s3")


def test_persistent_false_on_a_bucket_given_by_uri_is_said_to_be_kept():
    mounts = _mounts(
        {
            "/x": {"source": "s3://shared-data", "persistent": False},
            "/y": {"name": "mine", "persistent": False},
        },
        "s3",
    )
    notes = mount_notes(mounts)
    assert notes == [
        "file_mounts./x: persistent: false deletes only a bucket airflow-sky creates (one given by `name`); "
        "s3://shared-data is given by URI and is kept"
    ]


def test_a_bucket_mount_round_trips_through_the_job_state():
    (mount,) = _mounts({"~/d": {"name": "round-trip", "store": "gcs", "persistent": False}})
    assert BucketMount.from_dict(mount.to_dict()) == mount


def test_check_says_once_what_a_launch_here_would_refuse_and_what_differs(run_cli, tmp_path):
    path = tmp_path / "spot.yaml"
    path.write_text(
        "name: spot\nrun: echo hi\nfile_mounts:\n"
        "  /checkpoint: {name: my-ckpt, mode: MOUNT}\n"
        "  /data: {source: s3://shared-data/train, persistent: false}\n"
    )
    done = run_cli("check", str(path))
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("airflow-sky: note:")]
    assert notes == [
        "airflow-sky: note: launching on local would fail: file_mounts./checkpoint: bucket 'my-ckpt' has no "
        "`store`, and infra local has no store of its own; write `store: s3` (or gcs), or set [sky] "
        "default_store (AIRFLOW__SKY__DEFAULT_STORE)"
    ]
    path.write_text(path.read_text().replace("name: spot", "name: spot\nresources: {infra: aws}"))
    done = run_cli("check", str(path))
    assert done.returncode == 0, done.stderr
    assert "s3://shared-data is given by URI and is kept" in done.stderr
    assert done.stderr.count("airflow-sky: note:") == 1


def test_only_tasks_with_a_bucket_pay_for_reading_the_jobs_bucket_record():
    from airflow_sky.task.storage import has_bucket_mounts

    assert not has_bucket_mounts(
        Task(run="x", file_mounts={"~/a": "/srv/a", "~/b": {"source": "/srv/b", "mode": "COPY"}})
    )
    assert has_bucket_mounts(Task(run="x", file_mounts={"~/a": "gs://data"}))
    assert has_bucket_mounts(Task(run="x", file_mounts={"~/a": {"name": "ckpt"}}))
    assert has_bucket_mounts(Task(run="x", file_mounts={"~/a": {"source": "s3://d/x", "mode": "MOUNT"}}))


def test_the_clis_bucket_check_loads_no_airflow_before_the_engine_configures_it(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "t.yaml"
    path.write_text("run: echo hi\nfile_mounts:\n  /ckpt: {name: ckpt-x, store: s3, persistent: false}\n")
    code = (
        "import sys, argparse; from airflow_sky.client.cli.common import check_buckets; "
        "from airflow_sky import Task; "
        f"check_buckets(Task.from_yaml({str(path)!r}), 'local', fatal=False); "
        "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
