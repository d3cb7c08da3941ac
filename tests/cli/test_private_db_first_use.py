"""Several CLI processes starting at once in a fresh home share one private Airflow DB: its first migration
must happen once, not race (four concurrent `launch`es failed with "table team already exists")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PREPARE = "from airflow_sky.client.engine import prepare_airflow; print(prepare_airflow())"


def test_concurrent_first_uses_of_a_fresh_home_migrate_its_db_once_and_all_succeed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_SKY_HOME"] = str(tmp_path / "sky")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PREPARE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=500)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], "\n---\n".join(outputs)
    assert (tmp_path / "sky" / "airflow" / ".migrated").exists()
