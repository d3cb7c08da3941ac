"""The client's settings file, `~/.airflow_sky/config.yaml` (or `$AIRFLOW_SKY_HOME/config.yaml`), as
SkyPilot's `~/.sky/config.yaml`: one section per concern (`api:` where the Airflow API is, `jobs:` the jobs
bucket). Each section is read on its own, so a problem in one never stops a command that needs another."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from airflow_sky.errors import SkyError
from airflow_sky.infra.home import sky_home
from airflow_sky.task.diagnostics import known_fields


def config_file() -> Path:
    return sky_home() / "config.yaml"


def config_section(name: str, fields: Sequence[str], shape: str) -> tuple[dict[str, Any] | None, Path]:
    """The `name:` section of the settings file (None when the file or the section is absent) and the file.

    A section that is not a mapping (`shape` says what it should be), or has a field not in `fields`, is a
    SkyError naming the file, the section and the field.
    """
    path = config_file()
    if not path.is_file():
        return None, path
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SkyError(f"{path}: not valid YAML: {e}") from e
    section = loaded.get(name) if isinstance(loaded, dict) else None
    if section is None:
        return None, path
    return known_fields(section, fields, f"{path}: {name}", shape, SkyError), path
