"""`resources.ports` on real local nodes: recorded at provision, and each port's endpoint is the head node's
loopback address (Cluster.endpoints, `airflow_sky.endpoints`, `airflow-sky status --endpoints`)."""

from __future__ import annotations

import os
import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import airflow_sky
from airflow_sky.client.cli import main
from airflow_sky.errors import ClusterError
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.home import HOME_ENV
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
from airflow_sky.task import Resources
from tests.ports import free_port


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Cluster]]:
    """Opens local clusters (a fresh sky home, no ssh pools: the SDK finds them on local); each is torn
    down after the test, leaving no process behind."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "sky-home"))
    monkeypatch.setenv("AIRFLOW_HOME", os.environ["AIRFLOW_HOME"])  # the CLI points it at its own home
    monkeypatch.setenv(POOL_FILE_ENV, str(tmp_path / "no-pools.yaml"))
    opened: list[Cluster] = []

    def make(name: str) -> Cluster:
        opened.append(Cluster(name, "local", LocalCloud()))
        return opened[-1]

    yield make
    for each in opened:
        each.terminate()
        assert daemon.processes_with_marker(each.name) == []
        assert not layout.cluster_dir(each.name).exists()


def _get(url: str) -> bytes:
    """The body at `url`, asked until the server answers (it starts in the background on a node)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return bytes(answer.read())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_each_port_of_a_two_node_cluster_is_reached_at_the_heads_loopback_address(
    cluster: Callable[[str], Cluster], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    ep = cluster("ep-two")
    nodes = ep.provision(2, Resources(ports=[port, "20000-20001"]))
    head = nodes[0].internal_ip
    assert head.startswith("127.") and head != nodes[1].internal_ip
    expected = {port: f"{head}:{port}", 20000: f"{head}:20000", 20001: f"{head}:20001"}
    assert ep.opened_ports() == (str(port), "20000-20001")
    assert ep.endpoints() == expected
    assert ep.endpoints(20001) == {20001: f"{head}:20001"}

    # A server on the head node answers at its endpoint.
    with ep.client(nodes[0]) as client:
        serve = f"cd ~ && echo served-by-head > index.html && exec timeout 300 python3 -m http.server {port} --bind {head}"
        rc, _, err = client.exec(f"nohup sh -c {shlex.quote(serve)} >/dev/null 2>&1 &")
    assert rc == 0, err
    assert _get(f"http://{expected[port]}/index.html").strip() == b"served-by-head"

    assert airflow_sky.endpoints("ep-two") == expected
    assert airflow_sky.endpoints("ep-two", port) == {port: f"{head}:{port}"}

    capsys.readouterr()
    assert main(["status", "--endpoints", "ep-two"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{p}: {address}" for p, address in sorted(expected.items())]
    assert main(["status", "--endpoints", "ep-two", str(port)]) == 0
    assert capsys.readouterr().out == f"{head}:{port}\n"
    assert main(["status", "ep-two", "--endpoint", "20000"]) == 0
    assert capsys.readouterr().out == f"{head}:20000\n"


def test_a_port_that_was_not_opened_is_a_clear_error(
    cluster: Callable[[str], Cluster], capsys: pytest.CaptureFixture[str]
) -> None:
    ep = cluster("ep-missing")
    ep.provision(1, Resources(ports=[8080]))
    with pytest.raises(
        ClusterError, match=r"port 9090 is not opened on cluster 'ep-missing' \(opened: 8080\)"
    ):
        ep.endpoints(9090)
    capsys.readouterr()
    assert main(["status", "--endpoints", "ep-missing", "9090"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("airflow-sky: error: port 9090 is not opened on cluster 'ep-missing'")


def test_a_cluster_without_ports_has_no_endpoints(
    cluster: Callable[[str], Cluster], capsys: pytest.CaptureFixture[str]
) -> None:
    ep = cluster("ep-none")
    ep.provision(1)
    assert ep.endpoints() == {}
    capsys.readouterr()
    assert main(["status", "--endpoints", "ep-none"]) == 1
    assert "No endpoint found for cluster 'ep-none'" in capsys.readouterr().err


def test_a_task_with_more_ports_on_a_running_cluster_adds_them_on_the_same_nodes(
    cluster: Callable[[str], Cluster],
) -> None:
    ep = cluster("ep-reuse")
    first = ep.provision(2, Resources(ports=[8080]))
    again = ep.provision(2, Resources(ports=[6006, 8081]))
    assert [n.instance_id for n in again] == [n.instance_id for n in first]
    assert ep.opened_ports() == ("6006", "8080-8081")  # as SkyPilot: the union, nothing closed
    ep.provision(2, Resources(cpus=1))  # a task without ports keeps the cluster's
    ep.provision(2, Resources(ports=[8080]))  # nor does one asking fewer close any
    assert ep.opened_ports() == ("6006", "8080-8081")
