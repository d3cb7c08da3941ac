"""The CLI and SDK load without Airflow: the engine points Airflow at its private home before importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_cli_and_sdk_modules_do_not_import_airflow_before_the_engine_configures_it() -> None:
    code = (
        "import sys, airflow_sky.client.cli, airflow_sky.client.sdk, airflow_sky.client.engine; "
        "[__import__(f'airflow_sky.client.cli.{m}') for m in ('check', 'launch', 'jobs', 'local', 'progress')]; "
        "loaded = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]; "
        "print(loaded[:5]); sys.exit(bool(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
