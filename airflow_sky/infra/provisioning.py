"""What the cloud drivers (aws, gcp) share around a launch: failover over placements, waiting for SSH,
the image and disk a task asks for, the driver's own record, and the emulators' endpoint resolver."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from airflow_sky.errors import ClusterError, RemoteError, SpecError
from airflow_sky.infra.state_store import StateStore
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container_login import PREP_WAIT_S, boot_prep_script, prep_report_command
from airflow_sky.node.record import Node
from airflow_sky.task import Resources
from airflow_sky.task.container import parse_image

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = (30.0, 600.0)  # first wait and cap between rounds of --retry-until-up
DEFAULT_DISK_SIZE_GB = 256  # SkyPilot's default disk_size
T = TypeVar("T")


class Placement(Protocol):
    @property
    def region(self) -> str: ...

    @property
    def label(self) -> str: ...


class NoCapacity(ClusterError):
    """The cloud has no room for the launch in this placement (a stock-out, no spot capacity, a quota)."""

    def __init__(self, placement: Placement, code: str, message: str) -> None:
        super().__init__(f"{placement.label}: {code}: {message}")
        self.placement = placement
        self.code = code


P = TypeVar("P", bound=Placement)


def launch_with_failover(
    cloud: str,
    cluster: str,
    placements: Sequence[P],
    launch: Callable[[P], T],
    retry_until_up: bool,
    backoff_s: tuple[float, float] | None = None,
) -> T:
    """`launch` in the first placement with room, in the optimizer's order; with retry_until_up, go round
    again after a backoff (doubling to its cap) instead of failing."""
    first, cap = backoff_s or RETRY_BACKOFF_S
    backoff = first
    while True:
        failures: list[str] = []
        for placement in placements:
            try:
                return launch(placement)
            except NoCapacity as e:
                log.warning("%s: no capacity for %s: %s; trying the next placement", cloud, cluster, e)
                failures.append(str(e))
        if not retry_until_up:
            more = f"; and {len(failures) - 5} more" if len(failures) > 5 else ""
            raise ClusterError(
                f"{cloud}: no capacity for cluster {cluster!r} in any of {len(placements)} placement(s) "
                f"(retry with --retry-until-up to keep trying): {'; '.join(failures[:5])}{more}"
            )
        log.warning("%s: no capacity anywhere for %s; trying again in %.0f s", cloud, cluster, backoff)
        time.sleep(backoff)
        backoff = min(backoff * 2, cap)


def wait_for_ssh(cloud: str, nodes: Sequence[Node], key_file: str, timeout_s: float, poll_s: float) -> None:
    """Until every node answers a command over SSH with its pinned host key; a ClusterError past the deadline."""
    deadline = time.monotonic() + timeout_s
    for node in nodes:
        while True:
            try:
                with NodeClient(node, key_file, conn_retry_attempts=1) as client:
                    client.exec("true")
                break
            except (RemoteError, OSError) as e:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{cloud}: {node.instance_id} (rank {node.rank}) at {node.ssh_host} does not answer SSH "
                        f"after {timeout_s:.0f} s: {e}"
                    ) from e
                time.sleep(poll_s)


def image_for(resources: Resources, region: str, cloud: str, forms: str) -> str | None:
    """`image_id` for this region (a string for all regions, or a mapping region -> image); None: the
    cloud's default. A container image (`docker:<image>`) runs on the default image, which has Docker
    (the node's boot prep installs it where a VM image has none): None too. `forms` names the VM images
    `cloud` takes, for the error about a mapping without this region."""
    if container_image(resources) is not None:
        return None
    image = resources.image_id
    if isinstance(image, dict):
        chosen = image.get(region)
        if chosen is None:
            raise SpecError(
                f"resources.image_id: no image for region {region} (the mapping has {', '.join(sorted(image))}); "
                f"give {forms} for each region"
            )
        image = str(chosen)
    return image


def container_image(resources: Resources | None) -> str | None:
    """The container image of `image_id: docker:<image>` (None: the task runs on the VM itself)."""
    return parse_image(resources.image_id) if resources is not None else None


def container_note(resources: Resources | None) -> str | None:
    """What `--dryrun` and the provision log say of a container task on a cloud."""
    image = container_image(resources)
    if image is None:
        return None
    return (
        f"container: {image} (Docker on the default image: installed at boot if missing, the image pulled "
        "at boot; setup and run execute inside it)"
    )


def boot_prep(resources: Resources | None, ssh_user: str) -> str | None:
    """The root script a cloud node runs at boot for a container task (None for another task): Docker
    ensured, the image pulled in the background (node/container_login.py). It holds no secret."""
    image = container_image(resources)
    return boot_prep_script(image, ssh_user) if image is not None else None


def report_container_prep(cloud: str, cluster: str, nodes: Sequence[Node], key_file: str) -> None:
    """Into the provision log (the infra's logger): each node's record of its boot prep, once it ended
    (waited for at most PREP_WAIT_S): Docker installed or found, the image's pull and its time. A node
    that cannot be asked is said, not fatal: the job's sync pulls the image itself."""
    for node in nodes:
        try:
            # The default retries: a node that just answered the provision's SSH wait may still refuse
            # one connection on a busy host, and its record would be lost from the log for nothing.
            with NodeClient(node, key_file) as client:
                rc, out, err = client.exec(prep_report_command(), timeout=PREP_WAIT_S + 120)
        except (RemoteError, OSError) as e:
            log.warning("%s: %s: rank %d: no record of its container prep: %s", cloud, cluster, node.rank, e)
            continue
        text = out.decode(errors="replace").strip()
        if rc != 0:
            text += f"\n(its record could not be read: exit code {rc}: {err.decode(errors='replace').strip()[-300:]})"
        for line in text.splitlines()[-40:]:
            log.info("%s: %s: rank %d: %s", cloud, cluster, node.rank, line)


def disk_size_gb(resources: Resources) -> int:
    """The root disk a node gets: the task's disk_size, or SkyPilot's default."""
    return int(resources.disk_size or DEFAULT_DISK_SIZE_GB)


def update_record(store: StateStore, key: str, changes: dict[str, Any], what: str) -> None:
    """Merge `changes` into the driver's record `key` (compare-and-swap, retried against racing writers)."""
    for _ in range(5):
        current = store.get(key)
        data = (current.data if current else {}) | changes
        if current is not None and current.data == data:
            return
        if store.put(key, data, current.version if current else None):
            return
    raise ClusterError(f"could not record {what} (too many concurrent writers)")


def resolver_from_env(variable: str) -> Callable[[str], dict[str, Any]] | None:
    """For emulators only: "module:function" in `variable`, taking an instance id and returning
    {"host", "port", "user", "internal_ip", "host_key"} of a machine that plays it."""
    spec = os.environ.get(variable)
    if not spec:
        return None
    module, _, function = spec.partition(":")
    resolver: Callable[[str], dict[str, Any]] = getattr(importlib.import_module(module), function)
    return resolver
