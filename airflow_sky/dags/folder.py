"""Every task YAML in a folder as a DAG: `dags_from_folder(path)` in one DAG file.

    tasks/
      train.yaml          a SkyPilot task (unchanged)
      train.dag.yaml      optional sidecar: how to schedule it (see SIDECAR_SCHEMA)
      eval.yaml

A file with several YAML documents is a pipeline: one DAG running its tasks in order (or side by side with
`execution: parallel`), see airflow_sky.dags.pipeline.

A broken task or sidecar does not stop the others from loading. It becomes a DAG of its own, tagged
`broken`, whose description is the one-line SpecError (file, field, rule) and whose only task fails with
it: the UI's DAG list shows it (warnings only reach the dag-processor's log). It is also warned about.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pendulum

from airflow_sky.errors import SkyError, SpecError
from airflow_sky.task.diagnostics import one_line, show, unknown_field_message
from airflow_sky.task.yaml_io import parse_yaml

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
    """The sidecar's settings, validated; a SpecError names the file and the field (did you mean ...?)."""
    if not path.exists():
        return {}
    data = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}: must be a mapping of DAG settings, got {show(data)}")
    allowed = SIDECAR_SCHEMA["properties"]
    for key in data:
        if key not in allowed:
            raise SpecError(f"{path}: {key}: {unknown_field_message(key, allowed)}")
    try:
        jsonschema.validate(data, SIDECAR_SCHEMA)
    except jsonschema.ValidationError as e:
        field = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise SpecError(one_line(f"{path}: {field}: {e.message}")) from e
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


def _default_dag_id(path: Path) -> str:
    stem = path.name.rsplit(".", 1)[0]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)


def dag_from_task_file(path: Path) -> Any:
    """One task YAML, or pipeline YAML, (with its sidecar) as a DAG; raises SpecError naming file and field."""
    from airflow.sdk import DAG

    from airflow_sky.dags.job import sky_job
    from airflow_sky.dags.pipeline import sky_pipeline
    from airflow_sky.task import Task
    from airflow_sky.task.pipeline import Pipeline, is_pipeline_file

    settings = read_sidecar(
        path.with_name(path.name.removesuffix(".yaml").removesuffix(".yml") + SIDECAR_SUFFIX)
    )
    overrides = {k: str(v) for k, v in (settings.get("envs") or {}).items()}
    job_kwargs: dict[str, Any] = {
        "cluster_name": settings.get("cluster_name"),
        "infra": settings.get("infra"),
        "down": settings.get("down", True),
        "max_recoveries": settings.get("max_recoveries", 3),
        "artifacts": settings.get("artifacts"),
        "artifacts_to": settings.get("artifacts_to"),
        "artifacts_from": settings.get("artifacts_from", "head"),
    }
    if is_pipeline_file(path):
        pipeline = Pipeline.from_yaml(path, env_overrides=overrides or None)
        with DAG(**_dag_kwargs(settings, default_id=_default_dag_id(path))) as dag:
            sky_pipeline(pipeline, **job_kwargs)
        return dag
    task = Task.from_yaml(path, env_overrides=overrides or None)
    with DAG(**_dag_kwargs(settings, default_id=_default_dag_id(path))) as dag:
        sky_job(task, **job_kwargs)
    return dag


def broken_file_dag(path: Path, error: SkyError) -> Any:
    """A stand-in DAG for a task file that could not become one: the UI lists it, tagged `broken`, with the
    error as its description; its only task fails with the error (nothing is launched)."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    message = str(error)

    def report() -> None:
        raise SpecError(message)

    with DAG(
        dag_id=_default_dag_id(path),
        description=f"broken task file: {message}"[:500],
        doc_md=f"**{path.name} could not become a DAG**\n\n```\n{message}\n```\n\nFix the file; the DAG "
        "is rebuilt on the next parse.",
        schedule=None,
        catchup=False,
        tags=["airflow-sky", "broken"],
    ) as dag:
        PythonOperator(task_id="spec_error", python_callable=report, retries=0)
    return dag


def dags_from_folder(path: str | os.PathLike[str]) -> dict[str, Any]:
    """{dag_id: DAG} for every task YAML in `path` (not recursive; `*.dag.yaml` sidecars are settings).

    Call it from a DAG file; the DAGs register themselves. A broken file does not stop the others: it is
    warned about (attributed to the YAML file) and listed as a `broken` DAG that fails with its error.
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
            dag = broken_file_dag(task_file, e)
            if dag.dag_id in dags:
                continue
        dags[dag.dag_id] = dag
    return dags
