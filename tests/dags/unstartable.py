"""Fault injection for test_sky_job_dag.py: the run cannot start on rank 1 (as an SSH session that breaks
mid-start would make it fail), after rank 0 started. Everything else is the real local infra."""

from __future__ import annotations

from typing import Any

from airflow_sky.errors import RemoteError
from airflow_sky.gang import phases


def install() -> None:
    """Make starting rank 1's run fail, in this process (an `airflow dags test` runs every task in it)."""
    real_start = phases.start_rank

    def start_rank(cluster: Any, task: Any, handle: Any, phase: Any, rank: int) -> Any:
        if phase == "run" and rank == 1:
            raise RemoteError("starting the run on rank 1 failed (fault injected by the test)")
        return real_start(cluster, task, handle, phase, rank)

    phases.start_rank = start_rank  # type: ignore[assignment]
