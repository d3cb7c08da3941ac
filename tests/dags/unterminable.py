"""Fault injection for test_sky_job_dag.py: a local infra whose terminate fails, as a cloud API outage or
a missing permission would make a real one fail. Everything else is the real local infra."""

from __future__ import annotations

from airflow_sky.errors import ClusterError
from airflow_sky.infra import registry
from airflow_sky.infra.local.cloud import LocalCloud


class UnterminableLocalCloud(LocalCloud):
    def terminate(self, cluster_name: str) -> None:
        raise ClusterError(f"terminating {cluster_name} was refused (fault injected by the test)")


def install() -> None:
    """Make `infra: local` this driver, in this process (an `airflow dags test` runs every task in it)."""
    registry._DRIVERS["local"] = (__name__, UnterminableLocalCloud.__name__, None)
