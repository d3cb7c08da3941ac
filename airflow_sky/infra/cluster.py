"""Cluster: one cluster on one infra, as every layer above the drivers sees it (plain Python, no Airflow).

It asks the Cloud driver for membership and status (the infra is the source of truth) and hands out SSH
connections to the nodes. The Airflow hook builds one from a connection; the gang core and the client get
one handed in and never see a driver or the hook.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra import provision_log
from airflow_sky.infra.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.ledger import STORE as LEDGER_STORE
from airflow_sky.infra.ledger import Billing, Ledger
from airflow_sky.infra.ports import port_numbers, ports_to_open
from airflow_sky.infra.state_store import StateStore
from airflow_sky.node.autostop import NodeAutostop, arm_command, disarm_command
from airflow_sky.task import Resources

if TYPE_CHECKING:  # paramiko is imported with the first connection: `airflow-sky status` opens none
    from airflow_sky.node.client import NodeClient

AUTOSTOP_KEY = "autostop"  # the cluster's armed autostop ({idle_minutes, down}), for `status`'s AUTOSTOP
AUTOSTOP_CHECK_ENV = "AIRFLOW_SKY_AUTOSTOP_CHECK_S"  # how often a node's watcher looks (default 60 s)
DEFAULT_AUTOSTOP_CHECK_S = 60.0


def autostop_check_s() -> float:
    """How often a node's autostop watcher looks (AIRFLOW_SKY_AUTOSTOP_CHECK_S, default 60 s)."""
    return float(os.environ.get(AUTOSTOP_CHECK_ENV, DEFAULT_AUTOSTOP_CHECK_S))


class Cluster:
    """The nodes of cluster `name` on `cloud` (`infra` is the name it was asked for, e.g. `aws/us-east-1`)."""

    def __init__(self, name: str, infra: str, cloud: Cloud) -> None:
        self.name = name
        self.infra = infra
        self.cloud = cloud
        self._network_env: dict[str, str] | None = None

    # ---- membership ------------------------------------------------------------------------------------

    def provision(
        self,
        num_nodes: int,
        resources: Resources | None = None,
        *,
        job_name: str | None = None,
        retry_until_up: bool = False,
        owner: dict[str, str | None] | None = None,
    ) -> list[Node]:
        """Bring the cluster to at least `num_nodes` running nodes; an existing larger cluster is kept.
        `owner` ({dag_id, run_id, user}) goes into the fleet ledger of a cluster this call brings up."""
        existing = self.cloud.nodes(self.name)
        running = [n for n in existing if n.status is NodeStatus.RUNNING]
        # A cluster that is up is reused as it is, unless the task asks for ports it has not opened: the
        # infra is then asked for them and the ones it has (it opens exactly the ports of its request).
        ports = None
        if existing and resources is not None and resources.ports:
            ports = ports_to_open(self.opened_ports(), resources.ports)
            if ports is not None:
                resources = copy.copy(resources)
                resources.ports = ports
        if len(existing) >= num_nodes and len(running) == len(existing) and ports is None:
            if running:  # a cluster launched before the ledger was kept gets its record now
                self.record_provisioned(
                    existing, owner, f"reused with {len(existing)} node(s)", only_new=True
                )
            return existing
        if any(n.status is NodeStatus.STOPPED for n in existing):
            self.record_autostop(None)  # restarted nodes run no watcher until armed again
        request = ProvisionRequest(
            self.name,
            max(num_nodes, len(existing)),
            resources,
            job_name=job_name,
            retry_until_up=retry_until_up,
        )
        nodes = provision_log.provisioned(self.state_store(), request, existing, self.cloud.provision)
        billing = self.cloud.billing(self.name) if nodes else None
        kind = f", {billing.instance_type}{' (spot)' if billing.use_spot else ''}" if billing else ""
        self.record_provisioned(nodes, owner, f"{len(nodes)} node(s){kind}", billing=billing)
        return nodes

    def nodes(self) -> list[Node]:
        """Every node of the cluster, ordered by rank, with its current status (no side effects)."""
        return self.cloud.nodes(self.name)

    def running_nodes(self, expected: int | None = None) -> list[Node]:
        """The cluster's nodes, all RUNNING; a clear error otherwise."""
        nodes = self.nodes()
        if not nodes:
            raise ClusterError(f"cluster {self.name!r} does not exist on {self.infra}")
        down = [f"rank {n.rank} is {n.status.value}" for n in nodes if n.status is not NodeStatus.RUNNING]
        if down:
            raise ClusterError(f"cluster {self.name!r} is not healthy: {', '.join(down)}")
        if expected is not None and len(nodes) < expected:
            raise ClusterError(f"cluster {self.name!r} has {len(nodes)} nodes; the job needs {expected}")
        return nodes

    def unhealthy_ranks(self, nodes: Sequence[Node]) -> list[int]:
        """Ranks of `nodes` the infra reports as not RUNNING, or as another instance than the one given."""
        live = {n.rank: n for n in self.nodes()}
        return [
            n.rank
            for n in nodes
            if n.rank not in live
            or live[n.rank].status is not NodeStatus.RUNNING
            or live[n.rank].instance_id != n.instance_id
        ]

    def notices(self, nodes: Sequence[Node]) -> dict[int, float]:
        """The ranks of `nodes` the infra reports PREEMPTING (a notice came), with when each goes."""
        if not self.cloud.reports_notices:
            return {}  # (EC2, GCE: a noticed node reads RUNNING; gang.notice_claims handles those)
        live = {n.rank: n for n in self.nodes()}
        return {
            n.rank: float(live[n.rank].preempt_at or 0)
            for n in nodes
            if n.rank in live
            and live[n.rank].status is NodeStatus.PREEMPTING
            and live[n.rank].instance_id == n.instance_id
        }

    def replace(self, rank: int) -> Node:
        """A fresh node that takes over `rank` (new address, empty disk)."""
        old = next((n.instance_id for n in self.nodes() if n.rank == rank), "?")
        node = self.cloud.replace(self.name, rank)
        fleet = self.ledger()
        fleet.safely("replace", lambda: fleet.node_replaced(self.name, rank, old, node.instance_id))
        return node

    def terminate(self) -> None:
        self.cloud.terminate(self.name)
        fleet = self.ledger()
        fleet.safely("teardown", lambda: fleet.torn_down(self.name))

    # ---- the fleet ledger (who owns it, what it costs, what happened) -------------------------------------

    def ledger(self) -> Ledger:
        """The infra's fleet ledger (a store of its own beside the clusters', which outlives them)."""
        return Ledger(self.cloud.state_store(LEDGER_STORE))

    def ledger_record(self) -> dict[str, Any] | None:
        return self.ledger().get(self.name)

    def record_event(self, kind: str, text: str, rank: int | None = None) -> None:
        """One event in the cluster's ledger (preempted, setup failed, ...); never fails the caller."""
        fleet = self.ledger()
        fleet.safely(kind, lambda: fleet.event(self.name, kind, text, rank))

    def record_off_the_bill(self, kind: str, text: str) -> None:
        """Every node stopped or gone (a stop, an autostop found): off the bill, with an event."""
        fleet = self.ledger()
        fleet.safely(kind, lambda: fleet.off_the_bill(self.name, kind, text))

    def record_provisioned(
        self,
        nodes: Sequence[Node],
        owner: dict[str, str | None] | None,
        what: str,
        billing: Billing | None = None,
        only_new: bool = False,
        kind: str = "provisioned",
    ) -> None:
        """The nodes that run now, on the bill (a provision, a start); `only_new`: only when the ledger
        has no record of the cluster yet."""
        fleet = self.ledger()
        running = {n.rank: n.instance_id for n in nodes if n.status is NodeStatus.RUNNING}

        def write() -> None:
            if only_new:
                record = fleet.get(self.name)
                if record is not None and record.get("ended_at") is None:
                    return
            found = billing if billing is not None else self.cloud.billing(self.name)
            fleet.provisioned(self.name, self.infra, running, owner, found, what, kind)

        fleet.safely("provision", write)

    def info(self) -> ClusterInfo:
        return self.cloud.cluster_info(self.name)

    def network_env(self) -> dict[str, str]:
        # Fixed for the cluster's life (a replacement joins the same placement): asked once, not per rank.
        if self._network_env is None:
            self._network_env = self.cloud.network_env(self.name)
        return dict(self._network_env)

    def opened_ports(self) -> tuple[str, ...]:
        return self.cloud.opened_ports(self.name)

    def endpoints(self, port: int | None = None) -> dict[int, str]:
        """Each opened port's `host:port` on the head node's reachable address (its public/SSH host; a
        local node's loopback address), as `sky status --endpoints`: one entry per port, ranges expanded.
        With `port`: that one only, and a clear error when it was not opened."""
        nodes = self.running_nodes()
        opened = port_numbers(self.opened_ports())
        if port is not None and port not in opened:
            listed = ", ".join(self.opened_ports()) or "none"
            raise ClusterError(
                f"port {port} is not opened on cluster {self.name!r} (opened: {listed}); open it with "
                "resources.ports in the task"
            )
        host = nodes[0].ssh_host
        address = f"[{host}]" if ":" in host else host  # an IPv6 address
        return {p: f"{address}:{p}" for p in opened if port is None or p == port}

    def node_bucket_identity(self) -> frozenset[str]:
        """The bucket stores (s3, gcs) the nodes reach with an identity of their own (instance profile,
        service account): no credential is sent to them for those."""
        return self.cloud.node_bucket_identity()

    # ---- autostop ----------------------------------------------------------------------------------

    def autostop_for(self, resources: Resources | None) -> NodeAutostop | None:
        """What a node's watcher is armed with for `resources.autostop`; None when it is not set or off."""
        config = resources.autostop if resources is not None else None
        if not isinstance(config, dict):
            return None
        return NodeAutostop(
            idle_s=int(config["idle_minutes"]) * 60,
            action=self.cloud.autostop_action(self.name, bool(config["down"])),
            wait_for=str(config["wait_for"]),
            check_s=autostop_check_s(),
        )

    def arm_autostop(self, nodes: Sequence[Node], resources: Resources | None) -> NodeAutostop | None:
        """Arm (or, for `autostop: false`, disarm) every node's watcher; a no-op without autostop."""
        config = resources.autostop if resources is not None else None
        if config is None:
            return None
        autostop = self.autostop_for(resources)
        if autostop is not None:
            assert isinstance(config, dict)
            self.cloud.prepare_autostop(self.name, bool(config["down"]))
        command = arm_command(autostop) if autostop is not None else disarm_command()

        def arm(node: Node) -> None:
            with self.client(node) as client:
                rc, _, err = client.exec(command, timeout=60)
            if rc != 0:
                raise ClusterError(
                    f"autostop: could not arm rank {node.rank}: {err.decode(errors='replace')}"
                )

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
            list(pool.map(arm, nodes))
        self.record_autostop(config if isinstance(config, dict) else None)
        return autostop

    def record_autostop(self, config: dict[str, object] | None) -> None:
        """Keep what the nodes' watchers were armed with (None: none is) in the cluster's state, where
        `status` reads it without asking a node."""
        store = self.state_store()
        data = (
            {} if config is None else {"idle_minutes": config["idle_minutes"], "down": bool(config["down"])}
        )
        for _ in range(20):  # a conditional write: another writer in between means read again
            current = store.get(AUTOSTOP_KEY)
            if (current.data if current is not None else {}) == data:
                return
            if store.put(AUTOSTOP_KEY, data, current.version if current else None) is not None:
                return

    def autostop_setting(self) -> dict[str, object] | None:
        """The autostop the nodes were last armed with ({idle_minutes, down}), None when none is."""
        record = self.state_store().get(AUTOSTOP_KEY)
        return record.data if record is not None and record.data else None

    def state_store(self) -> StateStore:
        """Where the cluster's job state lives (kept by the infra, not on any node)."""
        return self.cloud.state_store(self.name)

    @property
    def key_file(self) -> str:
        """The cluster's default private key (every node's, except on pools whose hosts have their own)."""
        return self.cloud.ssh_private_key(self.name)

    def key_file_for(self, node: Node) -> str:
        """The private key that opens `node`."""
        return self.cloud.key_file_for(self.name, node)

    def key_files(self, nodes: Iterable[Node]) -> dict[int, str]:
        return {node.rank: self.key_file_for(node) for node in nodes}

    # ---- SSH -------------------------------------------------------------------------------------------

    def client(self, node: Node, conn_retry_attempts: int = 3) -> NodeClient:
        """A connection to `node`; a poller that retries on its own passes conn_retry_attempts=1, so a
        node that is gone is noticed at once instead of after the SSH hook's waits between attempts."""
        from airflow_sky.node.client import NodeClient

        return NodeClient(node, self.key_file_for(node), conn_retry_attempts=conn_retry_attempts)

    @contextlib.contextmanager
    def clients(self, nodes: Sequence[Node], conn_retry_attempts: int = 3) -> Iterator[dict[int, NodeClient]]:
        """One connection per node (rank -> client), closed on exit."""
        opened = {node.rank: self.client(node, conn_retry_attempts) for node in nodes}
        try:
            yield opened
        finally:
            for client in opened.values():
                client.close()
