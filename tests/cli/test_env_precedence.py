"""Launch-time values as `sky launch` merges them: `--env` beats `--env-file` beats the task file, and
`--secret` beats `--secret-file`; a task and a pipeline alike. Real `airflow-sky check` in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TASK = """\
envs:
  ONLY_YAML: yaml
  YAML_AND_FILE: yaml
  ALL_THREE: yaml
secrets:
  TOKEN: null
run: echo
"""
PIPELINE = """\
name: two
---
name: first
envs:
  ALL_THREE: yaml
run: echo
---
name: second
run: echo
"""


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "check", *args, "--show-secrets"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _files(tmp_path: Path) -> tuple[Path, Path]:
    env_file = tmp_path / "launch.env"
    env_file.write_text("YAML_AND_FILE=file\nALL_THREE=file\nONLY_FILE=file\n")
    secret_file = tmp_path / "secrets.env"
    secret_file.write_text("TOKEN=from-the-file\nOTHER=file-secret\n")
    return env_file, secret_file


def _flags(env_file: Path, secret_file: Path, *, files_first: bool) -> list[str]:
    files = ["--env-file", str(env_file), "--secret-file", str(secret_file)]
    flags = ["--env", "ALL_THREE=flag", "--secret", "TOKEN=from-the-flag"]
    return [*files, *flags] if files_first else [*flags, *files]


@pytest.mark.parametrize(("text", "files_first"), [(TASK, False), (PIPELINE, True)], ids=["task", "pipeline"])
def test_env_flag_beats_env_file_beats_the_task_file_and_secret_flag_beats_secret_file(
    tmp_path: Path, text: str, files_first: bool
):
    path = tmp_path / "task.yaml"
    path.write_text(text)
    env_file, secret_file = _files(tmp_path)
    # Files before or after the flags on the command line: the order does not matter.
    result = _check(str(path), *_flags(env_file, secret_file, files_first=files_first))
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    tasks = documents[1:] if text == PIPELINE else documents  # a pipeline's first document is its header
    assert len(tasks) == (2 if text == PIPELINE else 1)
    for task in tasks:
        assert task["envs"]["ALL_THREE"] == "flag"
        assert task["envs"]["ONLY_FILE"] == "file"
        assert task["secrets"] == {"TOKEN": "from-the-flag", "OTHER": "file-secret"}
    if text == TASK:
        assert tasks[0]["envs"] == {
            "ONLY_YAML": "yaml",
            "YAML_AND_FILE": "file",
            "ALL_THREE": "flag",
            "ONLY_FILE": "file",
        }
