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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.node import processes, rclone, shell
from airflow_sky.task.storage import BucketMount

# A stand-in `rclone`: `rclone mount SRC DEST ...` sleeps as a mount would (its command line is what the flush
# and detach read); `rclone rc ... vfs/stats` reports the pending uploads counted down in $STATS_FILE, one per
# call, in rclone's own JSON layout; a missing file is a dead rc server.
FAKE_RCLONE = """#!/bin/bash
if [ "$1" = mount ]; then trap 'kill $!; exit 0' TERM; sleep 300 & wait; exit 0; fi
if [ "$1" = copyto ]; then mkdir -p "$3"; exit 0; fi
[ -f "$STATS_FILE" ] || { echo "connection refused" >&2; exit 1; }
n=$(cat "$STATS_FILE")
[ "$n" -gt 0 ] && echo $((n - 1)) > "$STATS_FILE"
printf '{\\n\\t"diskCache": {\\n\\t\\t"erroredFiles": 0,\\n\\t\\t"uploadsInProgress": %s,\\n\\t\\t"uploadsQueued": 0\\n\\t}\\n}\\n' "$n"
"""
CHECKPOINT = rclone.FlushedMount(rclone.mount_key("/checkpoint"), "/checkpoint", "s3://ckpt")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], list[subprocess.Popen[bytes]]]]:
    """A node home, the env its shell runs with (the stand-in rclone first on PATH), and the processes a
    test started (stopped at the end)."""
    home = tmp_path / "home"
    (home / ".airflow_sky" / "mounts").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "rclone"
    fake.write_text(FAKE_RCLONE)
    fake.chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "STATS_FILE": str(tmp_path / "stats")}
    started: list[subprocess.Popen[bytes]] = []
    yield home, env, started
    for proc in started:
        proc.kill()
        proc.wait()


def _serve_mount(
    node, key: str = CHECKPOINT.key, port: int = 5572, dest: str = "/checkpoint", source: str = "sky-s3:ckpt"
) -> int:
    """Start a stand-in mount process as attach does: marked with its key, its rc port on its command line."""
    home, env, started = node
    (home / ".airflow_sky" / "mounts" / key).mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["rclone", "mount", source, dest, "--rc", "--rc-addr", f"127.0.0.1:{port}"],
        env={**env, processes.MOUNT_MARK_ENV: key},
    )
    started.append(proc)
    deadline = time.monotonic() + 30
    while f"{processes.MOUNT_MARK_ENV}={key}".encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc.pid


def _run_job(
    node, name: str, script: str, flush=(CHECKPOINT,), env_file: str = "", timeout: int = 60
) -> tuple[str, str]:
    """launch.sh of a job with `flush` mounts, run in bash: (its exit code, its log)."""
    home, env, _ = node
    gen = home / ".airflow_sky" / "jobs" / name / "gen-0"
    gen.mkdir(parents=True)
    (gen / "script.sh").write_text(script + "\n")
    (gen / "env").write_text(env_file)
    (gen / "launch.sh").write_text(shell.launch_script(flush))
    subprocess.run(["bash", str(gen / "launch.sh")], env=env, timeout=timeout, check=True)
    return (gen / "exit_code").read_text().strip(), (gen / "log").read_text()


def test_flush_waits_until_the_mounts_uploads_are_done(node, tmp_path):
    _serve_mount(node)
    (tmp_path / "stats").write_text("2")
    code, log = _run_job(node, "j", "true")
    assert code == "0", log
    assert "waiting for 2 upload(s) of file_mounts./checkpoint to reach s3://ckpt" in log
    assert (tmp_path / "stats").read_text().strip() == "0"


def test_flush_fails_naming_the_mount_when_uploads_outlast_the_deadline(node, tmp_path):
    _serve_mount(node)
    (tmp_path / "stats").write_text("1000")
    code, log = _run_job(node, "j", "true", env_file="export AIRFLOW_SKY_FLUSH_TIMEOUT_S=2\n", timeout=120)
    assert code == "1"
    assert "file_mounts./checkpoint (s3://ckpt):" in log and "still pending at the deadline" in log


def test_a_failed_flush_fails_a_script_that_succeeded_and_keeps_a_real_failure(node):
    # No rclone serves the job's mount (it died): its writes are lost.
    for script, expected in (("exit 0", "1"), ("exit 7", "7")):
        code, log = _run_job(node, f"gen-{expected}", script)
        assert code == expected
        assert "file_mounts./checkpoint (s3://ckpt): the mount's rclone is gone" in log


def test_a_flush_file_or_mount_state_a_job_planted_changes_nothing_for_the_next_job(node, tmp_path):
    home, _, _ = node
    mounts = home / ".airflow_sky" / "mounts"
    ran = tmp_path / "planted-ran"
    _serve_mount(node)
    (tmp_path / "stats").write_text("0")
    # Job 1 plants the old flush path, and rewrites its mount's state to point elsewhere.
    plant = (
        f"printf '#!/bin/bash\\necho pwned >> {ran}\\n' > {mounts}/flush; chmod 700 {mounts}/flush; "
        f"echo 1 > {mounts}/{CHECKPOINT.key}/rc; echo 1 > {mounts}/{CHECKPOINT.key}/pid; "
        f"mkdir -p {mounts}/m-planted && echo 9 > {mounts}/m-planted/rc"
    )
    assert _run_job(node, "job1", plant)[0] == "0"
    # Job 2, with the mount and without any, runs none of it and gets its own verdict.
    assert _run_job(node, "job2", "echo two")[0] == "0"
    assert _run_job(node, "job3", "echo three", flush=())[0] == "0"
    assert not ran.exists(), "a later job ran the flush file an earlier job planted"


def test_the_wrapper_is_parsed_whole_so_a_job_rewriting_launch_sh_changes_nothing(node):
    script = 'printf "echo 99 > \\"$AIRFLOW_SKY_JOB_DIR/gen-0/exit_code\\"; exit\\n" >> "$AIRFLOW_SKY_JOB_DIR/gen-0/launch.sh"; exit 3'
    assert _run_job(node, "rewrite", script, flush=())[0] == "3"


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
    assert not os.path.exists(home / ".airflow_sky" / "mounts" / "flush")  # nothing for a job to plant into


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


def test_detach_removes_the_mounts_state_and_the_credentials_and_kills_no_bystander(node, tmp_path):
    home, env, started = node
    mount_pid = _serve_mount(node)
    (tmp_path / "stats").write_text("0")
    bystander = subprocess.Popen(["sleep", "300"])
    started.append(bystander)
    mounts = home / ".airflow_sky" / "mounts"
    (mounts / CHECKPOINT.key / "pid").write_text(f"{bystander.pid}\n")  # as a job could rewrite it
    (mounts / "flush").write_text(f"#!/bin/bash\ntouch {tmp_path}/planted-ran\n")
    (mounts / "flush").chmod(0o700)
    (mounts / "rclone.conf").write_text("[sky-s3]\n")
    done = subprocess.run(
        ["bash", "-c", rclone.detach_script(5)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["detached", "1"]
    assert list(mounts.iterdir()) == []
    assert started[0].wait(timeout=30) == 0  # the mount's process, found by its mark, was stopped
    assert bystander.poll() is None, "detach killed the process a rewritten pid file named"
    assert not (tmp_path / "planted-ran").exists() and mount_pid


def _attach_in(node, mounts: list[BucketMount]) -> subprocess.CompletedProcess[str]:
    _, env, _ = node
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("rclone.conf"), io.BytesIO(b""))
    return subprocess.run(
        ["bash", "-c", rclone.attach_script(mounts, rank=0)],
        input=buffer.getvalue().decode("latin-1"),
        env=env,
        capture_output=True,
        text=True,
        encoding="latin-1",
        timeout=60,
    )


def test_an_attach_leaves_the_mounts_of_other_destinations_alone(node):
    home, _, started = node
    _serve_mount(node)  # another job's mount of /checkpoint
    done = _attach_in(node, [BucketMount("~/data", "s3", "src-data", mode="COPY")])
    assert done.returncode == 0, done.stderr
    assert started[0].poll() is None, "a later job's attach stopped another job's mount"
    assert (home / ".airflow_sky" / "mounts" / CHECKPOINT.key).is_dir()


def test_an_attach_does_not_replace_a_mount_from_another_bucket_while_a_job_runs(node):
    home, env, started = node
    (Path(env["PATH"].split(":")[0]) / "mountpoint").write_text("#!/bin/bash\nexit 0\n")
    (Path(env["PATH"].split(":")[0]) / "mountpoint").chmod(0o755)
    dest = str(home / "ckpt")
    _serve_mount(node, key=rclone.mount_key(dest), dest=dest, source="sky-s3:other")
    running = subprocess.Popen(["sleep", "300"], env={**env, processes.JOB_MARK_ENV: "1-run/gen-0"})
    started.append(running)
    done = _attach_in(node, [BucketMount(dest, "s3", "mine", mode="MOUNT")])
    assert done.returncode == 1
    assert f"file_mounts.{dest}: {dest} on rank 0 is mounted from another bucket" in done.stderr
    assert started[0].poll() is None, "the running job's mount was replaced"
