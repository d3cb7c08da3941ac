"""Where a task YAML named by a DAG file is: relative paths are read next to that DAG file."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from airflow_sky.dags.dag_context import current_dag
from airflow_sky.errors import SpecError


def resolve_task_path(path: str | os.PathLike[str]) -> Path:
    """A task YAML's path: a relative one is read against the directory of the DAG file being parsed (the
    dag-processor's working directory is not the DAG folder), else against the working directory."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return given
    candidates = [Path(folder) / given for folder in _calling_dag_folders()]
    candidates.append(Path.cwd() / given)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    tried = " or ".join(str(c) for c in dict.fromkeys(candidates))
    raise SpecError(f"{path}: no such task file (looked for {tried})")


def _calling_dag_folders() -> list[str]:
    """The folder of the DAG being defined, and of the first caller outside airflow-sky (the DAG file)."""
    folders = []
    dag = current_dag()
    if dag is not None and getattr(dag, "fileloc", None):
        folders.append(os.path.dirname(dag.fileloc))
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = inspect.currentframe()
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(package + os.sep) and os.path.isfile(filename):
            folders.append(os.path.dirname(filename))
            break
        frame = frame.f_back
    return folders
