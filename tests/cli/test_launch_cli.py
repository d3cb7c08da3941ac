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


SNOOP = """\
name: snoop
num_nodes: 2
secrets:
  TASK_SECRET: null
run: |
  env
  echo "the secret is $TASK_SECRET"
  [ "$SKYPILOT_NODE_RANK" = 1 ] && { echo "failing with $TASK_SECRET"; exit 3; }
  sleep 30
"""

# What an Airflow worker's (or a developer's) shell holds: nothing of it may reach a node.
LAUNCHER_CREDENTIALS = {
    "AIRFLOW__CORE__FERNET_KEY": "fernet-of-the-launcher",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://etl:conn-password-of-the-launcher@db:5432/dw",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-of-the-launcher",
}


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIRFLOW_HOME", None)
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("cli-airflow"))
    home = tmp_path_factory.mktemp("sky-home")
    env["AIRFLOW_SKY_HOME"] = str(home)
    env["AIRFLOW_SKY_SSH_CONFIG"] = str(home / "ssh_config")
    return env


def ssh_entries(env: dict[str, str], cluster: str) -> list[Path]:
    return sorted((Path(env["AIRFLOW_SKY_HOME"]) / "ssh").glob(f"{cluster}.*"))


def launch_log(output: str) -> str:
    """The launch's Airflow log (the task logs of the DAG run), named in the CLI's summary."""
    marker = "Airflow log of this launch: "
    path = output.split(marker, 1)[1].split()[0] if marker in output else ""
    return Path(path).read_text() if path and Path(path).is_file() else ""


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
    assert ssh_entries(cli_env, "cli-ok") == []  # --down leaves no ssh entry to a cluster that is gone
    log = launch_log(out)
    assert "Tearing down cluster cli-ok" in log
    errors = [line for line in log.splitlines() if "[error" in line.lower() or " ERROR " in line]
    assert errors == [], "a healthy run logged errors:\n" + "\n".join(errors)


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
    assert ssh_entries(cli_env, "cli-kept") == []


def test_local_down_removes_the_ssh_entries_too(cli_env, tmp_path: Path):
    (tmp_path / "one.yaml").write_text("name: one\nrun: echo one\n")
    launched = _cli(cli_env, "launch", "-c", "cli-local-down", str(tmp_path / "one.yaml"), "-y")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert ssh_entries(cli_env, "cli-local-down") != []
    assert _cli(cli_env, "local", "down", "cli-local-down").returncode == 0
    assert ssh_entries(cli_env, "cli-local-down") == []
    home = tmp_path / "home"  # a user's home: `down` imports the SSH hook, and must not create ~/airflow
    home.mkdir()
    gone = _cli({**cli_env, "HOME": str(home)}, "down", "cli-local-down")
    assert gone.returncode == 1 and "not found" in gone.stdout + gone.stderr
    assert not (home / "airflow").exists()


def test_nothing_of_the_launchers_environment_reaches_a_node_and_the_secret_is_masked(
    cli_env, tmp_path: Path
):
    (tmp_path / "snoop.yaml").write_text(SNOOP)
    env = {**cli_env, **LAUNCHER_CREDENTIALS}
    result = _cli(
        env,
        "launch",
        "-c",
        "cli-snoop",
        str(tmp_path / "snoop.yaml"),
        "--env",
        "TASK_SECRET=tsk-s3cr3t",
        "--down",
        "-y",
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "the secret is ***" in out and "HOME=" in out  # both nodes printed their env
    for value in LAUNCHER_CREDENTIALS.values():
        assert value.split("@")[0].rsplit(":", 1)[-1] not in out
    log = launch_log(result.stdout)
    assert "failing with ***" in out  # the failure tail shown for rank 1 is masked too
    assert "tsk-s3cr3t" not in out and log and "tsk-s3cr3t" not in log
    assert daemon.processes_with_marker("cli-snoop") == []


def test_unknown_infra_and_an_exec_that_needs_more_nodes_are_refused_before_any_work(cli_env, tmp_path: Path):
    (tmp_path / "one.yaml").write_text("name: one\nrun: echo one\n")
    # No AWS credentials anywhere (the connection, the environment, ~/.aws, an instance role).
    no_aws = {k: v for k, v in cli_env.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_AWS"))}
    no_aws.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "none.json"),
        NO_GCE_CHECK="True",
    )
    no_google = {
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": '{"conn_type": "google_cloud_platform", "extra": {"project": "p"}}'
    }
    refusals = (
        ("locl", "unsupported cloud"),
        ("aws", "aws: no AWS credentials"),
        ("gcp", "gcp: no usable Google credentials"),
    )
    for infra, reason in refusals:
        refused = _cli(
            no_aws | no_google,
            "launch",
            "-c",
            "cli-noinfra",
            str(tmp_path / "one.yaml"),
            "--infra",
            infra,
            "-y",
        )
        assert refused.returncode != 0 and "Provisioning" not in refused.stdout
        assert reason in refused.stdout + refused.stderr
    missing = _cli(cli_env, "exec", "cli-nowhere", str(tmp_path / "one.yaml"))
    assert missing.returncode == 1 and "Provisioning" not in missing.stdout


def test_exec_on_a_missing_cluster_fails_clearly(cli_env, tmp_path: Path):
    (tmp_path / "probe.yaml").write_text(PROBE)
    result = _cli(cli_env, "exec", "no-such-cluster", str(tmp_path / "probe.yaml"))
    assert result.returncode == 1
    assert "cluster 'no-such-cluster' does not exist" in result.stdout + result.stderr
    assert "airflow-sky launch -c no-such-cluster" in result.stdout + result.stderr


def test_invalid_task_is_one_line_and_exit_two(cli_env, tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("num_nodes: 0\nrun: echo hi\n")
    result = _cli(cli_env, "launch", str(tmp_path / "bad.yaml"), "-y")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "num_nodes" in result.stderr


def test_sdk_launch_from_a_process_running_airflow_never_writes_into_its_dags_folder(cli_env, tmp_path: Path):
    # What a PythonOperator calling airflow_sky.launch looks like: Airflow imported, bound to its own home.
    user_home = tmp_path / "user-airflow"
    (user_home / "dags").mkdir(parents=True)
    script = tmp_path / "from_a_task.py"
    script.write_text(
        "import airflow.configuration\n"
        "import airflow_sky as sky\n"
        "task = sky.Task(name='inner', run='echo inner says hi from $SKYPILOT_NODE_RANK')\n"
        "job_id, handle = sky.launch(task, cluster_name='cli-inner', down=True)\n"
        "print('STATUS', job_id, 'done')\n"
    )
    env = {**cli_env, "AIRFLOW_HOME": str(user_home), "AIRFLOW__CORE__DAGS_FOLDER": str(user_home / "dags")}
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "inner says hi from 0" in result.stdout and "STATUS 1 done" in result.stdout
    assert list((user_home / "dags").iterdir()) == []  # no launch DAG in the caller's dags folder
    assert not (user_home / "airflow.db").exists() or "sky_launch" not in (
        user_home / "airflow.db"
    ).read_bytes().decode(errors="replace")
    assert daemon.processes_with_marker("cli-inner") == []
