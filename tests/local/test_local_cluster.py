"""The embedded local cluster: real node processes serving SSH on their own loopback addresses."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.errors import RemoteError
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.client import NodeClient


def test_three_nodes_have_distinct_addresses_and_homes(local_cluster):
    _, nodes, key = local_cluster(3)
    assert [n.rank for n in nodes] == [0, 1, 2]
    assert len({n.internal_ip for n in nodes}) == 3
    assert all(n.internal_ip.startswith("127.") and n.status is NodeStatus.RUNNING for n in nodes)
    homes = set()
    for node in nodes:
        with NodeClient(node, key) as client:
            rc, out, _ = client.exec('echo "$HOME"; mkdir -p sky_workdir && cd sky_workdir && pwd')
            assert rc == 0
            home, workdir = out.decode().split()
            assert workdir == f"{home}/sky_workdir"
            homes.add(home)
    assert len(homes) == 3


def test_a_node_keeps_nothing_of_the_launchers_environment_but_locale_and_path(local_cluster, monkeypatch):
    # What an Airflow worker's environment holds: none of it may reach a node's commands.
    fake = {
        "AIRFLOW__CORE__FERNET_KEY": "fernet-key-of-the-worker",
        "AIRFLOW_CONN_WAREHOUSE": "postgres://user:conn-password@db:5432/x",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-of-the-worker",
        "LC_TIME": "C.UTF-8",
    }
    for name, value in fake.items():
        monkeypatch.setenv(name, value)
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        rc, out, _ = client.exec("env")
    assert rc == 0
    env = dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)
    for leaked in ("fernet-key-of-the-worker", "conn-password", "aws-secret-of-the-worker"):
        assert leaked not in out.decode()
    assert env["LC_TIME"] == "C.UTF-8"
    assert str(Path(sys.executable).parent) in env["PATH"].split(":")
    assert "PYTHONPATH" not in env
    assert len(env["HOME"]) <= 50, "a node's home is short: unix sockets under it must fit in 107 bytes"
    assert env["TMPDIR"] != os.environ.get("TMPDIR", "/tmp") or daemon.isolation() is not None


def test_exec_returns_exit_code_stdout_and_stderr(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        assert client.exec("echo out; echo err >&2; exit 7") == (7, b"out\n", b"err\n")
        big = client.exec("head -c 3000000 /dev/zero")
        assert big[0] == 0 and len(big[1]) == 3_000_000


def test_wrong_host_key_is_refused(local_cluster):
    _, nodes, key = local_cluster(2)
    impostor = nodes[1].__class__(
        **{**nodes[1].to_dict(), "host_key": nodes[0].host_key, "status": nodes[1].status}
    )
    client = NodeClient(impostor, key, conn_retry_attempts=1)
    try:
        client.exec("true")
    except Exception as e:
        assert "rank 1" in str(e)
    else:
        raise AssertionError("a node presenting another host key was accepted")
    finally:
        client.close()


def test_a_node_without_a_pinned_host_key_is_refused_not_trusted_on_first_use(local_cluster):
    _, nodes, key = local_cluster(1)
    unpinned = dataclasses.replace(nodes[0], host_key=None)
    with pytest.raises(RemoteError, match=r"no pinned host key.*learns a node's host key when it provisions"):
        NodeClient(unpinned, key).exec("true")


def test_provision_is_idempotent_and_grows_a_cluster(local_cluster):
    name, nodes, _ = local_cluster(2)
    cloud = LocalCloud()
    from airflow_sky.infra.base import ProvisionRequest

    again = cloud.provision(ProvisionRequest(cluster_name=name, num_nodes=2))
    assert [n.instance_id for n in again] == [n.instance_id for n in nodes]
    grown = cloud.provision(ProvisionRequest(cluster_name=name, num_nodes=3))
    assert [n.instance_id for n in grown[:2]] == [n.instance_id for n in nodes]
    assert grown[2].rank == 2 and grown[2].status is NodeStatus.RUNNING


def test_preempt_then_replace_keeps_the_rank_on_a_new_address(local_cluster):
    name, nodes, key = local_cluster(2)
    cloud = LocalCloud()
    preempted = cloud.preempt(name, 1)
    assert preempted.status is NodeStatus.PREEMPTED
    assert daemon.processes_with_marker(daemon.marker(name, nodes[1].instance_id)) == []
    new = cloud.replace(name, 1)
    assert new.rank == 1 and new.status is NodeStatus.RUNNING
    assert new.internal_ip != nodes[1].internal_ip and new.instance_id != nodes[1].instance_id
    assert [n.rank for n in cloud.nodes(name)] == [0, 1]
    with NodeClient(new, key) as client:
        assert client.exec("ls -A")[1] == b""  # a fresh, empty home


def test_local_cli_up_ls_down_leaves_no_process(tmp_path):
    cli = [sys.executable, "-m", "airflow_sky.client.cli", "local"]
    up = subprocess.run([*cli, "up", "clidemo", "--nodes", "3"], capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    ls = subprocess.run([*cli, "ls"], capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0
    ips = [w for w in ls.stdout.split() if w.startswith("127.")]
    assert len(set(ips)) == 3 and ls.stdout.count("RUNNING") == 3
    down = subprocess.run([*cli, "down", "clidemo"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert daemon.processes_with_marker("clidemo") == []


def test_preempt_of_unknown_rank_is_a_one_line_error(local_cluster):
    name, _, _ = local_cluster(1)
    result = subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "local", "preempt", name, "5"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "has no node of rank 5" in result.stderr and "Traceback" not in result.stderr


def test_clusters_of_the_same_name_in_two_state_roots_never_touch_each_other(tmp_path, monkeypatch):
    cloud = LocalCloud()
    monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path / "alice"))
    alice = cloud.provision(ProvisionRequest(cluster_name="twin", num_nodes=1))
    try:
        monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path / "bob"))
        bob = cloud.provision(ProvisionRequest(cluster_name="twin", num_nodes=1))
        servers = [p for p in daemon.processes_with_marker("twin") if p.name() != "unshare"]
        assert len(servers) == 1  # bob's node server (and its namespace's unshare), not alice's
        assert bob[0].internal_ip != alice[0].internal_ip or bob[0].ssh_port != alice[0].ssh_port
        cloud.terminate("twin")  # bob's
        assert daemon.processes_with_marker("twin") == []
        monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path / "alice"))
        assert [n.status for n in cloud.nodes("twin")] == [NodeStatus.RUNNING]
        with NodeClient(alice[0], cloud.ssh_private_key("twin")) as client:
            assert client.exec("echo still here")[1].strip() == b"still here"
    finally:
        monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path / "alice"))
        cloud.terminate("twin")
    assert daemon.processes_with_marker("twin") == []
