"""airflow-sky: SkyPilot-style multi-node jobs as Apache Airflow DAGs."""

from __future__ import annotations

from typing import Any

from airflow_sky.errors import ClusterError, JobFailed, RemoteError, SkyError, SpecError

__version__ = "0.1.0"

# Airflow-dependent entry points load lazily so that `airflow_sky.Task` works without importing Airflow.
_LAZY = {
    "Task": "airflow_sky.spec",
    "Resources": "airflow_sky.spec",
    "JobRecovery": "airflow_sky.spec",
    "sky_job": "airflow_sky.dag",
    "dag_from_yaml": "airflow_sky.dag",
    "job_result": "airflow_sky.dag",
    "dags_from_folder": "airflow_sky.folder",
    # The SDK, mirroring SkyPilot's sky.launch / sky.exec / ...
    "launch": "airflow_sky.sdk",
    "exec": "airflow_sky.sdk",
    "tail_logs": "airflow_sky.sdk",
    "job_status": "airflow_sky.sdk",
    "queue": "airflow_sky.sdk",
    "cancel": "airflow_sky.sdk",
    "down": "airflow_sky.sdk",
    "status": "airflow_sky.sdk",
}

__all__ = ["ClusterError", "JobFailed", "RemoteError", "SkyError", "SpecError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_sky' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
