"""airflow-sky: SkyPilot-style multi-node jobs as Apache Airflow DAGs."""

from __future__ import annotations

from typing import Any

from airflow_sky.errors import ClusterError, JobFailed, RemoteError, SkyError, SpecError

__version__ = "0.1.0"

# Airflow-dependent entry points load lazily so that `airflow_sky.Task` works without importing Airflow.
_LAZY = {
    "Task": "airflow_sky.task",
    "Resources": "airflow_sky.task",
    "JobRecovery": "airflow_sky.task",
    "sky_job": "airflow_sky.dags.job",
    "dag_from_yaml": "airflow_sky.dags.from_yaml",
    "job_result": "airflow_sky.dags.job",
    "dags_from_folder": "airflow_sky.dags.folder",
    "Pipeline": "airflow_sky.task.pipeline",
    "load_pipeline": "airflow_sky.task.pipeline",
    "sky_pipeline": "airflow_sky.dags.pipeline",
    "sky_result": "airflow_sky.dags.results",
    "sky_sweep": "airflow_sky.dags.sweep",
    "sweep_results": "airflow_sky.dags.sweep",
    "best_trial": "airflow_sky.dags.sweep",
    # The SDK, mirroring SkyPilot's sky.launch / sky.exec / ...
    "launch": "airflow_sky.client.sdk",
    "exec": "airflow_sky.client.sdk",
    "tail_logs": "airflow_sky.client.sdk",
    "tail_provision_logs": "airflow_sky.client.sdk",
    "job_status": "airflow_sky.client.sdk",
    "job_progress": "airflow_sky.client.sdk",
    "queue": "airflow_sky.client.sdk",
    "cancel": "airflow_sky.client.sdk",
    "down": "airflow_sky.client.sdk",
    "status": "airflow_sky.client.sdk",
    "endpoints": "airflow_sky.client.sdk",
}

__all__ = ["ClusterError", "JobFailed", "RemoteError", "SkyError", "SpecError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_sky' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
