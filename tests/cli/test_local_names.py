"""`local up/ls/preempt/down` take cluster names as every other command does: a name SkyPilot accepts that is
no host name label here (`Exec-E`) is used as one (`exec-e`), so `exec`/`down` of the same name find it
(`local up Exec-E` once made a cluster that `down Exec-E` could not find)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_sky.infra.local import daemon

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


def test_local_up_and_down_map_a_name_as_the_other_commands_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_SKY_HOME=str(tmp_path / "sky"), AIRFLOW_SKY_SSH_CONFIG=str(tmp_path / "ssh_config"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)

    up = cli("local", "up", "Names-Upper", "--nodes", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "is named 'names-upper' here" in up.stderr
    assert "names-upper" in cli("local", "ls", "Names-Upper").stdout
    down = cli("down", "Names-Upper", "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Cluster names-upper terminated." in down.stdout
    assert daemon.processes_with_marker("names-upper") == []
