"""`--git-url`/`--git-ref` on launch, exec and jobs launch, as `sky launch` takes them, and GIT_TOKEN from the
launching shell's environment; one launch clones a private repository served on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.client.cli import build_parser, main
from airflow_sky.client.cli.common import git_credentials_from_environment
from airflow_sky.client.cli.launch import task_with_overrides
from airflow_sky.errors import SpecError
from airflow_sky.infra.local import daemon
from airflow_sky.task import GitWorkdir, Task
from tests.gitserver import serve_repo

TOKEN = "cli-token-93e1-never-shown"


def _task(tmp_path: Path, yaml: str, *flags: str, command: str = "launch") -> Task:
    (tmp_path / "task.yaml").write_text(yaml)
    words = ["jobs", "launch"] if command == "jobs" else [command, *(["c1"] if command == "exec" else [])]
    args = build_parser().parse_args([*words, str(tmp_path / "task.yaml"), *flags])
    return task_with_overrides(args)


@pytest.mark.parametrize("command", ["launch", "exec", "jobs"])
def test_git_url_and_ref_set_the_workdir_on_every_launching_command(tmp_path: Path, command: str):
    task = _task(
        tmp_path, "run: echo hi\n", "--git-url", "https://h/o/r.git", "--git-ref", "v2", command=command
    )
    assert task.workdir == GitWorkdir("https://h/o/r.git", "v2")


def test_the_flags_override_the_yaml_as_sky_launch_does(tmp_path: Path):
    git_yaml = "workdir: {url: https://h/o/r.git, ref: main}\nrun: echo hi\n"
    assert _task(tmp_path, git_yaml, "--git-ref", "dev").workdir == GitWorkdir("https://h/o/r.git", "dev")
    # A new URL keeps the YAML's ref unless one is given too (SkyPilot's Task.update_workdir).
    assert _task(tmp_path, git_yaml, "--git-url", "https://h/o/fork.git").workdir == GitWorkdir(
        "https://h/o/fork.git", "main"
    )
    local = f"workdir: {tmp_path}\nrun: echo hi\n"
    assert _task(tmp_path, local, "--git-url", "https://h/o/r.git").workdir == GitWorkdir("https://h/o/r.git")
    assert _task(tmp_path, git_yaml).workdir == GitWorkdir("https://h/o/r.git", "main")


def test_a_ref_without_a_repository_is_a_clear_usage_error(tmp_path: Path, capsys):
    (tmp_path / "task.yaml").write_text("run: echo hi\n")
    assert main(["launch", str(tmp_path / "task.yaml"), "--git-ref", "dev", "--dryrun"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("airflow-sky: error: --git-ref dev: the task has no workdir")
    assert "give --git-url URL too" in err
    with pytest.raises(SpecError, match="the task has a local workdir"):
        _task(tmp_path, f"workdir: {tmp_path}\nrun: echo hi\n", "--git-ref", "dev")


def test_git_token_becomes_a_secret_from_the_yaml_envs_or_the_launching_shell(tmp_path: Path):
    url = "https://h/o/r.git"
    from_envs = Task(run="true", workdir={"url": url}, envs={"GIT_TOKEN": "a"})
    git_credentials_from_environment(from_envs, {"GIT_TOKEN": "ignored"}, key_path=True)
    assert from_envs.secrets == {"GIT_TOKEN": "a"} and "GIT_TOKEN" not in from_envs.envs
    from_shell = Task(run="true", workdir={"url": url})
    git_credentials_from_environment(from_shell, {"GIT_TOKEN": "b"}, key_path=True)
    assert from_shell.secrets == {"GIT_TOKEN": "b"}
    not_git = Task(run="true")
    git_credentials_from_environment(not_git, {"GIT_TOKEN": "c"}, key_path=True)
    assert not_git.secrets == {}
    ssh = Task(run="true", workdir={"url": "git@h:o/r.git"})
    git_credentials_from_environment(ssh, {"GIT_TOKEN": "d", "GIT_SSH_KEY_PATH": "/k"}, key_path=False)
    assert ssh.secrets == {} and ssh.envs == {}  # a managed job's workers do not have this machine's key
    git_credentials_from_environment(ssh, {"GIT_SSH_KEY_PATH": "/k"}, key_path=True)
    assert ssh.envs == {"GIT_SSH_KEY_PATH": "/k"}


def test_launch_clones_a_private_repository_with_the_shells_git_token(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_HOME"}
    env.update(
        {
            "AIRFLOW_SKY_AIRFLOW_HOME": str(tmp_path / "airflow"),
            "AIRFLOW_SKY_HOME": str(tmp_path / "sky-home"),
            "AIRFLOW_SKY_SSH_CONFIG": str(tmp_path / "ssh_config"),
        }
    )
    (tmp_path / "task.yaml").write_text(
        "name: gitcli\nnum_nodes: 2\nrun: cat model.txt; git rev-parse HEAD\n"
    )
    with serve_repo(tmp_path / "git", token=TOKEN) as repo:
        repo.commit({"model.txt": "main model\n"})
        dev = repo.commit({"model.txt": "dev model\n"}, branch="dev")
        base = [sys.executable, "-m", "airflow_sky.client.cli", "launch", str(tmp_path / "task.yaml")]
        refused = subprocess.run(
            [*base, "--git-url", repo.url, "--git-ref", "nope", "-y"],
            env={**env, "GIT_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=300,
        )
        result = subprocess.run(
            [*base, "-c", "gitcli", "--git-url", repo.url, "--git-ref", "dev", "--down", "-y"],
            env={**env, "GIT_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=600,
        )
    # A ref the repository lacks fails before any node exists.
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().startswith("airflow-sky: error: workdir.ref: 'nope' is no branch or tag")
    assert "Provisioning nodes" not in refused.stdout and refused.stdout.strip() == ""
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count("dev model") == 2 and out.count(dev) >= 2
    assert TOKEN not in out
    assert daemon.processes_with_marker("gitcli") == []
