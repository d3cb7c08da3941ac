"""Pipelines: a multi-document task YAML, read the way SkyPilot reads it (`sky/utils/dag_utils.py`).

    name: train-and-eval        # optional header: the pipeline's name (and `execution`)
    ---
    name: train                 # then one task per document
    run: python train.py
    ---
    name: eval
    run: python eval.py

- **Serial** (SkyPilot's chain DAG, the default): the tasks run in order, each on a cluster of its own; a
  failed task stops the ones after it. A header is a first document holding only `name`, or `name` and
  `execution: serial`.
- **Parallel** (SkyPilot's job group): a header with `execution: parallel` runs every task side by side.
  Each task needs a unique `name` of letters, digits, `-` and `_`.

Pure (no Airflow): the DAG side is `airflow_sky.dags.pipeline`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Unpack

from airflow_sky.errors import SpecError
from airflow_sky.task.diagnostics import STRING_SOURCE, SpecWarning, show
from airflow_sky.task.loading import LoadOptions, checked_options, file_options
from airflow_sky.task.task import Task
from airflow_sky.task.text_files import read_text_file
from airflow_sky.task.yaml_io import parse_yaml_documents

Execution = Literal["serial", "parallel"]
SERIAL: Execution = "serial"
PARALLEL: Execution = "parallel"

# A job group's header fields (SkyPilot's _JOB_GROUP_HEADER_FIELDS); `name` is required.
JOB_GROUP_HEADER_FIELDS = ("name", "execution", "primary_tasks", "termination_delay")
# Parsed but not acted on: SkyPilot stops a group's auxiliary tasks `termination_delay` after its primary
# tasks end; here every task of a parallel pipeline runs to its own end.
INERT_HEADER_FIELDS = ("primary_tasks", "termination_delay")
_JOB_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclasses.dataclass
class Pipeline:
    """Tasks run as one unit: in order (serial) or side by side (parallel)."""

    name: str
    tasks: list[Task]
    execution: Execution = SERIAL
    header: dict[str, Any] = dataclasses.field(default_factory=dict)  # as written, inert fields included

    def __post_init__(self) -> None:
        if not self.tasks:
            raise SpecError(f"pipeline {self.name!r}: has no task")
        if self.execution not in (SERIAL, PARALLEL):
            raise SpecError(
                f"pipeline {self.name!r}: execution: must be 'serial' or 'parallel', got {show(self.execution)}"
            )

    @property
    def job_ids(self) -> list[str]:
        """One id per task, unique in the pipeline: the task's name with anything but letters, digits,
        `-` and `_` made `_`; a repeated name gets `_<position>` (1-based). TaskGroup ids in a DAG."""
        ids: list[str] = []
        for position, task in enumerate(self.tasks, start=1):
            base = job_id_for(task.name or f"{self.name}-{position - 1}")
            ids.append(base if base not in ids else f"{base}_{position}")
        return ids

    def to_documents(self) -> list[dict[str, Any]]:
        """The header (name, execution) and each task's mapping: the YAML documents, in order."""
        header: dict[str, Any] = {"name": self.name, **{k: v for k, v in self.header.items() if k != "name"}}
        if self.execution == PARALLEL:
            header["execution"] = PARALLEL
        return [header, *(task.to_dict() for task in self.tasks)]

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike[str],
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
        *,
        allow_unset: bool = False,
    ) -> Pipeline:
        """Load a task file as a pipeline; a one-task file is a one-task pipeline.

        `allow_unset`: a template check, as for Task.from_yaml (each task's `unset` lists what it lacks).
        """
        options = file_options(path, env_overrides, env_file, allow_unset)
        return cls.from_yaml_str(
            read_text_file(path), default_name=Path(path).name.split(".", 1)[0], **options
        )

    @classmethod
    def from_yaml_str(
        cls, text: str, *, default_name: str = "pipeline", **options: Unpack[LoadOptions]
    ) -> Pipeline:
        """Parse YAML text holding one or more documents; see the module docstring for the rules."""
        options.setdefault("source", STRING_SOURCE)
        documents = parse_yaml_documents(text, options["source"])
        return cls.from_documents(documents, default_name=default_name, **options)

    @classmethod
    def from_documents(
        cls, documents: Sequence[Any], *, default_name: str = "pipeline", **options: Unpack[LoadOptions]
    ) -> Pipeline:
        """Validate parsed YAML documents (a header, then one task each); see the module docstring."""
        loading = _Loading({"source": STRING_SOURCE, **checked_options(options)})
        source = loading.source
        for number, document in enumerate(documents, start=1):
            if not isinstance(document, dict):
                raise SpecError(
                    f"{_where(source, number)}: a document must be a mapping, got {show(document)}"
                )
        configs = list(documents)
        if is_job_group(configs):
            return _job_group(configs, loading)
        name: str | None = None
        header: dict[str, Any] = {}
        offset = 0
        if configs and set(configs[0]) in ({"name"}, {"name", "execution"}):
            header = dict(configs[0])
            name = _header_name(header, source)
            execution = header.get("execution", SERIAL)
            if execution != SERIAL:
                raise SpecError(
                    f"{_where(source, 1)}: execution: a pipeline header takes 'serial' (or no execution); "
                    f"'parallel' needs at least one task after the header, got {show(execution)}"
                )
            configs, offset = configs[1:], 1
        elif len(configs) == 1:
            name = configs[0].get("name")
        if not configs:
            configs = [{"name": name}]  # a header alone still makes one (empty) task, as in SkyPilot
        tasks = [
            loading.task(config, offset + number, len(documents))
            for number, config in enumerate(configs, start=1)
        ]
        name = name or (tasks[0].name if len(tasks) == 1 else None) or default_name
        _fill_names(name, tasks)
        return cls(name=name, tasks=tasks, execution=SERIAL, header=header)


def is_job_group(documents: Sequence[Any]) -> bool:
    """A job group (parallel pipeline): a header with `execution: parallel` and at least one task."""
    return (
        len(documents) >= 2 and isinstance(documents[0], dict) and documents[0].get("execution") == PARALLEL
    )


def job_id_for(name: str) -> str:
    """A task name as a TaskGroup id: letters, digits, `-` and `_` only."""
    return _GROUP_UNSAFE.sub("_", name) or "sky_job"


def is_pipeline_file(path: str | os.PathLike[str]) -> bool:
    """Whether a task YAML holds several documents (a pipeline); unreadable or invalid YAML says no (the
    task loader then names the problem)."""
    try:
        return len(parse_yaml_documents(read_text_file(path), str(path))) > 1
    except SpecError:
        return False


def load_pipeline(
    path: str | os.PathLike[str],
    env_overrides: Mapping[str, str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
) -> Pipeline:
    """`Pipeline.from_yaml`, as a function: any task file, one document or several."""
    return Pipeline.from_yaml(path, env_overrides=env_overrides, env_file=env_file)


def _job_group(configs: list[dict[str, Any]], loading: _Loading) -> Pipeline:
    source = loading.source
    header = dict(configs[0])
    unknown = sorted(set(header) - set(JOB_GROUP_HEADER_FIELDS))
    if unknown:
        raise SpecError(
            f"{_where(source, 1)}: {unknown[0]}: not a field of a parallel pipeline's header "
            f"(allowed: {', '.join(JOB_GROUP_HEADER_FIELDS)})"
        )
    if "name" not in header:
        raise SpecError(f"{_where(source, 1)}: name: a parallel pipeline's header needs a name")
    name = _header_name(header, source)
    if not _JOB_NAME.match(name):
        raise SpecError(
            f"{_where(source, 1)}: name: a parallel pipeline's name takes letters, digits, '-' and '_' "
            f"only, got {show(name)}"
        )
    inert = [field for field in INERT_HEADER_FIELDS if field in header]
    if inert:
        warnings.warn(
            f"{source}: parsed but not acted on yet (every task runs to its own end): {', '.join(inert)}",
            SpecWarning,
            stacklevel=4,
        )
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, config in enumerate(configs[1:], start=2):
        job_name = config.get("name")
        if not isinstance(job_name, str) or not _JOB_NAME.match(job_name):
            raise SpecError(
                f"{_where(source, number)}: name: every task of a parallel pipeline needs a name of letters, "
                f"digits, '-' and '_', got {show(job_name)}"
            )
        if job_name in seen:
            raise SpecError(
                f"{_where(source, number)}: name: {job_name!r} is already the name of document {seen[job_name]}; "
                "the tasks of a parallel pipeline need distinct names"
            )
        seen[job_name] = number
        tasks.append(loading.task(config, number, len(configs)))
    return Pipeline(name=name, tasks=tasks, execution=PARALLEL, header=header)


@dataclasses.dataclass(frozen=True)
class _Loading:
    """What every task document of one file is loaded with."""

    options: LoadOptions

    @property
    def source(self) -> str:
        return self.options["source"]

    def task(self, config: dict[str, Any], number: int, total: int) -> Task:
        source = self.source if total == 1 else _where(self.source, number)
        options: LoadOptions = {**self.options, "source": source}
        return Task.from_dict(config, **options)


def _header_name(header: dict[str, Any], source: str) -> str:
    name = header.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"{_where(source, 1)}: name: the pipeline's name must be a string, got {show(name)}")
    return name


def _fill_names(name: str, tasks: list[Task]) -> None:
    """SkyPilot's naming: a lone task takes the pipeline's name; an unnamed one `<pipeline>-<index>`."""
    if len(tasks) == 1:
        tasks[0].name = name
        return
    for index, task in enumerate(tasks):
        if task.name is None:
            task.name = f"{name}-{index}"


def _where(source: str, number: int) -> str:
    return f"{source} (document {number})"
