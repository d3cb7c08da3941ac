"""What the CLI tells a user to do next must not lead astray: the launch an exec suggests keeps every flag,
and an autostop says the idle limit the nodes really apply."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from airflow_sky.client.cli import build_parser
from airflow_sky.client.cli.hints import launch_command
from airflow_sky.client.cli.idle import idle_limit_text


def test_the_suggested_launch_keeps_every_task_flag_quoted_and_no_secret_value():
    exec_argv = ["exec", "hi", "my task.yaml", "--num-nodes", "3", "--gpus", "L4:4", "--no-use-spot"]
    exec_argv += ["--env", "GREETING=hello world", "--env", "MODE", "--env-file", "launch.env"]
    exec_argv += ["--secret", "TOKEN=s3cr3t-value", "--region", "us-east-1", "--git-ref", "v1"]
    args = build_parser().parse_args(exec_argv)
    command = launch_command(args.cluster, args)
    assert "s3cr3t-value" not in command
    assert command.startswith("airflow-sky launch -c hi 'my task.yaml' ")
    # Parsed back, it is a launch of the same file with the same overrides (the secret passed bare).
    again = build_parser().parse_args(shlex.split(command)[1:])
    assert (again.command, again.cluster, again.entrypoint) == ("launch", "hi", ["my task.yaml"])
    overrides = ("infra", "num_nodes", "gpus", "cpus", "use_spot", "region", "git_ref", "env", "env_file")
    assert {k: getattr(again, k) for k in overrides} == {k: getattr(args, k) for k in overrides}
    assert again.secret == ["TOKEN"]


def test_the_idle_limit_printed_is_the_one_the_watchers_apply():
    assert idle_limit_text(5, 60, down=False) == "its nodes stop themselves after 5 idle minutes"
    raised = idle_limit_text(1, 60, down=True)
    assert raised.startswith("its nodes end themselves after 2 idle minutes (-i 1 is raised to the shortest")
    assert "every 60 s" in raised
    assert idle_limit_text(0, 3, down=False).startswith("its nodes stop themselves after 6 idle seconds")


def test_exec_on_a_missing_cluster_suggests_the_launch_with_its_flags(tmp_path: Path):
    task = tmp_path / "t.yaml"
    task.write_text("name: t\nnum_nodes: 3\nrun: echo hi\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    result = subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "exec", "hi-missing", str(task), "--num-nodes", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cluster 'hi-missing' does not exist on local" in result.stderr
    assert f"run `airflow-sky launch -c hi-missing {shlex.quote(str(task))} --num-nodes 3`" in result.stderr
    assert "Traceback" not in result.stderr
