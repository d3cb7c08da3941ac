"""Fixtures for the spec, env and `check` CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SPEC_DIR = Path(__file__).parent
REPO_ROOT = SPEC_DIR.parent.parent
VALID_DIR = SPEC_DIR / "valid"
INVALID_DIR = SPEC_DIR / "invalid"

# Runs the real CLI entry point (airflow_sky.client.cli.main) in a child process, from the repo root, so it
# works whether or not the package is pip-installed.
_CLI = "import sys; from airflow_sky.client.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        return subprocess.run(
            [sys.executable, "-c", _CLI, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run
