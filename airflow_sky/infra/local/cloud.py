"""The embedded local infra: N node processes on this machine, each with its own loopback address and home.

A node is an asyncssh server (airflow_sky.infra.local.node_server) on 127.0.x.y. Clients reach it exactly as
they reach a cloud VM: SSH with the cluster key and a host key pinned at provision time.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import ipaddress
import os
import shutil
import time
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import Cloud, ClusterInfo, Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.containers import remove_containers
from airflow_sky.infra.local.gpus import gpu_devices, gpu_refusal
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.infra.state_store import StateStore
from airflow_sky.task import Resources, gpus_per_node

# Loopback addresses handed to nodes: 127.0.0.2 upwards (127.0.0.1 stays the host's own).
_FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.2")
_LAST_ADDRESS = ipaddress.IPv4Address("127.0.255.254")
PROVISION_BATCH = 16  # node servers started at once


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _instance_dirs(cluster_name: str) -> list[Path]:
    base = layout.instances_dir(cluster_name)
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def _remove_home(node_dir: Path) -> None:
    record = layout.read_json(layout.node_record_path(node_dir))
    if record is None:  # its launch failed before the record was written: the dirs are where it made them
        record = {"home": layout.short_home(node_dir.name), "tmp": layout.short_tmp(node_dir.name)}
    for key in ("home", "tmp"):
        if record.get(key):
            shutil.rmtree(record[key], ignore_errors=True)


def _addresses_in_use() -> set[str]:
    base = layout.root()
    used: set[str] = set()
    if not base.is_dir():
        return used
    for record_path in base.glob("*/instances/*/node.json"):
        record = layout.read_json(record_path)
        if record and record.get("state") != layout.STATE_TERMINATED:
            used.add(str(record.get("ip")))
    return used


class LocalCloud(Cloud):
    """Cloud driver for the embedded local cluster."""

    name = "local"

    def __init__(self, ready_timeout_s: float = 30.0) -> None:
        self.ready_timeout_s = ready_timeout_s

    # ---- Cloud interface -------------------------------------------------------------------------------

    def check_resources(self, resources: Resources | None, num_nodes: int) -> None:
        refusal = gpu_refusal(resources, num_nodes)
        if refusal is not None:
            raise ClusterError(refusal)

    def provision(self, request: ProvisionRequest) -> list[Node]:
        cluster = request.cluster_name
        with _locked(layout.cluster_dir(cluster) / "cluster.lock"):
            self._ensure_cluster_key(cluster)
            existing = {n.rank: n for n in self.nodes(cluster)}
            created: list[Path] = []
            missing = [
                r
                for r in range(request.num_nodes)
                if r not in existing or existing[r].status is not NodeStatus.RUNNING
            ]
            per_node = gpus_per_node(request.resources)
            try:
                # In batches: each node server is a Python process that takes a moment of CPU to start, and
                # a hundred at once on a small machine would each wait past its own deadline.
                for start in range(0, len(missing), PROVISION_BATCH):
                    batch = []
                    for rank in missing[start : start + PROVISION_BATCH]:
                        node = existing.get(rank)
                        if node is not None and node.status is NodeStatus.STOPPED:
                            batch.append(self._restart(cluster, node.instance_id))  # its disk is kept
                            continue
                        if node is not None:  # a dead node keeps its rank on a fresh instance
                            self._retire(cluster, node.instance_id)
                        batch.append(self._launch(cluster, rank, per_node, len(missing) - len(created)))
                        created.append(batch[-1])
                    self._wait(batch)
            except BaseException:
                for node_dir in created:
                    self._retire(cluster, node_dir.name)
                if not _instance_dirs(cluster):
                    shutil.rmtree(layout.cluster_dir(cluster), ignore_errors=True)
                raise
            ports = request.resources.ports if request.resources is not None else None
            if ports:  # every port of a loopback node is reachable: recorded, nothing to open
                layout.write_json_atomic(layout.ports_path(cluster), {"ports": list(ports)})
        return self.nodes(cluster)

    def nodes(self, cluster_name: str) -> list[Node]:
        by_rank: dict[int, Node] = {}
        for node_dir in _instance_dirs(cluster_name):
            record = layout.read_json(layout.node_record_path(node_dir))
            if not record or record.get("state") == layout.STATE_TERMINATED:
                continue
            node = self._node_from_record(cluster_name, node_dir, record)
            current = by_rank.get(node.rank)
            # During a replacement two instances share a rank: the running one wins.
            if current is None or (
                current.status is not NodeStatus.RUNNING and node.status is NodeStatus.RUNNING
            ):
                by_rank[node.rank] = node
        return [by_rank[r] for r in sorted(by_rank)]

    def replace(self, cluster_name: str, rank: int) -> Node:
        with _locked(layout.cluster_dir(cluster_name) / "cluster.lock"):
            old = [n for n in self.nodes(cluster_name) if n.rank == rank]
            # The replacement takes the lost node's share of GPUs (the lost node's devices are free again).
            per_node = max((n.gpus for n in old), default=0)
            node_dir = self._launch(
                cluster_name, rank, int(per_node), 1, freeing={n.instance_id for n in old}
            )
            try:
                self._wait([node_dir])
            except BaseException:
                self._retire(cluster_name, node_dir.name)
                raise
            for node in old:
                self._retire(cluster_name, node.instance_id)
        return next(n for n in self.nodes(cluster_name) if n.rank == rank)

    def terminate(self, cluster_name: str) -> None:
        cluster_dir = layout.cluster_dir(cluster_name)
        remove_containers(
            p.name for p in _instance_dirs(cluster_name)
        )  # first: stopped cleanly, then removed
        daemon.kill_marked(cluster_name)
        for node_dir in _instance_dirs(cluster_name):
            _remove_home(node_dir)
        shutil.rmtree(cluster_dir, ignore_errors=True)

    def cluster_info(self, cluster_name: str) -> ClusterInfo:
        return ClusterInfo(cluster_name=cluster_name, cloud="local", region=None, zone=None)

    def ssh_private_key(self, cluster_name: str) -> str:
        return str(layout.cluster_key_path(cluster_name))

    def opened_ports(self, cluster_name: str) -> tuple[str, ...]:
        return tuple((layout.read_json(layout.ports_path(cluster_name)) or {}).get("ports") or ())

    def state_store(self, cluster_name: str) -> StateStore:
        return LocalStateStore(layout.state_dir(cluster_name))

    def clusters(self) -> list[str]:
        base = layout.root()
        if not base.is_dir():
            return []
        # A cluster whose nodes all ended themselves (autodown) leaves an empty instances dir: not a cluster.
        return sorted(
            p.name for p in base.iterdir() if (p / "instances").is_dir() and any((p / "instances").iterdir())
        )

    # ---- local-only operations -------------------------------------------------------------------------

    reports_notices = True
    concurrent_reads = 1  # its stores are local files (see Cloud.concurrent_reads)

    def notice_check(self, cluster_name: str) -> str | None:
        return f'read -r -n 32 n < "$HOME/{layout.NOTICE_PATH}" && echo "$n"'  # builtins: no process a round

    def preempt(self, cluster_name: str, rank: int) -> Node:
        """Kill a node and all its processes without warning, as a spot preemption would."""
        return self.preempt_instance(cluster_name, self._node_of_rank(cluster_name, rank).instance_id)

    def notify_preemption(self, cluster_name: str, rank: int, window_s: float) -> Node:
        """Give rank's node a preemption notice, as a cloud does `window_s` before it takes a spot node: the
        node sees it where it looks (its metadata stand-in), the infra reports it PREEMPTING."""
        node = self._node_of_rank(cluster_name, rank)
        if node.status is not NodeStatus.RUNNING:
            raise ClusterError(f"cluster {cluster_name!r}: the node of rank {rank} is {node.status.value}")
        node_dir = layout.instances_dir(cluster_name) / node.instance_id
        record = layout.read_node_record(node_dir)
        record[layout.NOTICE_KEY] = preempt_at = time.time() + window_s
        layout.write_json_atomic(layout.node_record_path(node_dir), record)
        notice = Path(record.get("home") or layout.node_home(node_dir)) / layout.NOTICE_PATH
        notice.parent.mkdir(parents=True, exist_ok=True)
        notice.write_text(f"{int(preempt_at)}\n")
        return self._node_of_rank(cluster_name, rank)

    def preempt_instance(self, cluster_name: str, instance_id: str) -> Node:
        """Kill the instance `instance_id` (it may have been replaced meanwhile: then nothing is left of it)."""
        node_dir = layout.instances_dir(cluster_name) / instance_id
        record = layout.read_json(layout.node_record_path(node_dir)) if node_dir.is_dir() else None
        if not record or record.get("state") == layout.STATE_TERMINATED:
            raise ClusterError(f"cluster {cluster_name!r} has no instance {instance_id} (any more)")
        record["state"] = layout.STATE_PREEMPTED
        layout.write_json_atomic(layout.node_record_path(node_dir), record)
        daemon.kill_marked(daemon.marker(cluster_name, instance_id))
        return self._node_from_record(cluster_name, node_dir, record)

    def _node_of_rank(self, cluster_name: str, rank: int) -> Node:
        target = next((n for n in self.nodes(cluster_name) if n.rank == rank), None)
        if target is None:
            ranks = [n.rank for n in self.nodes(cluster_name)]
            raise ClusterError(f"cluster {cluster_name!r} has no node of rank {rank} (ranks: {ranks})")
        return target

    # ---- internals -------------------------------------------------------------------------------------

    def _ensure_cluster_key(self, cluster_name: str) -> None:
        key_path = layout.cluster_key_path(cluster_name)
        if key_path.exists():
            return
        key_path.parent.mkdir(parents=True, exist_ok=True)
        import asyncssh  # here: reading a cluster (`airflow-sky status`) needs no key generation

        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"airflow-sky-{cluster_name}")
        key.write_private_key(str(key_path))
        os.chmod(key_path, 0o600)
        key.write_public_key(str(key_path) + ".pub")

    def _launch(
        self,
        cluster_name: str,
        rank: int,
        gpus: int = 0,
        still_to_start: int = 1,
        freeing: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> Path:
        instance_id = f"local-{uuid.uuid4().hex[:12]}"
        node_dir = layout.instances_dir(cluster_name) / instance_id
        node_dir.mkdir(parents=True)
        try:
            self._create_node(cluster_name, node_dir, rank, gpus, still_to_start, freeing)
        except BaseException:
            self._retire(cluster_name, instance_id)  # no half-made node dir, home or tmp left behind
            raise
        return node_dir

    def _create_node(
        self,
        cluster_name: str,
        node_dir: Path,
        rank: int,
        gpus: int,
        still_to_start: int,
        freeing: Collection[str],
    ) -> None:
        instance_id = node_dir.name
        home, tmp = layout.short_home(instance_id), layout.short_tmp(instance_id)
        home.mkdir(mode=0o700)
        tmp.mkdir(mode=0o700)
        layout.node_home(node_dir).symlink_to(home)
        import asyncssh

        host_key = asyncssh.generate_private_key("ssh-ed25519")
        host_key.write_private_key(str(layout.host_key_path(node_dir)))
        os.chmod(layout.host_key_path(node_dir), 0o600)
        shutil.copyfile(
            str(layout.cluster_key_path(cluster_name)) + ".pub", layout.authorized_keys_path(node_dir)
        )
        with _locked(layout.root() / "addresses.lock"):
            ip = self._free_address()
            devices = gpu_devices(gpus, still_to_start, freeing)
            layout.write_json_atomic(
                layout.node_record_path(node_dir),
                {
                    "home": str(home),
                    "tmp": str(tmp),
                    "gpu_devices": devices,
                    # None on a machine without GPUs; "" hides a GPU machine's GPUs from a CPU-only node.
                    "cuda_visible_devices": None if devices is None else ",".join(map(str, devices)),
                    "cluster": cluster_name,
                    "rank": rank,
                    "ip": ip,
                    "port": int(os.environ.get(layout.DEFAULT_SSH_PORT_ENV, layout.DEFAULT_SSH_PORT)),
                    "user": getpass.getuser(),
                    "instance_id": instance_id,
                    "host_key": " ".join(host_key.export_public_key("openssh").decode().split()[:2]),
                    "state": layout.STATE_RUNNING,
                    "created_at": time.time(),
                },
            )
        daemon.spawn_server(node_dir, daemon.marker(cluster_name, instance_id))

    def _restart(self, cluster_name: str, instance_id: str) -> Path:
        """Start a node that autostop stopped again: same home, address and host key."""
        node_dir = layout.instances_dir(cluster_name) / instance_id
        record = layout.read_node_record(node_dir)
        record["state"] = layout.STATE_RUNNING
        layout.write_json_atomic(layout.node_record_path(node_dir), record)
        daemon.spawn_server(node_dir, daemon.marker(cluster_name, instance_id))
        return node_dir

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        # A local node cannot power itself off: it asks its server, which stops (or ends) the node.
        # (Its folder is made first: a node no job ran on yet, `local up`'s, has none.)
        request = f'"$HOME/{layout.POWEROFF_PATH}"'
        return f"mkdir -p \"$(dirname {request})\" && printf '%s\\n' {'down' if down else 'stop'} > {request}"

    def _wait(self, node_dirs: list[Path]) -> None:
        if not node_dirs:
            return
        ports = daemon.wait_ready(node_dirs, self.ready_timeout_s)
        for node_dir, port in ports.items():
            record = layout.read_node_record(node_dir)
            record["port"] = port
            layout.write_json_atomic(layout.node_record_path(node_dir), record)

    def _retire(self, cluster_name: str, instance_id: str) -> None:
        remove_containers([instance_id])
        daemon.kill_marked(daemon.marker(cluster_name, instance_id))
        node_dir = layout.instances_dir(cluster_name) / instance_id
        _remove_home(node_dir)
        shutil.rmtree(node_dir, ignore_errors=True)

    @staticmethod
    def _free_address() -> str:
        used = _addresses_in_use()
        address = _FIRST_ADDRESS
        while str(address) in used or str(address).endswith((".0", ".255")):
            address += 1
            if address > _LAST_ADDRESS:
                raise ClusterError("no free loopback address left for a local node (127.0.0.2-127.0.255.254)")
        return str(address)

    @staticmethod
    def _node_from_record(cluster_name: str, node_dir: Path, record: dict[str, Any]) -> Node:
        instance_id = str(record["instance_id"])
        preempt_at = record.get(layout.NOTICE_KEY)
        if daemon.server_alive(node_dir, daemon.marker(cluster_name, instance_id)):
            status = NodeStatus.PREEMPTING if preempt_at is not None else NodeStatus.RUNNING
        elif record.get("state") == layout.STATE_PREEMPTED:
            status = NodeStatus.PREEMPTED
        elif record.get("state") == layout.STATE_STOPPED:
            status = NodeStatus.STOPPED
        else:
            status = NodeStatus.TERMINATED
        return Node(
            rank=int(record["rank"]),
            internal_ip=str(record["ip"]),
            ssh_host=str(record["ip"]),
            ssh_port=int(record["port"]),
            ssh_user=str(record["user"]),
            instance_id=instance_id,
            status=status,
            gpus=len(record.get("gpu_devices") or []),
            host_key=str(record["host_key"]),
            preempt_at=float(preempt_at) if preempt_at is not None else None,
        )
