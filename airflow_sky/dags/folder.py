"""Every task YAML in a folder as a DAG: `dags_from_folder(path)` in one DAG file.

    tasks/
      train.yaml          a SkyPilot task (unchanged)
      train.dag.yaml      optional sidecar: how to schedule it (see SIDECAR_SCHEMA)
      eval.yaml

A file with several YAML documents is a pipeline: one DAG running its tasks in order (or side by side with
`execution: parallel`), see airflow_sky.dags.pipeline.

A broken task or sidecar does not stop the others from loading, whatever is wrong with it (a SpecError, a
setting Airflow refuses, a file that is not text). It becomes a DAG of its own, tagged `broken`, whose
description is the one-line error (file, field, rule) and whose only task fails with it: the UI's DAG list
shows it. It is also warned about: the DagBag records the warning under the YAML file's name, and the
dag-processor's log shows it.
"""

from __future__ import annotations

import datetime
import os
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pendulum

from airflow_sky.errors import SkyError, SpecError
from airflow_sky.task.diagnostics import one_line, show, unknown_field_message
from airflow_sky.task.text_files import read_text_file
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
    data = parse_yaml(read_text_file(path), str(path))
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
    if "start_date" in data:
        _start_date(data["start_date"], path)
    return dict(data)


def _start_date(text: str, path: Path) -> Any:
    """The sidecar's start_date as a pendulum DateTime; a SpecError naming the field otherwise."""
    parsed: Any
    try:
        parsed = pendulum.parse(text)
    except (ValueError, TypeError, OverflowError):  # pendulum's ParserError is a ValueError
        parsed = None
    if not isinstance(parsed, datetime.datetime):  # a time of day or a duration parses too
        raise SpecError(
            f"{path}: start_date: must be a date or a date and time (2026-01-01, 2026-01-01T06:00:00Z), "
            f"got {show(text)}"
        )
    return parsed


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


def dag_from_task_file(path: Path, taken: Mapping[str, Any] | None = None) -> Any:
    """One task YAML, or pipeline YAML, (with its sidecar) as a DAG; raises SpecError naming file and field.

    `taken`: the DAG ids already built from the folder; this file's may not be one of them. The DAG is
    registered (as a `with DAG` block in a DAG file does) only once Airflow's own checks accept it.
    """
    from airflow_sky.dags.job import sky_job
    from airflow_sky.dags.pipeline import sky_pipeline
    from airflow_sky.task import Task
    from airflow_sky.task.pipeline import Pipeline, is_pipeline_file

    sidecar = path.with_name(path.name.removesuffix(".yaml").removesuffix(".yml") + SIDECAR_SUFFIX)
    settings = read_sidecar(sidecar)
    kwargs = _dag_kwargs(settings, default_id=_default_dag_id(path))
    if kwargs["dag_id"] in (taken or {}):
        where = f"{sidecar}: dag_id" if "dag_id" in settings else f"{path}: DAG id"
        raise SpecError(
            f"{where}: {kwargs['dag_id']!r} is already the id of another DAG of this folder; give this file "
            f"a dag_id of its own in {sidecar.name}"
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
        return _registered_dag(kwargs, lambda: sky_pipeline(pipeline, **job_kwargs), sidecar)
    task = Task.from_yaml(path, env_overrides=overrides or None)
    return _registered_dag(kwargs, lambda: sky_job(task, **job_kwargs), sidecar)


def _registered_dag(kwargs: dict[str, Any], build: Callable[[], Any], sidecar: Path) -> Any:
    """The DAG of `kwargs` with `build()`'s tasks, checked as the DagBag will check it (a schedule Airflow
    cannot read fails here, as this file's error), then registered with the DAG file."""
    from airflow.sdk import DAG

    try:
        with DAG(**kwargs, auto_register=False) as dag:
            build()
        dag.validate()
    except SkyError:
        raise
    except Exception as e:  # Airflow refused the DAG settings (schedule, tags, ...): the sidecar's
        raise SpecError(one_line(f"{sidecar}: Airflow refuses these DAG settings: {e}")) from e
    dag.auto_register = True
    with dag:  # leaving the block registers it with the DAG file being parsed
        pass
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
            dag = dag_from_task_file(task_file, taken=dags)
        except Exception as e:  # whatever one file does wrong, the folder's other DAGs still load
            error = _naming_the_file(task_file, e)
            warnings.warn_explicit(str(error), SkyFolderWarning, filename=str(task_file), lineno=1)
            if _default_dag_id(task_file) in dags:
                continue  # its id is another file's DAG (the warning still names the file)
            dag = broken_file_dag(task_file, error)
        dags[dag.dag_id] = dag
    return dags


def _naming_the_file(path: Path, error: Exception) -> SkyError:
    """The error as one line that names the task file (or its sidecar). A check while the DAG is built (a
    bucket with no store) names only the field; an error no check foresaw says what it was (a bug to
    report, not a folder outage)."""
    if not isinstance(error, SkyError):
        return SpecError(one_line(f"{path}: cannot become a DAG: {type(error).__name__}: {error}"))
    if str(error).startswith(str(path.parent)):
        return error
    return SpecError(one_line(f"{path}: {error}"))
