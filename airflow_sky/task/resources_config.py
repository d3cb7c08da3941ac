"""A resources mapping before it is read: nulls, SkyPilot's aliases and its internal fields (here and in
any_of/ordered entries)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.task.diagnostics import PathPart, SpecContext, format_path
from airflow_sky.task.schema import INTERNAL_RESOURCE_FIELDS


def refuse_internal(config: Mapping[str, Any], ctx: SpecContext, path: Sequence[PathPart]) -> None:
    """SkyPilot-internal `_...` fields (here and in any_of/ordered entries) get their own reason."""
    for key, value in config.items():
        if key in INTERNAL_RESOURCE_FIELDS:
            raise ctx.error(
                [*path, key], "SkyPilot-internal field (SkyPilot writes it for itself); remove it"
            )
        if key in ("any_of", "ordered") and isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, Mapping):
                    refuse_internal(entry, ctx, [*path, key, i])


def without_nulls(config: Mapping[str, Any]) -> dict[str, Any]:
    """A field set to null counts as absent (here and in any_of/ordered entries)."""
    result = {key: value for key, value in config.items() if value is not None}
    for key in ("any_of", "ordered"):
        if isinstance(result.get(key), list):
            result[key] = [without_nulls(e) if isinstance(e, Mapping) else e for e in result[key]]
    return result


def resolve_alias(
    config: dict[str, Any], alias: str, canonical: str, ctx: SpecContext, path: Sequence[PathPart]
) -> dict[str, Any]:
    """SkyPilot's other names: `gpus` for `accelerators`, legacy `spot_recovery` for `job_recovery`."""
    if alias not in config:
        return config
    if canonical in config:
        raise ctx.error(
            [*path, alias], f"cannot be combined with {format_path([*path, canonical])}; give one of them"
        )
    return {(canonical if key == alias else key): value for key, value in config.items()}
