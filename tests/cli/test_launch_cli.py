"""`airflow-sky launch / exec / status / down` as a user runs them: a real DAG run in the CLI process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]

PROBE = """\
name: probe
num_nodes: 2
envs:
  GREETING: hi there
setup: |
  echo "setting up rank $SKYPILOT_SETUP_NODE_RANK"
run: |
  echo "$GREETING from rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
"""

FAILING = """\
name: failing
num_nodes: 2
run: |
  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then echo "boom" >&2; exit 4; fi
  sleep 600
"""


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIRFLOW_HOME", None)
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("cli-airflow"))
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_launch_streams_node_logs_and_exits_zero_on_success(cli_env, tmp_path: Path):
    (tmp_path / "probe.yaml").write_text(PROBE)
    result = _cli(cli_env, "launch", "-c", "cli-ok", str(tmp_path / "probe.yaml"), "--down", "-y")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "(head, rank=0, pid=" in out and "hi there from rank 0 of 2" in out
    assert "(worker1, rank=1, pid=" in out and "hi there from rank 1 of 2" in out
    assert "(setup worker1, rank=1" in out and "setting up rank 1" in out
    assert "run exit codes: rank 0: 0, rank 1: 0" in out
    assert "SUCCEEDED" in out
    assert "Traceback" not in out + result.stderr
    assert daemon.processes_with_marker("cli-ok") == []


def test_failed_job_exits_nonzero_naming_the_rank(cli_env, tmp_path: Path):
    (tmp_path / "failing.yaml").write_text(FAILING)
    result = _cli(cli_env, "launch", "-c", "cli-bad", str(tmp_path / "failing.yaml"), "--down", "-y")
    assert result.returncode == 1
    assert "rank 1 failed with exit code 4" in result.stdout
    assert "boom" in result.stdout
    assert "FAILED" in result.stdout
    assert daemon.processes_with_marker("cli-bad") == []


def test_kept_cluster_takes_exec_then_goes_down(cli_env, tmp_path: Path):
    (tmp_path / "probe.yaml").write_text(PROBE)
    launched = _cli(cli_env, "launch", "-c", "cli-kept", str(tmp_path / "probe.yaml"), "-y")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "airflow-sky down cli-kept" in launched.stdout
    try:
        executed = _cli(cli_env, "exec", "cli-kept", str(tmp_path / "probe.yaml"), "--env", "GREETING=again")
        assert executed.returncode == 0, executed.stdout + executed.stderr
        assert "again from rank 1 of 2" in executed.stdout
        assert "setting up" not in executed.stdout  # exec skips setup, like `sky exec`
        assert "Job 2 on cluster cli-kept" in executed.stdout
        status = _cli(cli_env, "status")
        assert "cli-kept" in status.stdout and "UP" in status.stdout
    finally:
        down = _cli(cli_env, "down", "cli-kept")
    assert down.returncode == 0
    assert daemon.processes_with_marker("cli-kept") == []


def test_exec_on_a_missing_cluster_fails_clearly(cli_env, tmp_path: Path):
    (tmp_path / "probe.yaml").write_text(PROBE)
    result = _cli(cli_env, "exec", "no-such-cluster", str(tmp_path / "probe.yaml"))
    assert result.returncode == 1
    assert "cluster 'no-such-cluster' does not exist" in result.stdout


def test_invalid_task_is_one_line_and_exit_two(cli_env, tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("num_nodes: 0\nrun: echo hi\n")
    result = _cli(cli_env, "launch", str(tmp_path / "bad.yaml"), "-y")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "num_nodes" in result.stderr
