"""The node's bucket shell (node.rclone) run in a local bash (STYLE rule 1), with a stand-in `rclone` on PATH
where the real one would need a bucket: the flush waits for pending uploads and fails naming the mount, the
wrapper turns a failed flush into a failed job, and the config stays private."""

from __future__ import annotations

import configparser
import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

from airflow_sky.node import rclone, shell
from airflow_sky.task.storage import BucketMount

# A stand-in `rclone rc ... vfs/stats`: reports the pending uploads counted down in $STATS_FILE, one per
# call, in rclone's own JSON layout; a missing file is a dead rclone (rc unreachable).
FAKE_RCLONE = """#!/bin/bash
[ -f "$STATS_FILE" ] || { echo "connection refused" >&2; exit 1; }
n=$(cat "$STATS_FILE")
[ "$n" -gt 0 ] && echo $((n - 1)) > "$STATS_FILE"
printf '{\\n\\t"diskCache": {\\n\\t\\t"erroredFiles": 0,\\n\\t\\t"uploadsInProgress": %s,\\n\\t\\t"uploadsQueued": 0\\n\\t}\\n}\\n' "$n"
"""


def _home_with_mount(tmp_path: Path, pending: int | None) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    mount = home / ".airflow_sky" / "mounts" / rclone.mount_key("/checkpoint")
    mount.mkdir(parents=True)
    (mount / "rc").write_text("5572\n")
    (mount / "dest").write_text("/checkpoint\n")
    (mount / "uri").write_text("s3://ckpt\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "rclone"
    fake.write_text(FAKE_RCLONE)
    fake.chmod(0o755)
    stats = tmp_path / "stats"
    if pending is not None:
        stats.write_text(str(pending))
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "STATS_FILE": str(stats)}
    flush = home / ".airflow_sky" / "mounts" / "flush"
    flush.write_text(rclone.flush_script())
    flush.chmod(0o700)
    return home, env


def test_flush_waits_until_the_mounts_uploads_are_done(tmp_path):
    home, env = _home_with_mount(tmp_path, pending=2)
    done = subprocess.run(
        [str(home / ".airflow_sky/mounts/flush")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "waiting for 2 upload(s) of file_mounts./checkpoint to reach s3://ckpt" in done.stdout
    assert (tmp_path / "stats").read_text().strip() == "0"


def test_flush_fails_naming_the_mount_when_uploads_outlast_the_deadline(tmp_path):
    home, env = _home_with_mount(tmp_path, pending=1000)
    env["AIRFLOW_SKY_FLUSH_TIMEOUT_S"] = "2"
    done = subprocess.run(
        [str(home / ".airflow_sky/mounts/flush")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert (
        "file_mounts./checkpoint (s3://ckpt):" in done.stdout
        and "still pending at the deadline" in done.stdout
    )


def test_a_failed_flush_fails_a_script_that_succeeded_and_keeps_a_real_failure(tmp_path):
    _, env = _home_with_mount(tmp_path, pending=None)  # rclone gone: its writes are lost
    for script, expected in (("exit 0", "1"), ("exit 7", "7")):
        gen = tmp_path / f"gen-{expected}"
        gen.mkdir()
        (gen / "script.sh").write_text(script + "\n")
        (gen / "env").write_text("")
        (gen / "launch.sh").write_text(shell.launch_script())
        subprocess.run(["bash", str(gen / "launch.sh")], env=env, timeout=60, check=True)
        assert (gen / "exit_code").read_text().strip() == expected
        assert "file_mounts./checkpoint (s3://ckpt): the mount's rclone is gone" in (gen / "log").read_text()


def _attach(
    tmp_path: Path, fake_rclone: str, source: str = "shard"
) -> tuple[Path, subprocess.CompletedProcess[bytes]]:
    """The attach script of one COPY mount (~/data) run in bash, `fake_rclone` standing in for rclone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "rclone").write_text(fake_rclone)
    (bin_dir / "rclone").chmod(0o755)
    for tool in ("fusermount3", "mountpoint"):
        (bin_dir / tool).write_text("#!/bin/bash\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    mounts = [BucketMount("~/data", "s3", "src-data", source, mode="COPY")]
    script = rclone.attach_script(mounts, rank=0, plain_http=True)
    config = rclone.config_text({"sky-s3": {"type": "s3", "secret_access_key": "s3cr3t"}})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("rclone.conf")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config.encode()))
    done = subprocess.run(
        ["bash", "-c", script],
        input=buffer.getvalue(),
        env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "AWS_CA_BUNDLE": "/x"},
        capture_output=True,
        timeout=60,
    )
    return home, done


def test_attach_installs_a_private_config_and_leaves_mounted_files_world_readable(tmp_path):
    # Only COPY runs here (a mount needs FUSE): `rclone copyto` of a folder is the stand-in writing one file.
    home, done = _attach(
        tmp_path, '#!/bin/bash\n[ "$1" = copyto ] && mkdir -p "$3" && echo data > "$3/obj.bin"\n'
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == [
        "copied",
        "~/data",
        "1",
        str((home / "data" / "obj.bin").stat().st_size),
    ]
    conf = home / ".airflow_sky" / "mounts" / "rclone.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    parsed = configparser.ConfigParser()
    parsed.read(conf)
    assert parsed["sky-s3"]["secret_access_key"] == "s3cr3t"
    assert stat.S_IMODE((home / "data" / "obj.bin").stat().st_mode) & 0o044 == 0o044
    assert os.access(home / ".airflow_sky" / "mounts" / "flush", os.X_OK)


def test_copy_of_an_empty_folder_leaves_an_empty_directory_and_one_object_lands_at_the_destination(tmp_path):
    # rclone copyto creates nothing for a folder without objects, and writes one object at the path itself.
    home, done = _attach(tmp_path / "empty", '#!/bin/bash\n[ "$1" = copyto ]\n')
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == ["copied", "~/data", "0", "0"]
    assert (home / "data").is_dir() and not any((home / "data").iterdir())
    home, done = _attach(
        tmp_path / "one", '#!/bin/bash\n[ "$1" = copyto ] && echo "{}" > "$3"\n', source="conf.json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == ["copied", "~/data", "1", "3"]
    assert (home / "data").read_text() == "{}\n"


def test_detach_removes_the_mounts_state_and_the_credentials(tmp_path):
    home, env = _home_with_mount(tmp_path, pending=0)
    (home / ".airflow_sky" / "mounts" / "rclone.conf").write_text("[sky-s3]\n")
    done = subprocess.run(
        ["bash", "-c", rclone.detach_script(5)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["detached", "1"]
    assert list((home / ".airflow_sky" / "mounts").iterdir()) == []
