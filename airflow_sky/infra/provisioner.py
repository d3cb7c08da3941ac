"""The one provisioning flow of the clouds that make machines (aws, gcp), over each cloud's primitives.

`provision`: read where the cluster lives, find its instances, start the ones autostop stopped, work out
the missing ranks, plan where they go (nodes already up fix the placement), launch them with failover
between placements, then wait for the instances still booting. `replace`: launch one rank with failover
and check that it came up. A driver (VmDriver) only lists, starts, launches and ends its own instances;
the order of those steps, and what happens when one fails, is decided here once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.provisioning import Placement, launch_with_failover


class Instance(Protocol):
    @property
    def instance_id(self) -> str: ...


InstanceT = TypeVar("InstanceT", bound=Instance)
PlacementT = TypeVar("PlacementT", bound=Placement)


@dataclasses.dataclass(frozen=True)
class Survey(Generic[InstanceT]):
    """A cluster's instances as the cloud shows them now."""

    current: dict[int, InstanceT]  # rank -> the instance that holds it
    known: list[str]  # ids a new launch's token is derived from (a retry of the same launch finds its own)


@dataclasses.dataclass(frozen=True)
class LaunchOrder:
    """What one launch brings up, wherever it goes: `ranks` of the request's cluster."""

    request: ProvisionRequest
    ranks: list[int]
    known: list[str]  # see Survey.known

    @property
    def cluster(self) -> str:
        return self.request.cluster_name


class VmDriver(Protocol[InstanceT, PlacementT]):
    """What one cloud does for the flow; everything else about a launch is the flow's."""

    name: str

    def recorded_placement(self, cluster: str) -> PlacementT | None:
        """Where the cluster was launched (its record), or None for a new cluster."""

    def survey(self, cluster: str, recorded: PlacementT | None) -> Survey[InstanceT]:
        """The cluster's instances, looked for where `recorded` (or the driver's pin) says."""

    def restartable(self, instance: InstanceT) -> bool:
        """Stopped by autostop, with its disk: starting it again brings the node back."""

    def is_live(self, instance: InstanceT) -> bool:
        """Booting or running: it holds its rank."""

    def start(self, cluster: str, instances: list[InstanceT]) -> None: ...

    def plan(self, request: ProvisionRequest) -> list[PlacementT]:
        """The placements to try, best first."""

    def launch(self, order: LaunchOrder, placement: PlacementT) -> list[str]:
        """Bring up the order's ranks in `placement` (NoCapacity: no room there); ends what it made on failure."""

    def record_size(self, cluster: str, num_nodes: int) -> None:
        """Note the cluster's size when nothing had to be launched."""

    def forget_if_empty(self, cluster: str) -> None:
        """Remove the records of a cluster that has no instance (a first launch that failed)."""

    def nodes(self, cluster: str) -> list[Node]: ...

    def wait_ready(self, cluster: str, instance_ids: list[str]) -> None:
        """Until these instances run, have their host keys pinned and answer SSH; each wait bounded."""


def allowed_placements(
    cloud: str, candidates: Sequence[PlacementT], allowed: tuple[str, ...] | None, fits: str
) -> list[PlacementT]:
    """`candidates` in the optimizer's order, once each, in the regions the connection allows."""
    placements: list[PlacementT] = []
    for p in candidates:
        if (allowed is None or p.region in allowed) and p not in placements:
            placements.append(p)
    if not placements:
        raise ClusterError(
            f"{cloud}: no placement in the allowed regions ({', '.join(allowed or ())}) {fits}"
        )
    return placements


def provision(driver: VmDriver[InstanceT, PlacementT], request: ProvisionRequest) -> list[Node]:
    """Bring the cluster to `request.num_nodes` running nodes (see the module's docstring)."""
    cluster = request.cluster_name
    recorded = driver.recorded_placement(cluster)
    survey = driver.survey(cluster, recorded)
    stopped = [i for r, i in survey.current.items() if driver.restartable(i) and r < request.num_nodes]
    if stopped:
        # Stopped by autostop: start them again (same disks, same host keys, new addresses).
        driver.start(cluster, stopped)
        survey = driver.survey(cluster, recorded)
    held = {r: i for r, i in survey.current.items() if driver.is_live(i)}
    missing = [r for r in range(request.num_nodes) if r not in held]
    # Nodes already up fix the placement: the rest join them in the same zone, with the same type.
    placements = [recorded] if held and recorded is not None else driver.plan(request)
    if missing:
        try:
            launch(driver, LaunchOrder(request, missing, survey.known), placements)
        except BaseException:
            driver.forget_if_empty(cluster)  # a cluster that never came up leaves no record either
            raise
    else:
        driver.record_size(cluster, max(request.num_nodes, len(held)))
    nodes = driver.nodes(cluster)
    pending = [n for n in nodes if n.status is not NodeStatus.RUNNING]
    if pending:
        # Adopted nodes still booting (a provision retried mid-launch): wait for them like for new ones.
        driver.wait_ready(cluster, [n.instance_id for n in pending])
        nodes = driver.nodes(cluster)
    return nodes


def launch(
    driver: VmDriver[InstanceT, PlacementT], order: LaunchOrder, placements: Sequence[PlacementT]
) -> list[str]:
    """Launch the order in the first placement with room; with retry_until_up, keep going round."""
    return launch_with_failover(
        driver.name,
        order.cluster,
        placements,
        lambda placement: driver.launch(order, placement),
        order.request.retry_until_up,
    )


def replace(
    driver: VmDriver[InstanceT, PlacementT], order: LaunchOrder, placements: Sequence[PlacementT]
) -> Node:
    """Launch a fresh node for the order's one rank (the old one already ended); return it, running."""
    (rank,) = order.ranks
    launch(driver, order, placements)
    node = next((n for n in driver.nodes(order.cluster) if n.rank == rank), None)
    if node is None or node.status is not NodeStatus.RUNNING:
        raise ClusterError(
            f"{driver.name}: the replacement for rank {rank} of {order.cluster!r} is not running"
        )
    return node
