"""Task specs: `Task`, `Resources`, `JobRecovery`, loaded from SkyPilot-style YAML or built in Python.

Pure (no Airflow import): validation is jsonschema plus a few semantic checks, and every problem is one
`airflow_sky.SpecError` line naming the source, the field path and what is allowed.
"""

from __future__ import annotations

from airflow_sky.errors import SpecError
from airflow_sky.task.diagnostics import SpecWarning
from airflow_sky.task.job_recovery import JobRecovery
from airflow_sky.task.mounts import StorageMount, is_bucket_uri
from airflow_sky.task.overrides import parse_env_args, read_env_file
from airflow_sky.task.resources import Resources, gpus_per_node
from airflow_sky.task.task import GitWorkdir, Task, load_task

__all__ = [
    "GitWorkdir",
    "JobRecovery",
    "Resources",
    "SpecError",
    "SpecWarning",
    "StorageMount",
    "Task",
    "gpus_per_node",
    "is_bucket_uri",
    "load_task",
    "parse_env_args",
    "read_env_file",
]
