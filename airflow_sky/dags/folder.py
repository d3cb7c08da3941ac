"""Every task YAML in a folder as a DAG: `dags_from_folder(path)` in one DAG file.

    tasks/
      train.yaml          a SkyPilot task (unchanged)
      train.dag.yaml      optional sidecar: how to schedule it (see SIDECAR_SCHEMA)
      eval.yaml

A broken task or sidecar does not stop the others from loading: it is reported as a DAG import warning
attributed to the YAML file itself, with the one-line SpecError (file, field, rule).
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pendulum
import yaml

from airflow_sky.errors import SkyError, SpecError

SIDECAR_SUFFIX = ".dag.yaml"

SIDECAR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "dag_id": {"type": "string", "pattern": "^[a-zA-Z0-9_.-]+$"},
        "description": {"type": "string"},
        "schedule": {"type": ["string", "null"]},
        "start_date": {"type": "string"},
        "catchup": {"type": "boolean"},
        "max_active_runs": {"type": "integer", "minimum": 1},
        "retries": {"type": "integer", "minimum": 0},
        "retry_delay_minutes": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "infra": {"type": "string"},
        "cluster_name": {"type": "string"},
        "down": {"type": "boolean"},
        "max_recoveries": {"type": "integer", "minimum": 0},
        "artifacts": {"type": "array", "items": {"type": "string"}},
        "artifacts_to": {"type": "string"},
        "artifacts_from": {"enum": ["head", "all"]},
        "envs": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
    },
}


class SkyFolderWarning(UserWarning):
    """A task YAML (or its sidecar) in a dags_from_folder folder could not become a DAG."""


def read_sidecar(path: Path) -> dict[str, Any]:
    """The sidecar's settings, validated; a SpecError names the file and the field."""
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"{path.name}: invalid YAML: {e}") from e
    try:
        jsonschema.validate(data, SIDECAR_SCHEMA)
    except jsonschema.ValidationError as e:
        field = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        allowed = ", ".join(sorted(SIDECAR_SCHEMA["properties"]))
        raise SpecError(f"{path.name}: {field}: {e.message} (allowed fields: {allowed})") from e
    return dict(data)


def _dag_kwargs(settings: dict[str, Any], default_id: str) -> dict[str, Any]:
    default_args: dict[str, Any] = {}
    if "retries" in settings:
        default_args["retries"] = settings["retries"]
    if "retry_delay_minutes" in settings:
        default_args["retry_delay"] = timedelta(minutes=settings["retry_delay_minutes"])
    start = settings.get("start_date")
    return {
        "dag_id": settings.get("dag_id", default_id),
        "description": settings.get("description"),
        "schedule": settings.get("schedule"),
        "start_date": pendulum.parse(start) if start else pendulum.datetime(2026, 1, 1, tz="UTC"),
        "catchup": settings.get("catchup", False),
        "max_active_runs": settings.get("max_active_runs", 1),
        "tags": settings.get("tags", ["airflow-sky"]),
        "default_args": default_args,
    }


def dag_from_task_file(path: Path) -> Any:
    """One task YAML (with its sidecar) as a DAG; raises SpecError naming the file and field."""
    from airflow.sdk import DAG

    from airflow_sky.dags.job import sky_job
    from airflow_sky.task import Task

    settings = read_sidecar(
        path.with_name(path.name.removesuffix(".yaml").removesuffix(".yml") + SIDECAR_SUFFIX)
    )
    overrides = {k: str(v) for k, v in (settings.get("envs") or {}).items()}
    task = Task.from_yaml(path, env_overrides=overrides or None)
    stem = path.name.rsplit(".", 1)[0]
    with DAG(
        **_dag_kwargs(settings, default_id="".join(c if c.isalnum() or c in "-_." else "_" for c in stem))
    ) as dag:
        sky_job(
            task,
            cluster_name=settings.get("cluster_name"),
            infra=settings.get("infra"),
            down=settings.get("down", True),
            max_recoveries=settings.get("max_recoveries", 3),
            artifacts=settings.get("artifacts"),
            artifacts_to=settings.get("artifacts_to"),
            artifacts_from=settings.get("artifacts_from", "head"),
        )
    return dag


def dags_from_folder(path: str | os.PathLike[str]) -> dict[str, Any]:
    """{dag_id: DAG} for every task YAML in `path` (not recursive; `*.dag.yaml` sidecars are settings).

    Call it from a DAG file; the DAGs register themselves. A broken file is reported as an import warning
    on that YAML file and skipped, so the others still load.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise SkyError(f"dags_from_folder: {folder} is not a directory")
    dags: dict[str, Any] = {}
    for task_file in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        if task_file.name.endswith((SIDECAR_SUFFIX, ".dag.yml")):
            continue
        try:
            dag = dag_from_task_file(task_file)
        except SkyError as e:
            warnings.warn_explicit(str(e), SkyFolderWarning, filename=str(task_file), lineno=1)
            continue
        dags[dag.dag_id] = dag
    return dags
