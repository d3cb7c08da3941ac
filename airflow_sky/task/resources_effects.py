"""Which resource fields have no effect on which infra: said once at check, launch and provision.

ports, labels, disk_tier and network_tier act on aws and gcp (security-group / firewall rules, tags,
volume types, placement and fast NICs). A local node is a process on this machine and an ssh pool's host
is used as it is: nothing there makes a disk, a tag or a faster network. Ports are recorded on both for
`status --endpoints`; on an ssh pool nothing is opened (the pool's own firewall applies).
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_sky.task.diagnostics import PathPart, format_path
from airflow_sky.task.resources import Resources

NO_EFFECT_FIELDS: dict[str, tuple[str, ...]] = {
    "local": ("disk_tier", "network_tier", "labels"),
    "ssh": ("disk_tier", "network_tier", "labels"),
}
_WHY = {
    "local": "local nodes are processes on this machine: no disks, tags or network to set",
    "ssh": "an ssh pool's hosts are used as they are: no disks, tags or network to set",
}
# `network_tier: standard` asks for what every infra gives: nothing to say about it.
_DEFAULTS = {"network_tier": "standard"}


def _cloud(infra: str) -> str:
    return infra.split("/", 1)[0].lower()


def _entries(resources: Resources, cloud: str) -> Iterator[tuple[tuple[PathPart, ...], Resources]]:
    """The resource mappings a launch on `cloud` may use: the base, and each any_of/ordered entry that
    names no other cloud, with their paths."""
    yield ("resources",), resources
    for key in ("any_of", "ordered"):
        for i, entry in enumerate(getattr(resources, key)):
            if entry.cloud is None or entry.cloud == cloud:
                yield ("resources", key, i), entry


def no_effect_fields(resources: Resources, infra: str) -> list[str]:
    """The field paths `resources` sets that have no effect on `infra` (`local`, `ssh/<pool>`, ...)."""
    cloud = _cloud(infra)
    fields = NO_EFFECT_FIELDS.get(cloud, ())
    found = []
    for path, entry in _entries(resources, cloud):
        for field in fields:
            value = getattr(entry, field)
            if value is not None and value != _DEFAULTS.get(field):
                found.append(format_path([*path, field]))
    return found


def no_effect_warning(source: str, resources: Resources, infra: str) -> str | None:
    """One line naming every field that has no effect on `infra`, and why; None when all act."""
    found = no_effect_fields(resources, infra)
    if not found:
        return None
    return f"{source}: no effect on {infra}: {', '.join(found)} ({_WHY[_cloud(infra)]})"


def ports_note(source: str, resources: Resources, infra: str) -> str | None:
    """On an ssh pool: the ports are listed by `status --endpoints`, but airflow-sky opens none."""
    if _cloud(infra) != "ssh":
        return None
    ports = sorted({p for _, entry in _entries(resources, "ssh") for p in entry.ports or ()})
    if not ports:
        return None
    return (
        f"{source}: resources.ports {', '.join(ports)}: listed by `status --endpoints`; on {infra} nothing is "
        "opened (the pool's own firewall applies)"
    )
