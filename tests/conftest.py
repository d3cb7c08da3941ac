"""Test-wide setup: every test run keeps its local-cluster state and Airflow home in a private tmp dir."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_sky.clouds.base import Node, ProvisionRequest
from airflow_sky.clouds.local import LocalCloud
from airflow_sky.local import daemon, layout

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    state = tmp_path_factory.mktemp("sky-state")
    os.environ[layout.ROOT_ENV] = str(state / "local")
    os.environ.setdefault("AIRFLOW_HOME", str(state / "airflow"))
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    yield


@pytest.fixture
def local_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[[int], tuple[str, list[Node], str]]]:
    """Factory: bring up an N-node local cluster; tears it down and checks no process is left behind."""
    cloud = LocalCloud()
    names: list[str] = []

    def make(num_nodes: int) -> tuple[str, list[Node], str]:
        name = f"t-{request.node.name[:30].replace('[', '-').replace(']', '').replace('_', '-')}-{len(names)}"
        names.append(name)
        nodes = cloud.provision(ProvisionRequest(cluster_name=name, num_nodes=num_nodes))
        return name, nodes, cloud.ssh_private_key(name)

    yield make
    for name in names:
        cloud.terminate(name)
        assert daemon.processes_with_marker(name) == [], f"processes of cluster {name} left behind"
