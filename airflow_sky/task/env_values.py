"""The values of a task's envs and secrets: checked like the YAML's, made strings as SkyPilot makes them."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from airflow_sky.task.diagnostics import SpecContext
from airflow_sky.task.schema import TASK_SCHEMA
from airflow_sky.task.validate import validate


def launch_hint(key: str, field: str) -> str:
    """How a launch gives a value to an env or a secret declared null in the YAML."""
    if field == "secrets":
        return f"--secret {key}=VALUE (or --secret {key} to take it from this shell's environment, or in --secret-file)"
    return f"--env {key}=VALUE (or in --env-file)"


def env_values(values: Mapping[str, Any], field: str, ctx: SpecContext) -> dict[str, str]:
    """Schema-checked env values -> strings (numbers as written); a null left unset at launch is an error."""
    result: dict[str, str] = {}
    for key, value in values.items():
        if value is None:
            raise ctx.error([field, key], f"has no value; pass it at launch with {launch_hint(key, field)}")
        result[key] = value if isinstance(value, str) else str(value)
    return result


def checked_env_values(values: Mapping[str, Any], field: str) -> dict[str, str]:
    """Envs or secrets given in Python (`update_envs`), checked against the YAML's rules, as strings."""
    config = {field: dict(values)}
    validate(config, TASK_SCHEMA, SpecContext())
    return env_values(config[field], field, SpecContext())


def env_scalars_as_strings(config: dict[str, Any]) -> dict[str, Any]:
    """As SkyPilot: a non-null env/secret scalar becomes its Python string (`true` -> 'True', a date ->
    '2024-01-01'); numbers keep the schema's number type and become strings later, lists/mappings stay
    for the schema to refuse."""
    result = dict(config)
    for field in ("envs", "secrets"):
        values = result.get(field)
        if isinstance(values, dict):
            result[field] = {
                key: str(value) if isinstance(value, bool | datetime.date) else value
                for key, value in values.items()
            }
    return result
