"""sky's everyday `launch`/`exec` forms, through the real CLI on real local nodes: a command as the task,
no entrypoint (provision only), `-n/--name`, `--workdir`, `--ports`; and the entrypoint rules themselves.

One kept cluster serves the module (provisioned by the no-entrypoint launch) and goes down at its end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.infra.local import daemon
from airflow_sky.task.entrypoint import (
    COMMAND_TASK_NAME,
    Entrypoint,
    apply_entrypoint_overrides,
    command_task,
    parse_entrypoint,
)

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
CLUSTER = "forms"


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIRFLOW_HOME", None)
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("forms-airflow"))
    home = tmp_path_factory.mktemp("forms-home")
    env["AIRFLOW_SKY_HOME"] = str(home)
    env["AIRFLOW_SKY_SSH_CONFIG"] = str(home / "ssh_config")
    return env


def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if not line.startswith("@@airflow-sky-progress")]


@pytest.fixture(scope="module")
def cluster(cli_env: dict[str, str]) -> Iterator[str]:
    """The module's cluster, provisioned by `launch -c C` with no YAML and no command."""
    up = _cli(cli_env, "launch", "-c", CLUSTER, "-y")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield CLUSTER
    finally:
        down = _cli(cli_env, "down", CLUSTER, "-y")
        assert down.returncode == 0, down.stdout + down.stderr
        assert daemon.processes_with_marker(CLUSTER) == [], "the cluster's node processes were left behind"


def test_launch_with_no_entrypoint_provisions_the_cluster_and_runs_nothing(
    cli_env: dict[str, str], cluster: str
) -> None:
    status = _cli(cli_env, "status", cluster)
    assert status.returncode == 0 and "UP" in status.stdout, status.stdout + status.stderr
    again = _cli(cli_env, "launch", "-c", cluster, "-y")  # reuses it, as `sky launch -c C` does
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"✓ Cluster {cluster} is up: 1 node" in again.stdout
    assert "nothing run (no YAML or command given)" in again.stdout
    assert "Summary" not in again.stdout  # no job summary: there was no job to run
    assert "Job " not in again.stdout and "Launching the run" not in again.stdout, again.stdout
    queue = _cli(cli_env, "queue", cluster)  # as sky's: a launch that ran nothing is no job in the queue
    assert queue.returncode == 0 and f"Job queue of {cluster}: no jobs." in queue.stdout, queue.stdout


def test_exec_runs_a_command_on_the_kept_cluster(cli_env: dict[str, str], cluster: str) -> None:
    quoted = _cli(cli_env, "exec", cluster, 'echo "exec says $((6 * 7)) on rank $SKYPILOT_NODE_RANK"')
    assert quoted.returncode == 0, quoted.stdout + quoted.stderr
    assert any(line.endswith("exec says 42 on rank 0") for line in _lines(quoted)), quoted.stdout
    assert "Command to run: echo " in quoted.stdout  # what the words were taken for, as sky says
    # Unquoted words are one command, as sky joins them.
    words = _cli(cli_env, "exec", cluster, "echo", "one", "two")
    assert words.returncode == 0, words.stdout + words.stderr
    assert any(line.endswith(" one two") for line in _lines(words)), words.stdout
    queue = _cli(cli_env, "queue", cluster)
    assert COMMAND_TASK_NAME in queue.stdout, queue.stdout


def test_launch_runs_a_command_with_name_workdir_and_ports(
    cli_env: dict[str, str], cluster: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "data.txt").write_text("from the workdir\n")
    result = _cli(
        cli_env,
        *("launch", "-c", cluster, "-y", "-n", "greeter", "--workdir", "code", "--ports", "8080"),
        *("--env", "WHO=sky user", 'echo "hi $WHO: $(cat data.txt)"'),
        cwd=tmp_path,  # --workdir is relative to where the command is typed
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Command to run: " in result.stdout
    assert any(line.endswith("hi sky user: from the workdir") for line in _lines(result)), result.stdout
    queue = _cli(cli_env, "queue", cluster)
    assert "greeter" in queue.stdout, queue.stdout
    endpoints = _cli(cli_env, "status", "--endpoints", cluster)
    assert "8080:" in endpoints.stdout, endpoints.stdout + endpoints.stderr


def test_a_missing_yaml_and_bad_flags_are_one_clear_error_each(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    cases = [
        (("launch", "-c", "nowhere", "-y", "x.yaml"), "x.yaml: no such task YAML"),
        (("exec", "nowhere", str(tmp_path / "gone.yml")), "gone.yml: no such task YAML"),
        (("launch", "-c", "nowhere", "-y", "--ports", "99999", "echo"), "--ports 99999: must be a port"),
        (("launch", "-c", "nowhere", "-y", "-n", "no spaces", "echo"), "-n/--name 'no spaces': must be"),
        (
            ("launch", "-c", "nowhere", "-y", "--workdir", "absent", "echo"),
            "--workdir absent: not an existing",
        ),
        (("launch", "-c", "nowhere", "-y", "--down"), "--down: with no YAML or command"),
    ]
    for args, message in cases:
        result = _cli(cli_env, *args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        (line,) = result.stderr.strip().splitlines()  # one line, no traceback
        assert line.startswith("airflow-sky: error: ") and message in line, (args, line)
    status = _cli(cli_env, "status")
    assert status.returncode == 0 and "nowhere" not in status.stdout  # nothing was launched


def test_the_entrypoint_is_a_yaml_only_when_it_names_a_task_file(tmp_path: Path) -> None:
    task_file = tmp_path / "task.yaml"
    task_file.write_text("name: t\nrun: echo\n")
    no_suffix = tmp_path / "task"
    no_suffix.write_text("run: echo from a file without .yaml\n")
    script = tmp_path / "run.sh"
    script.write_text("echo a script\n")
    assert parse_entrypoint([str(task_file)]) == Entrypoint(yaml_path=str(task_file))
    assert parse_entrypoint([str(no_suffix)]) == Entrypoint(yaml_path=str(no_suffix))
    assert parse_entrypoint([str(script)]) == Entrypoint(command=str(script))  # a script runs, as in sky
    assert parse_entrypoint(["python", "train.py", "--config", "a.yaml"]).command == (
        "python train.py --config a.yaml"
    )
    assert parse_entrypoint([]) == Entrypoint()
    with pytest.raises(SpecError, match=r"^missing\.yml: no such task YAML"):
        parse_entrypoint(["missing.yml"])


def test_a_command_task_is_normalized_as_its_yaml_would_be(tmp_path: Path) -> None:
    from airflow_sky.task import Task

    task = command_task("echo $X", env_overrides={"X": "1"})
    assert task.to_dict() == Task.from_yaml_str("name: sky-cmd\nrun: echo $X\nenvs:\n  X: '1'\n").to_dict()
    assert command_task(None).run is None
    apply_entrypoint_overrides(task, name="renamed", workdir=str(tmp_path), ports=["8080", "9000-9010"])
    assert (task.name, task.workdir, task.resources.ports) == (
        "renamed",
        str(tmp_path),
        ("8080", "9000-9010"),
    )
    apply_entrypoint_overrides(task, ports=["none"])
    assert task.resources.ports is None
