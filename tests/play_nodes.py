"""Test-only: which local node plays which cloud machine that an emulator "created".

moto (EC2) and the fake GCE API answer the cloud APIs, but their instances are not machines (their IPs lead
nowhere, and the tests never connect to them). So a module's tests bring up a local cluster of *play nodes*
(real SSH servers of the embedded local infra), and the cloud driver, through its endpoint resolver variable
(AIRFLOW_SKY_AWS_ENDPOINT_RESOLVER, AIRFLOW_SKY_GCP_ENDPOINT_RESOLVER), asks this module where an instance
is: each new instance id gets the next play node, round robin, recorded in a file so that the Airflow
processes a test starts resolve the same way. The host key returned is the play node's own, standing in for
the key the cloud publishes at boot (console, guest attributes).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

PLAY_ENV = "AIRFLOW_SKY_TEST_AWS_PLAY"  # a JSON file: {"nodes": [Node dicts], "assigned": {id: index}}


def resolve(instance_id: str) -> dict[str, Any]:
    path = Path(os.environ[PLAY_ENV])
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        play = json.loads(path.read_text())
        assigned: dict[str, int] = play.setdefault("assigned", {})
        if instance_id not in assigned:
            assigned[instance_id] = len(assigned) % len(play["nodes"])
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(play))
            os.replace(tmp, path)
    node = play["nodes"][assigned[instance_id]]
    return {
        "host": node["ssh_host"],
        "port": node["ssh_port"],
        "user": node["ssh_user"],
        "internal_ip": node["internal_ip"],
        "host_key": node["host_key"],
    }


def play_node_index(instance_id: str) -> int:
    return int(json.loads(Path(os.environ[PLAY_ENV]).read_text())["assigned"][instance_id])


@contextlib.contextmanager
def play_cluster(directory: Path, prefix: str, size: int = 6) -> Iterator[dict[str, Any]]:
    """A local cluster of `size` play nodes and the file the resolver reads (PLAY_ENV is set meanwhile).

    Yields {"cluster", "nodes", "file", "key"}: `key` opens the play nodes, so a cloud connection that
    carries it as its SSH key makes the emulated machines reachable, as real ones launched with it would be.
    """
    from airflow_sky.infra.base import ProvisionRequest
    from airflow_sky.infra.local.cloud import LocalCloud
    from tests.envs import patched_environ

    cloud = LocalCloud()
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    nodes = cloud.provision(ProvisionRequest(cluster_name=name, num_nodes=size))
    play_file = directory / "play.json"
    play_file.write_text(json.dumps({"nodes": [n.to_dict() for n in nodes], "assigned": {}}))
    try:
        with patched_environ({PLAY_ENV: str(play_file)}):
            yield {"cluster": name, "nodes": nodes, "file": play_file, "key": cloud.ssh_private_key(name)}
    finally:
        from airflow_sky.infra.local.containers import remove_containers

        cloud.terminate(name)
        # The played instances' containers (named after the cloud's ids, which the local infra's own removal
        # does not know): their processes ended with the play nodes, the runtime's records go here.
        remove_containers(json.loads(play_file.read_text()).get("assigned", {}))


def lose_when_started(probe: Path, play: dict[str, Any], lose: Callable[[], str]) -> threading.Thread:
    """Once both ranks wrote their line to `probe`/starts, take rank 1's machine away: `lose()` does what
    the cloud does (and returns the instance id), then the play node behind it dies with it."""

    def run() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            starts = probe / "starts"
            if starts.exists() and len(starts.read_text().splitlines()) >= 2:
                from airflow_sky.infra.local.cloud import LocalCloud

                LocalCloud().preempt(play["cluster"], play_node_index(lose()))
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def instances_take_their_containers(
    play: dict[str, Any], gone: Callable[[list[str]], Iterable[str]], poll_s: float = 1.0
) -> Iterator[None]:
    """While open, an instance that the emulator says is gone (`gone(ids)` returns those of `ids` that it
    terminated) takes its container with it, as a VM's end takes everything on it.

    The node layer names a node's container after the cloud's instance id (node/container.py), and a cloud
    infra removes none: the VM's end does. A play node outlives the instance it played (it plays later ones
    too), so its runtime would keep the container, and the local infra's removal (infra/local/containers.py)
    knows only the play nodes' own ids. The container is removed on the play node, over its SSH, as the node
    layer runs its runtime: the node's processes live in its PID and mount namespaces, where a runtime
    outside cannot stop them (Podman: "container not running", no exit file)."""
    from airflow_sky.node.client import NodeClient
    from airflow_sky.node.container import instance_container_name, remove_command

    ended: set[str] = set()
    stop = threading.Event()

    def sweep() -> None:
        assigned: dict[str, int] = json.loads(play["file"].read_text()).get("assigned", {})
        ids = [i for i in assigned if i not in ended]
        for instance_id in set(gone(ids)) if ids else ():
            node = play["nodes"][assigned[instance_id]]
            with NodeClient(node, play["key"], conn_retry_attempts=1) as client:
                rc, _, err = client.exec(remove_command([instance_container_name(instance_id)]), timeout=300)
            if rc != 0:
                raise RuntimeError(f"removing {instance_id}'s container: {err.decode(errors='replace')}")
            ended.add(instance_id)

    def loop() -> None:
        while not stop.wait(poll_s):
            with contextlib.suppress(Exception):  # a transient read or API error: the next poll retries
                sweep()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=600)
        sweep()
