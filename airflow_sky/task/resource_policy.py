"""What a managed job may ask of the deployment's machines, as pure rules: the ports it opens, its node count,
its instance types and its accelerators, and no `docker run` options of its own (the `managed_ports`, `managed_max_nodes`, `managed_instance_types`
and `managed_accelerators` settings of task.conf_policy, which applies them).

An opened port is reachable from anywhere the infra lets in (aws and gcp open it to 0.0.0.0/0), so a run
conf opens none unless the deployment lists it; node counts are capped (16 unless set); instance types and
accelerators are free unless listed. Each refusal names the field, the value, the setting and the fix.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from airflow_sky.errors import SpecError
from airflow_sky.task.task import Task

_PORT_RANGE = re.compile(r"^(?P<lo>\d{1,5})(?:-(?P<hi>\d{1,5}))?$")
PortRanges = tuple[tuple[int, int], ...]


def setting_name(name: str) -> str:
    """How a setting is named in errors: its Airflow config key and environment variable."""
    return f"[sky] {name} (AIRFLOW__SKY__{name.upper()})"


def parse_ports_setting(setting: str, items: Sequence[str]) -> PortRanges | None:
    """`managed_ports`' items as (lo, hi) ranges; None for `*` (any port), () when unset (none)."""
    if "*" in items:
        return None
    ranges = []
    for item in items:
        match = _PORT_RANGE.match(item)
        lo = int(match["lo"]) if match else 0
        hi = int(match["hi"]) if match and match["hi"] else lo
        if not 1 <= lo <= hi <= 65535:
            raise SpecError(f"{setting}: {item!r} is no port; write ports 1..65535 or ranges LO-HI, or *")
        ranges.append((lo, hi))
    return tuple(ranges)


def parse_max_nodes(setting: str, value: str | None, default: int) -> int:
    """`managed_max_nodes` as an integer >= 1 (`default` when unset)."""
    if value is None or not value.strip():
        return default
    try:
        count = int(value.strip())
    except ValueError:
        count = 0
    if count < 1:
        raise SpecError(f"{setting}: {value!r} is no node count; write an integer >= 1")
    return count


def check_resources(
    task: Task,
    ports: PortRanges | None,
    max_nodes: int,
    instance_types: Sequence[str],
    accelerators: Sequence[str],
    source: str,
) -> None:
    """Refuse (SpecError, one line) a node count, port, instance type or accelerator the deployment does not
    allow, in the task and in every candidate of its resources (any_of/ordered)."""
    if task.num_nodes > max_nodes:
        raise SpecError(
            f"{source}: task.num_nodes: {task.num_nodes} is more than this deployment allows; at most "
            f"{max_nodes} ({setting_name('managed_max_nodes')}): ask for fewer nodes, or ask the deployment "
            "to raise it"
        )
    container = task.container
    if container is not None and container.run_options:
        # `--privileged`, `-v /:/host` or `--pid host` would hand the node's host to whoever wrote the conf.
        raise SpecError(
            f"{source}: task.config.docker.run_options: a run conf cannot add `docker run` options here "
            f"(got {' '.join(container.run_options)}); the deployment's own apply "
            f"({setting_name('docker_run_options')}): drop them, or ask the deployment to set them"
        )
    for candidate in task.resources.candidates():
        for port in candidate.ports or ():
            if not _port_allowed(ports, port):
                raise SpecError(
                    f"{source}: task.resources.ports: {port} is not allowed here; {_ports(ports)}"
                )
        itype = candidate.instance_type
        if itype and not _matches(instance_types, itype):
            raise SpecError(
                f"{source}: task.resources.instance_type: {itype} is not allowed here; allowed: "
                f"{', '.join(instance_types)} ({setting_name('managed_instance_types')})"
            )
        for name, _count in candidate.accelerator_candidates:
            if not _matches(accelerators, name):
                raise SpecError(
                    f"{source}: task.resources.accelerators: {name} is not allowed here; allowed: "
                    f"{', '.join(accelerators)} ({setting_name('managed_accelerators')})"
                )


def _port_allowed(allowed: PortRanges | None, port: str) -> bool:
    if allowed is None:
        return True
    lo, _, hi = port.partition("-")
    first, last = int(lo), int(hi or lo)
    return any(a <= first and last <= b for a, b in allowed)


def _ports(allowed: PortRanges | None) -> str:
    setting = setting_name("managed_ports")
    if not allowed:
        return (
            f"a run opens no port on this deployment ({setting} is not set: it lists the ports and ranges runs "
            "may open, or * for any); drop resources.ports and reach the job another way (its logs, a bucket)"
        )
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in allowed)
    return f"allowed: {shown} ({setting})"


def _matches(patterns: Sequence[str], value: str) -> bool:
    """Whether `value` matches one of the globs, ignoring case (`a100` is `A100`)."""
    return any(fnmatch.fnmatchcase(value.lower(), pattern.lower()) for pattern in patterns)
