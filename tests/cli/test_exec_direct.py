"""`airflow-sky exec` on a kept cluster runs without an Airflow DAG run (client/exec_direct.py): no Airflow
is imported, and the job is the same job as before for `queue`, `logs`, exit codes and recovery. One 2-node
local cluster (`local up`) serves the module; the CLI runs as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
CLUSTER = "exec-direct"

# The command through main(), then which Airflow modules it left loaded (as tests/cli/test_cli_imports.py).
_RUN_AND_REPORT = """
import json, sys
from airflow_sky.client.cli import main
code = main(sys.argv[1:])
print("AIRFLOW=" + json.dumps(sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow."))[:5]))
sys.exit(code)
"""

RECOVERING = """\
name: recovers
num_nodes: 2
resources:
  job_recovery:
    recover_on_exit_codes: [3]
run: |
  if [ "$SKYPILOT_NODE_RANK" = 1 ] && [ ! -e ~/.exec-direct-failed-once ]; then
    touch ~/.exec-direct-failed-once
    echo "rank 1 fails once"
    exit 3
  fi
  echo "done on $SKYPILOT_NODE_RANK"
"""


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_") and k != "AIRFLOW_HOME"}
    home = tmp_path_factory.mktemp("sky-home")
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("cli-airflow"))
    env["AIRFLOW_SKY_HOME"] = str(home)
    env["AIRFLOW_SKY_SSH_CONFIG"] = str(home / "ssh_config")
    up = cli(env, "local", "up", CLUSTER, "--nodes", "2")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield env
    finally:
        cli(env, "down", CLUSTER, "-y")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_one_line_exec_imports_no_airflow_and_its_job_is_in_queue_and_logs(
    env: dict[str, str], tmp_path: Path
) -> None:
    task = write(tmp_path, "two.yaml", 'num_nodes: 2\nrun: echo "hello from $SKYPILOT_NODE_RANK"\n')
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, "exec", CLUSTER, task],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hello from 0" in result.stdout and "hello from 1" in result.stdout
    assert "run exit codes: rank 0: 0, rank 1: 0" in result.stdout
    loaded = json.loads(result.stdout.split("AIRFLOW=", 1)[1].splitlines()[0])
    assert loaded == [], f"exec on a kept cluster imported Airflow: {loaded}"
    job_id = result.stdout.split("Job ", 1)[1].split()[0]
    queue = cli(env, "queue", CLUSTER)
    assert any(line.split()[1:2] == [job_id] and "SUCCEEDED" in line for line in queue.stdout.splitlines()), (
        queue.stdout
    )
    logs = cli(env, "logs", CLUSTER, job_id)
    assert logs.returncode == 0 and "hello from 1" in logs.stdout, logs.stdout + logs.stderr


def test_a_failing_rank_fails_the_exec_with_its_exit_code_and_the_other_rank_killed(
    env: dict[str, str], tmp_path: Path
) -> None:
    task = write(
        tmp_path,
        "fails.yaml",
        'num_nodes: 2\nrun: |\n  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then exit 4; fi\n  sleep 600\n',
    )
    result = cli(env, "exec", CLUSTER, task)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "run exit codes: rank 0: 137, rank 1: 4" in result.stdout, result.stdout
    job_id = result.stdout.split("Job ", 1)[1].split()[0]
    status = cli(env, "logs", "--status", CLUSTER, job_id)
    assert "FAILED" in status.stdout, status.stdout + status.stderr


def test_an_exit_code_the_task_recovers_on_relaunches_the_job_and_it_succeeds(
    env: dict[str, str], tmp_path: Path
) -> None:
    result = cli(env, "exec", CLUSTER, write(tmp_path, "recovers.yaml", RECOVERING))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1 fails once" in result.stdout
    assert "done on 0" in result.stdout and "done on 1" in result.stdout
    job_id = result.stdout.split("Job ", 1)[1].split()[0]
    assert "SUCCEEDED" in cli(env, "logs", "--status", CLUSTER, job_id).stdout


PREEMPTED = """\
name: preempted
num_nodes: 2
setup: echo "set up on $SKYPILOT_SETUP_NODE_RANK"
run: |
  echo "up on $SKYPILOT_NODE_RANK gen $AIRFLOW_SKY_RECOVERY_COUNT"
  if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 600; fi
  echo "finished on $SKYPILOT_NODE_RANK"
"""


def test_a_preempted_node_is_replaced_and_its_setup_lines_reach_the_terminal(
    env: dict[str, str], tmp_path: Path
) -> None:
    """exec runs no setup on the kept nodes, but a replacement node is new: its setup runs, and its lines
    are shown as the DAG run's live view shows them (they once went to the exec's log file only)."""
    proc = subprocess.Popen(
        [*CLI, "exec", CLUSTER, write(tmp_path, "preempted.yaml", PREEMPTED)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not any("up on 1 gen 0" in line for line in seen[:]):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("rank 1 never started generation 0:\n" + "".join(seen[:]))
        time.sleep(0.2)
    preempted = cli(env, "local", "preempt", CLUSTER, "1")
    assert preempted.returncode == 0, preempted.stdout + preempted.stderr
    try:
        proc.wait(timeout=300)
    finally:
        proc.kill()
    reader.join(timeout=30)
    out = "".join(seen)
    assert proc.returncode == 0, out
    after = out.split("up on 1 gen 0", 1)[1]
    assert "(setup worker1, rank=1, " in after and "set up on 1" in after, out
    assert "finished on 0" in after and "finished on 1" in after, out
