"""Parsers for resource values whose rules a JSON Schema cannot express; each returns the canonical form.

All take the already schema-checked value, the SpecContext and the field path, and raise ctx.error(...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.task.diagnostics import PathPart, SpecContext, format_path, show
from airflow_sky.task.schema import SUPPORTED_CLOUDS

Count = int | float

_ACCEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ACCEL = re.compile(r"^\s*(?P<name>[^:\s]+)\s*(?::\s*(?P<count>[0-9]*\.?[0-9]+)\s*)?$")
# SkyPilot's GPU-by-memory forms ('80GB+', 'nvidia:80GB:2', '24GB:1') need its GPU memory catalog.
_ACCEL_BY_MEMORY = re.compile(r"(?:^|:)\s*[0-9]+[GgMmTt][Bb]\+?\s*(?::|$)")
_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_AMOUNT = re.compile(rf"^\s*(?P<num>{_NUMBER})\s*(?P<plus>\+)?\s*$")
# SkyPilot's memory units (sky/skylet/constants.py MEMORY_SIZE_UNITS), binary, any case; GB is the base unit.
MEMORY_UNITS_IN_GB = {
    "kb": 2.0**-20,
    "ki": 2.0**-20,
    "mb": 2.0**-10,
    "mi": 2.0**-10,
    "gb": 1.0,
    "gi": 1.0,
    "tb": 2.0**10,
    "ti": 2.0**10,
    "pb": 2.0**20,
    "pi": 2.0**20,
}
_UNIT = "|".join(MEMORY_UNITS_IN_GB)
_MEMORY = re.compile(rf"^\s*(?P<num>{_NUMBER})\s*(?P<unit>(?i:{_UNIT}))?\s*(?P<plus>\+)?\s*$")
_DISK_SIZE = re.compile(rf"^(?P<num>[0-9]+)(?P<unit>(?i:{_UNIT}))?$")
_MEMORY_UNITS_TEXT = "KB, MB, GB, TB, PB or KiB-style Ki, Mi, Gi, Ti, Pi"
_PORT_RANGE = re.compile(r"^\s*(?P<lo>[0-9]+)\s*(?:-\s*(?P<hi>[0-9]+)\s*)?$")
_K8S = ("k8s", "kubernetes")
_ACCEL_FORMS = "'NAME[:COUNT]' with COUNT > 0, e.g. 'L4:4', 'L4' or 'A100:0.5'"


def canonical_number(value: Count) -> str:
    """4 -> '4', 4.0 -> '4', 0.5 -> '0.5' (SkyPilot keeps cpus/memory as strings)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _count(value: Count) -> Count:
    return int(value) if float(value).is_integer() else float(value)


def parse_amount(value: Any, ctx: SpecContext, path: Sequence[PathPart], *, memory: bool) -> str:
    """cpus/memory: N or 'N+', N > 0 -> canonical '4', '4+', '0.5'.

    Memory may carry a unit as in SkyPilot ('32GB', '1TB', '512MB', '16Gi', '64GB+'), converted to GB.
    """
    allowed = "N or 'N+' with N > 0" + (
        f", optionally with a unit ({_MEMORY_UNITS_TEXT}), e.g. '32GB', '1TB', '64GB+'" if memory else ""
    )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 < value < math.inf:
            raise ctx.error(path, f"must be {allowed}, got {show(value)}")
        return canonical_number(value)
    match = (_MEMORY if memory else _AMOUNT).match(str(value))
    if match is None:
        raise ctx.error(path, f"must be {allowed}, got {show(value)}")
    unit = (match.groupdict().get("unit") or "gb").lower()
    number = float(match["num"]) * MEMORY_UNITS_IN_GB[unit]
    if not 0 < number < math.inf:
        raise ctx.error(path, f"must be {allowed}, got {show(value)}")
    return canonical_number(number) + (match["plus"] or "")


def parse_disk_size(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> int:
    """disk_size: whole GB as an integer (256) or a size with a unit ('1024GB', '1TB', '256Gi') -> GB."""
    allowed = f"a whole number of GB >= 1: an integer (256) or a size with a unit ({_MEMORY_UNITS_TEXT}), e.g. '1TB'"
    if isinstance(value, int) and not isinstance(value, bool):
        gigabytes: float = value
    else:
        match = _DISK_SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ctx.error(path, f"must be {allowed}, got {show(value)}")
        gigabytes = int(match["num"]) * MEMORY_UNITS_IN_GB[(match["unit"] or "gb").lower()]
    if gigabytes < 1 or not float(gigabytes).is_integer():
        raise ctx.error(path, f"must be {allowed}, got {show(value)}")
    return int(gigabytes)


def _accelerator(text: str, ctx: SpecContext, path: Sequence[PathPart]) -> tuple[str, Count]:
    if _ACCEL_BY_MEMORY.search(text):
        raise ctx.error(
            path,
            f"GPUs chosen by memory size ({text!r}) are not supported (they need SkyPilot's GPU catalog); "
            "name the GPUs, e.g. {A100-80GB: 1, H100: 1}",
        )
    match = _ACCEL.match(text)
    if match is None or not _ACCEL_NAME.match(match["name"]):
        raise ctx.error(path, f"must be {_ACCEL_FORMS}, got {show(text)}")
    count = float(match["count"]) if match["count"] is not None else 1.0
    if count <= 0:
        raise ctx.error(path, f"accelerator count must be > 0, got {show(text)}")
    return match["name"], _count(count)


Accelerators = tuple[tuple[str, Count], ...]


def parse_accelerators(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> Accelerators:
    """'L4:4' | 'L4' | {L4: 4, A100: 8} | {'A100:4', 'A100:8'} | ['L4:1', 'A100:1'] -> ((name, count), ...).

    Candidates in the given order. As in SkyPilot, one GPU may be a candidate at several counts
    ({A100:4, A100:8}); a candidate given twice (same name and count) counts once.
    """
    items: list[tuple[str, Count]] = []
    if isinstance(value, str):
        items.append(_accelerator(value, ctx, path))
    elif isinstance(value, dict):
        for name, count in value.items():
            item_path = [*path, name]
            if count is None:  # `{V100:1, A100:1}` in YAML is a mapping of 'V100:1' to null
                items.append(_accelerator(str(name), ctx, item_path))
                continue
            if _ACCEL_BY_MEMORY.search(str(name)):
                items.append(_accelerator(str(name), ctx, item_path))  # raises the by-memory error
            if not _ACCEL_NAME.match(str(name)):
                raise ctx.error(item_path, f"invalid accelerator name; must be {_ACCEL_FORMS}")
            if not 0 < count < math.inf:
                raise ctx.error(item_path, f"accelerator count must be a number > 0, got {show(count)}")
            items.append((str(name), _count(count)))
    else:
        items.extend(_accelerator(text, ctx, [*path, i]) for i, text in enumerate(value))
    if not items:
        raise ctx.error(path, f"must name at least one accelerator: {_ACCEL_FORMS}")
    return tuple(dict.fromkeys(items))


_DURATION = re.compile(r"^\s*(?P<num>[0-9]+)\s*(?P<unit>(?i:[mhdw])?)\s*$")
_MINUTES_PER = {"": 1, "m": 1, "h": 60, "d": 24 * 60, "w": 7 * 24 * 60}
AUTOSTOP_WAIT_FOR = ("jobs_and_ssh", "jobs", "none")
AUTOSTOP_FIELDS = ("idle_minutes", "down", "wait_for", "hook", "hook_timeout")
DEFAULT_AUTOSTOP_MINUTES = 5  # SkyPilot's, for `autostop: true`
_AUTOSTOP_FORMS = (
    "true/false, minutes (10), a duration ('10m', '1h', '1d', '1w') or "
    "{idle_minutes, down, wait_for, hook, hook_timeout}"
)


def parse_autostop(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> dict[str, Any] | bool:
    """resources.autostop -> False (off) or {"idle_minutes": int, "down": bool, "wait_for": str} (plus
    "hook"/"hook_timeout" when given: kept, not run yet)."""
    if value is False:
        return False
    if value is True:
        return {"idle_minutes": DEFAULT_AUTOSTOP_MINUTES, "down": False, "wait_for": "jobs_and_ssh"}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(AUTOSTOP_FIELDS))
        if unknown:
            raise ctx.error(
                path, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(AUTOSTOP_FIELDS)}"
            )
        minutes = _idle_minutes(
            value.get("idle_minutes", DEFAULT_AUTOSTOP_MINUTES), ctx, [*path, "idle_minutes"]
        )
        down = value.get("down", False)
        if not isinstance(down, bool):
            raise ctx.error([*path, "down"], f"must be true or false, got {show(down)}")
        wait_for = value.get("wait_for", "jobs_and_ssh")
        if not isinstance(wait_for, str) or wait_for.lower() not in AUTOSTOP_WAIT_FOR:
            raise ctx.error(
                [*path, "wait_for"], f"must be one of {', '.join(AUTOSTOP_WAIT_FOR)}, got {show(wait_for)}"
            )
        result: dict[str, Any] = {"idle_minutes": minutes, "down": down, "wait_for": wait_for.lower()}
        return result | _autostop_hook(value, ctx, path)
    if isinstance(value, int) and value < 0:
        return False  # as SkyPilot's `-i -1`: no autostop
    return {"idle_minutes": _idle_minutes(value, ctx, path), "down": False, "wait_for": "jobs_and_ssh"}


def _autostop_hook(value: dict[str, Any], ctx: SpecContext, path: Sequence[PathPart]) -> dict[str, Any]:
    hook, timeout = value.get("hook"), value.get("hook_timeout")
    if hook is not None and not isinstance(hook, str):
        raise ctx.error([*path, "hook"], f"must be a shell script string, got {show(hook)}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1):
        raise ctx.error([*path, "hook_timeout"], f"must be an integer >= 1 (seconds), got {show(timeout)}")
    return {key: value[key] for key in ("hook", "hook_timeout") if value.get(key) is not None}


def _idle_minutes(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ctx.error(path, f"idle minutes must be >= 0, got {value}")
        return value
    match = _DURATION.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise ctx.error(path, f"must be {_AUTOSTOP_FORMS}, got {show(value)}")
    return int(match["num"]) * _MINUTES_PER[match["unit"].lower()]


DISK_TIERS = ("low", "medium", "high", "ultra", "best")
NETWORK_TIERS = ("standard", "best")


def parse_tier(value: str, allowed: Sequence[str], ctx: SpecContext, path: Sequence[PathPart]) -> str:
    """disk_tier / network_tier: one of SkyPilot's tiers, any case -> lower case."""
    if value.strip().lower() not in allowed:
        raise ctx.error(path, f"must be one of {', '.join(allowed)}, got {show(value)}")
    return value.strip().lower()


def format_accelerators(
    accelerators: Accelerators, ordered: bool = False
) -> str | dict[str, Any] | list[str]:
    """The YAML form: 'L4:4' for one candidate, {L4: 4, A100: 8} for a set (SkyPilot's {'A100:4', 'A100:8'}
    when a GPU comes at several counts), ['L4:4', 'A100:8'] in order."""
    if len(accelerators) == 1:
        ((name, count),) = accelerators
        return f"{name}:{count}"
    if ordered:
        return [f"{name}:{count}" for name, count in accelerators]
    if len({name for name, _ in accelerators}) < len(accelerators):
        return {f"{name}:{count}": None for name, count in accelerators}
    return dict(accelerators)


def entry_cloud(entry: Any) -> str | None:
    """The cloud an any_of/ordered entry names (its `infra`'s first part, or `cloud`), lower case."""
    if not isinstance(entry, Mapping):
        return None
    named = entry.get("infra") or entry.get("cloud")
    return str(named).split("/", 1)[0].strip().lower() if isinstance(named, str) and named.strip() else None


def entry_cloud_supported(entry: Any) -> bool:
    """False only for an entry that names a cloud airflow-sky has no driver for."""
    cloud = entry_cloud(entry)
    return cloud is None or cloud in SUPPORTED_CLOUDS


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
