"""What every task loader takes (`LoadOptions`), and the task mapping's shapes before it is validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypedDict

from airflow_sky.task.diagnostics import SpecContext
from airflow_sky.task.schema import INTERNAL_STORAGE_FIELDS, INTERNAL_TASK_FIELDS


class LoadOptions(TypedDict, total=False):
    """The keywords of Task.from_dict/from_yaml_str and Pipeline.from_yaml_str/from_documents."""

    source: str  # what messages name: the file, or <string>/<python>
    base_dir: str | None  # where a relative workdir/local path resolves (default: the working directory)
    env_overrides: Mapping[str, str] | None  # launch values of envs and secrets (`--env`)
    env_file: str | os.PathLike[str] | None  # a dotenv file of such values (`--env-file`)
    allow_unset: bool  # a template check: null envs/secrets are listed in `task.unset`, not an error


def checked_options(options: LoadOptions) -> LoadOptions:
    """`options`, refusing a keyword LoadOptions does not name (a typo must not be ignored silently)."""
    for key in options:
        if key not in LoadOptions.__annotations__:
            raise TypeError(
                f"got an unexpected keyword argument {key!r} (allowed: {', '.join(LoadOptions.__annotations__)})"
            )
    return options


def file_options(
    path: str | os.PathLike[str],
    env_overrides: Mapping[str, str] | None,
    env_file: str | os.PathLike[str] | None,
    allow_unset: bool,
) -> LoadOptions:
    """The options of a task file's loader: its source (its path, as given) and base_dir (its directory),
    and the launch values (`from_yaml`'s arguments)."""
    source = os.fspath(path)
    return {
        "source": source,
        "base_dir": os.path.dirname(os.path.abspath(source)),
        "env_overrides": env_overrides,
        "env_file": env_file,
        "allow_unset": allow_unset,
    }


def script(value: str | list[str] | None) -> str | None:
    """A setup/run script given as a list of lines -> one text."""
    return "\n".join(value) if isinstance(value, list) else value


def refuse_internal(config: Mapping[str, Any], ctx: SpecContext) -> None:
    """SkyPilot-internal fields (in the task and its storage mappings) are refused with that reason."""
    for key in config:
        if key in INTERNAL_TASK_FIELDS:
            raise ctx.error([key], "SkyPilot-internal field (SkyPilot writes it for itself); remove it")
    mounts = config.get("file_mounts")
    for dst, src in mounts.items() if isinstance(mounts, dict) else ():
        for key in src if isinstance(src, dict) else ():
            if key in INTERNAL_STORAGE_FIELDS:
                raise ctx.error(
                    ["file_mounts", dst, key],
                    "SkyPilot-internal field (SkyPilot writes it for itself); remove it",
                )
