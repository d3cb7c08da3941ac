"""Real Airflow for DAG tests: a private AIRFLOW_HOME (migrated once per session) and `airflow dags test`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

AIRFLOW = str(Path(sys.executable).parent / "airflow")
ERROR_LINE = re.compile(r"\[error\s*\]|^Traceback \(most recent call last\)")


@dataclasses.dataclass
class DagRunResult:
    returncode: int
    output: str
    seconds: float

    @property
    def digest(self) -> str:
        """What an assertion message should show: the first error of the run (the task that failed first,
        which the tail of a long run no longer holds) and the run's last lines."""
        lines = self.output.splitlines()
        first = next((i for i, line in enumerate(lines) if ERROR_LINE.search(line)), None)
        head = "" if first is None else "\n".join(lines[max(0, first - 5) : first + 60]) + "\n[...]\n"
        return head + "\n".join(lines[-60:])


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        }
    )
    migrate = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return env


@pytest.fixture
def run_dag(airflow_home: dict[str, str]) -> Callable[[str, str], DagRunResult]:
    """Write a DAG file and run it with `airflow dags test`; returns exit code, output and duration."""
    dags = Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"])

    def run(
        dag_id: str,
        source: str,
        timeout: float = 600,
        env: dict[str, str] | None = None,
        conf: dict[str, object] | None = None,
        logical_date: str | None = None,
    ) -> DagRunResult:
        for old in dags.glob("*.py"):
            old.unlink()
        (dags / f"{dag_id}.py").write_text(textwrap.dedent(source))
        started = time.monotonic()
        proc = subprocess.run(
            [
                AIRFLOW,
                "dags",
                "test",
                dag_id,
                *([logical_date] if logical_date else []),
                *(["--conf", json.dumps(conf)] if conf is not None else []),
            ],
            env={**airflow_home, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return DagRunResult(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)

    return run
