"""Parsers for resource values whose rules a JSON Schema cannot express; each returns the canonical form.

All take the already schema-checked value, the SpecContext and the field path, and raise ctx.error(...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from airflow_sky.task.diagnostics import PathPart, SpecContext, format_path, show
from airflow_sky.task.schema import SUPPORTED_CLOUDS

Count = int | float

_ACCEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ACCEL = re.compile(r"^\s*(?P<name>[^:\s]+)\s*(?::\s*(?P<count>[0-9]*\.?[0-9]+)\s*)?$")
_AMOUNT = re.compile(r"^\s*(?P<num>[0-9]*\.?[0-9]+)\s*(?P<plus>\+)?\s*$")
_MEMORY = re.compile(r"^\s*(?P<num>[0-9]*\.?[0-9]+)\s*(?:(?i:gb)\s*(?P<plus_after>\+)?|(?P<plus>\+)?)\s*$")
_PORT_RANGE = re.compile(r"^\s*(?P<lo>[0-9]+)\s*(?:-\s*(?P<hi>[0-9]+)\s*)?$")
_K8S = ("k8s", "kubernetes")
_ACCEL_FORMS = "'NAME[:COUNT]' with COUNT > 0, e.g. 'L4:4', 'L4' or 'A100:0.5'"


def canonical_number(value: Count) -> str:
    """4 -> '4', 4.0 -> '4', 0.5 -> '0.5' (SkyPilot keeps cpus/memory as strings)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _count(value: Count) -> Count:
    return int(value) if float(value).is_integer() else float(value)


def parse_amount(value: Any, ctx: SpecContext, path: Sequence[PathPart], *, memory: bool) -> str:
    """cpus/memory: N or 'N+' (memory also 'NGB', 'NGB+'), N > 0 -> canonical '4', '4+', '0.5'."""
    allowed = "N or 'N+' with N > 0" + (", optionally with a GB unit ('32GB', '64GB+')" if memory else "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 < value < math.inf:
            raise ctx.error(path, f"must be {allowed}, got {show(value)}")
        return canonical_number(value)
    match = (_MEMORY if memory else _AMOUNT).match(str(value))
    if match is None or float(match["num"]) <= 0:
        raise ctx.error(path, f"must be {allowed}, got {show(value)}")
    plus = match["plus"] or (match.groupdict().get("plus_after") or "")
    return canonical_number(float(match["num"])) + plus


def _accelerator(text: str, ctx: SpecContext, path: Sequence[PathPart]) -> tuple[str, Count]:
    match = _ACCEL.match(text)
    if match is None or not _ACCEL_NAME.match(match["name"]):
        raise ctx.error(path, f"must be {_ACCEL_FORMS}, got {show(text)}")
    count = float(match["count"]) if match["count"] is not None else 1.0
    if count <= 0:
        raise ctx.error(path, f"accelerator count must be > 0, got {show(text)}")
    return match["name"], _count(count)


def parse_accelerators(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> dict[str, Count]:
    """'L4:4' | 'L4' | {L4: 4, A100: 8} | ['L4:1', 'A100:1'] -> {name: count}, candidates in given order."""
    items: list[tuple[str, Count]] = []
    if isinstance(value, str):
        items.append(_accelerator(value, ctx, path))
    elif isinstance(value, dict):
        for name, count in value.items():
            item_path = [*path, name]
            if count is None:  # `{V100:1, A100:1}` in YAML is a mapping of 'V100:1' to null
                items.append(_accelerator(str(name), ctx, item_path))
                continue
            if not _ACCEL_NAME.match(str(name)):
                raise ctx.error(item_path, f"invalid accelerator name; must be {_ACCEL_FORMS}")
            if not 0 < count < math.inf:
                raise ctx.error(item_path, f"accelerator count must be a number > 0, got {show(count)}")
            items.append((str(name), _count(count)))
    else:
        items.extend(_accelerator(text, ctx, [*path, i]) for i, text in enumerate(value))
    if not items:
        raise ctx.error(path, f"must name at least one accelerator: {_ACCEL_FORMS}")
    result: dict[str, Count] = {}
    for name, count in items:
        if name in result:
            raise ctx.error(path, f"accelerator {name!r} is listed twice; give each candidate once")
        result[name] = count
    return result


_DURATION = re.compile(r"^\s*(?P<num>[0-9]+)\s*(?P<unit>[mhd]?)\s*$")
_MINUTES_PER = {"": 1, "m": 1, "h": 60, "d": 24 * 60}
AUTOSTOP_WAIT_FOR = ("jobs_and_ssh", "jobs", "none")
DEFAULT_AUTOSTOP_MINUTES = 5  # SkyPilot's, for `autostop: true`
_AUTOSTOP_FORMS = "true/false, minutes (10), a duration ('10m', '1h', '1d') or {idle_minutes, down, wait_for}"


def parse_autostop(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> dict[str, Any] | bool:
    """resources.autostop -> False (off) or {"idle_minutes": int, "down": bool, "wait_for": str}."""
    if value is False:
        return False
    if value is True:
        return {"idle_minutes": DEFAULT_AUTOSTOP_MINUTES, "down": False, "wait_for": "jobs_and_ssh"}
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"idle_minutes", "down", "wait_for"})
        if unknown:
            raise ctx.error(
                path, f"unknown field(s) {', '.join(unknown)}; allowed: idle_minutes, down, wait_for"
            )
        minutes = _idle_minutes(
            value.get("idle_minutes", DEFAULT_AUTOSTOP_MINUTES), ctx, [*path, "idle_minutes"]
        )
        down = value.get("down", False)
        if not isinstance(down, bool):
            raise ctx.error([*path, "down"], f"must be true or false, got {show(down)}")
        wait_for = value.get("wait_for", "jobs_and_ssh")
        if wait_for not in AUTOSTOP_WAIT_FOR:
            raise ctx.error(
                [*path, "wait_for"], f"must be one of {', '.join(AUTOSTOP_WAIT_FOR)}, got {show(wait_for)}"
            )
        return {"idle_minutes": minutes, "down": down, "wait_for": wait_for}
    return {"idle_minutes": _idle_minutes(value, ctx, path), "down": False, "wait_for": "jobs_and_ssh"}


def _idle_minutes(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ctx.error(path, f"idle minutes must be >= 0, got {value}")
        return value
    match = _DURATION.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise ctx.error(path, f"must be {_AUTOSTOP_FORMS}, got {show(value)}")
    return int(match["num"]) * _MINUTES_PER[match["unit"]]


def format_accelerators(
    accelerators: dict[str, Count], ordered: bool = False
) -> str | dict[str, Count] | list[str]:
    """The YAML form: 'L4:4' for one candidate, {L4: 4, A100: 8} for a set, ['L4:4', 'A100:8'] in order."""
    if len(accelerators) == 1:
        ((name, count),) = accelerators.items()
        return f"{name}:{count}"
    if ordered:
        return [f"{name}:{count}" for name, count in accelerators.items()]
    return dict(accelerators)


def _check_cloud(cloud: str, ctx: SpecContext, path: Sequence[PathPart]) -> str:
    lowered = cloud.strip().lower()
    if lowered in SUPPORTED_CLOUDS:
        return lowered
    what = "Kubernetes is not supported" if lowered in _K8S else f"unsupported cloud {cloud!r}"
    raise ctx.error(path, f"{what}; supported: {', '.join(SUPPORTED_CLOUDS)}")


def _check_placement(
    cloud: str | None, region: str | None, zone: str | None, ctx: SpecContext, path: Sequence[PathPart]
) -> None:
    if cloud == "local" and (region or zone):
        raise ctx.error(path, "the local cloud takes no region or zone; use 'local'")
    if cloud == "ssh" and zone:
        raise ctx.error(path, "ssh takes a pool name and no zone; use 'ssh/<pool>'")


def parse_infra(
    config: dict[str, Any], ctx: SpecContext, path: Sequence[PathPart]
) -> tuple[str | None, str | None, str | None]:
    """`infra: cloud[/region[/zone]]` or `cloud`/`region`/`zone` (not both) -> (cloud, region, zone)."""
    infra = config.get("infra")
    separate = [key for key in ("cloud", "region", "zone") if config.get(key) is not None]
    if infra is not None and separate:
        other = format_path([*path, separate[0]])
        raise ctx.error(
            [*path, "infra"], f"cannot be combined with {other}; give either infra or cloud/region/zone"
        )
    if infra is not None:
        infra_path = [*path, "infra"]
        parts = [part.strip() for part in str(infra).split("/")]
        if len(parts) > 3 or any(not part for part in parts):
            raise ctx.error(infra_path, f"must be 'cloud[/region[/zone]]', got {show(infra)}")
        cloud = None if parts[0] == "*" else _check_cloud(parts[0], ctx, infra_path)
        region, zone = [None if part == "*" else part for part in parts[1:]] + [None] * (3 - len(parts))
        _check_placement(cloud, region, zone, ctx, infra_path)
        return cloud, region, zone
    cloud = config.get("cloud")
    region, zone = config.get("region"), config.get("zone")
    if cloud is not None:
        cloud = _check_cloud(cloud, ctx, [*path, "cloud"])
    _check_placement(cloud, region, zone, ctx, [*path, separate[-1] if separate else "cloud"])
    return cloud, region, zone


def format_infra(cloud: str | None, region: str | None, zone: str | None) -> str | None:
    """(cloud, region, zone) -> 'cloud[/region[/zone]]', '*' standing for "any"; None when all are unset."""
    if cloud is None and region is None and zone is None:
        return None
    parts = [cloud or "*"]
    if region or zone:
        parts.append(region or "*")
    if zone:
        parts.append(zone)
    return "/".join(parts)


def parse_ports(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> tuple[str, ...]:
    """8080 | '8080' | '10000-10010' | a list of them -> ('8080', '10000-10010')."""
    values = value if isinstance(value, list) else [value]
    ports: list[str] = []
    for i, item in enumerate(values):
        item_path = [*path, i] if isinstance(value, list) else list(path)
        match = _PORT_RANGE.match(str(item)) if not isinstance(item, bool) else None
        lo = int(match["lo"]) if match else 0
        hi = int(match["hi"]) if match and match["hi"] else lo
        if not (1 <= lo <= hi <= 65535):
            raise ctx.error(item_path, f"must be a port 1..65535 or a range 'LO-HI', got {show(item)}")
        ports.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return tuple(ports)
