"""A `[sky]` setting reads the same from the shell (AIRFLOW__SKY__*), from the CLI's own airflow.cfg and on a
deployment's worker: the CLI's checks once read the shell alone, so a `default_store` set in the CLI's
airflow.cfg was refused before the launch that would have used it (and the launch dropped the shell's)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon
from tests.s3server import S3Server

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
BUCKET = "settings-read-once"

TASK = f"""
name: store-from-settings
file_mounts:
  /data:
    name: {BUCKET}
    mode: MOUNT
run: cat /data/hello.txt
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.client.create_bucket(Bucket=BUCKET)
        server.client.put_object(Bucket=BUCKET, Key="hello.txt", Body=b"read-through-the-default-store\n")
        yield server


def _env(tmp_path: Path, cfg: str | None = None, shell: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    home = tmp_path / "sky"
    env.update(AIRFLOW_SKY_HOME=str(home), AIRFLOW_SKY_SSH_CONFIG=str(home / "ssh_config"))
    if cfg is not None:  # the CLI's private Airflow home: ~/.airflow_sky/airflow by default
        (home / "airflow").mkdir(parents=True)
        (home / "airflow" / "airflow.cfg").write_text(f"[sky]\ndefault_store = {cfg}\n")
    if shell is not None:
        env["AIRFLOW__SKY__DEFAULT_STORE"] = shell
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("cfg", "shell", "store"),
    [(None, None, None), ("s3", None, "s3"), (None, "gcs", "gcs")],
    ids=["unset", "cli-cfg", "shell"],
)
def test_check_reads_default_store_from_the_shell_or_the_cli_cfg(
    tmp_path: Path, cfg: str | None, shell: str | None, store: str | None
) -> None:
    (tmp_path / "task.yaml").write_text(TASK)
    result = _cli(_env(tmp_path, cfg, shell), "check", str(tmp_path / "task.yaml"))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    if store is None:
        assert "launching on local would fail" in out and "[sky] default_store" in out, out
    else:
        assert "would fail" not in out and "default_store" not in out, out


def test_a_launch_mounts_a_bucket_of_the_default_store_set_only_in_the_cli_cfg(
    tmp_path: Path, s3: S3Server
) -> None:
    (tmp_path / "task.yaml").write_text(TASK)
    env = _env(tmp_path, cfg="s3")
    env["AIRFLOW_CONN_AWS_DEFAULT"] = env["AIRFLOW_CONN_SKY_NODES_AWS"] = s3.connection
    result = _cli(env, "launch", "-c", "settings-cfg", str(tmp_path / "task.yaml"), "--down", "-y")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "read-through-the-default-store" in out
    assert daemon.processes_with_marker("settings-cfg") == []


def test_a_bucket_job_without_a_connection_or_credentials_fails_at_once_naming_the_connection(
    tmp_path: Path,
) -> None:
    """Once, it failed after 16-23 s with "bucket s3://... does not exist" (anonymous access, retried
    against AWS): the real cause, no connection, was only in the Airflow log."""
    (tmp_path / "task.yaml").write_text(TASK)
    env = _env(tmp_path, shell="s3")
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    env.update(  # nothing for boto3 to find on its own either (files, instance metadata)
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    result = _cli(env, "launch", "-c", "settings-noconn", str(tmp_path / "task.yaml"), "--down", "-y")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "no Airflow connection 'aws_default' is defined" in out, out[-4000:]
    assert "AIRFLOW_CONN_AWS_DEFAULT=" in out and "does not exist" not in out
    assert daemon.processes_with_marker("settings-noconn") == []  # no node was made
