"""Bucket object keys with `..` never land outside a mount's destination.

No code of airflow-sky writes objects by key: a node fetches a COPY mount with `rclone copyto` (and mounts
the others with `rclone mount`), from the attach script the sync phase runs. Here that script runs in a
local bash with the real rclone against a real S3 API (moto) holding keys built to climb out of the
destination (`data/../../escape`): rclone's S3 and local encodings keep a `..` segment a name (two full-width dots), so
nothing is written outside; the copy fails naming the mount, as a failed sync does."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from airflow_sky.node import rclone
from airflow_sky.task.storage import BucketMount
from tests.s3server import S3Server

BUCKET = "keys-escape"  # moto keeps buckets per process: a name of this file's own
KEYS = ["data/ok.txt", "data/../../escape-1.txt", "data/../escape-2.txt", "data/..", "../escape-3.txt"]


def _attach(home: Path, s3: S3Server, mounts: list[BucketMount]) -> subprocess.CompletedProcess[str]:
    config = rclone.config_text(
        {
            "sky-s3": {
                "type": "s3",
                "provider": "Other",
                "endpoint": s3.endpoint,
                "force_path_style": "true",
                "access_key_id": "testing",
                "secret_access_key": "testing",
            }
        }
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("rclone.conf")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config.encode()))
    done = subprocess.run(
        ["bash", "-c", rclone.attach_script(mounts, rank=0, plain_http=True)],
        input=buffer.getvalue(),
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        timeout=120,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_keys_with_dot_dot_are_never_written_outside_the_destination(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = root / "home" / "user"
    home.mkdir(parents=True)
    with S3Server() as s3:
        s3.client.create_bucket(Bucket=BUCKET)
        for key in KEYS:
            s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"payload")
        assert s3.keys(BUCKET) == sorted(KEYS)
        done = _attach(
            home,
            s3,
            [
                BucketMount("~/data", "s3", BUCKET, "data", mode="COPY"),
                BucketMount("~/whole", "s3", BUCKET, mode="COPY"),
            ],
        )

    written = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and ".airflow_sky" not in path.parts
    )
    assert all(p.startswith(("home/user/data/", "home/user/whole/")) for p in written), written
    assert not [p for p in written if "escape" in Path(p).name], written
    # The copy of the bucket as a whole fails (the encoded names are not its objects): the sync fails, naming
    # the mount, instead of writing anywhere else.
    assert done.returncode != 0
    assert "file_mounts.~/whole: copying s3://keys-escape to" in done.stderr, done.stderr
