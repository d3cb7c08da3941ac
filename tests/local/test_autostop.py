"""Autostop's dead-man switch on real local nodes: the node stops itself when idle, and only then.

The watcher runs on the node (tests shorten its check interval); a local node's stop action asks its
server to stop (disk kept, provisioning starts it again) or to end the node (autodown).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.autostop import NodeAutostop, arm_command, disarm_command, status_command
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import poll_job, start_job


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def _status(cluster: str) -> list[NodeStatus]:
    return [n.status for n in LocalCloud().nodes(cluster)]


def test_an_idle_node_stops_itself_and_provisioning_starts_it_again_with_its_disk(local_cluster) -> None:
    cluster, nodes, key = local_cluster(1)
    autostop = NodeAutostop(idle_s=0, action=LocalCloud().autostop_action(cluster, down=False), check_s=0.3)
    with NodeClient(nodes[0], key) as client:
        assert client.exec("echo kept > ~/kept")[0] == 0
        assert client.exec(arm_command(autostop))[0] == 0
        assert client.exec(status_command())[1].split() == [b"0", b"1"]  # armed, watcher running
    _wait_for(lambda: _status(cluster) == [NodeStatus.STOPPED], 15, "the idle node stops")
    _wait_for(lambda: daemon.processes_with_marker(cluster) == [], 5, "the watcher goes with the node")

    again = LocalCloud().provision(ProvisionRequest(cluster, 1))
    assert [n.status for n in again] == [NodeStatus.RUNNING]
    assert again[0].instance_id == nodes[0].instance_id and again[0].host_key == nodes[0].host_key
    with NodeClient(again[0], key) as client:
        assert client.exec("cat ~/kept")[1] == b"kept\n"


def test_a_running_job_and_airflows_polls_keep_the_node_up_and_autodown_then_ends_it(local_cluster) -> None:
    cluster, nodes, key = local_cluster(1)
    autostop = NodeAutostop(idle_s=2, action=LocalCloud().autostop_action(cluster, down=True), check_s=0.3)
    with NodeClient(nodes[0], key) as client:
        start_job(client, "long", "sleep 4", {}, autostop=autostop)  # a start arms the watcher too
        time.sleep(4.5)
        assert _status(cluster) == [NodeStatus.RUNNING], "a node must not stop under a running job"
        for _ in range(8):  # a follower polling the finished job: Airflow is alive
            assert poll_job(client, "long", 0, 0).exit_code == 0
            last_poll = time.monotonic()
            time.sleep(0.5)
        assert _status(cluster) == [NodeStatus.RUNNING], "a node must not stop while Airflow uses it"
    _wait_for(lambda: _status(cluster) == [], 15, "the abandoned node ends itself")
    assert time.monotonic() - last_poll >= 1.0  # the 2 s limit, counted from the last poll (mtimes: 1 s)
    # Nothing of it stays: its server removes its dir on the way out, also from inside its own mount
    # namespace (CI, as root), and a cluster all of whose nodes ended is no cluster any more.
    _wait_for(lambda: daemon.processes_with_marker(cluster) == [], 10, "the node's server exits")
    assert not any(layout.instances_dir(cluster).iterdir())
    assert cluster not in LocalCloud().clusters()


def test_even_a_zero_limit_waits_two_rounds_so_gaps_between_a_dags_tasks_never_stop_a_node(
    local_cluster,
) -> None:
    cluster, nodes, key = local_cluster(1)
    autostop = NodeAutostop(idle_s=0, action=LocalCloud().autostop_action(cluster, down=False), check_s=1.5)
    with NodeClient(nodes[0], key) as client:
        client.exec(arm_command(autostop))
    armed = time.monotonic()
    _wait_for(lambda: _status(cluster) == [NodeStatus.STOPPED], 20, "the idle node stops")
    assert time.monotonic() - armed >= 2.0
    _wait_for(lambda: daemon.processes_with_marker(cluster) == [], 5, "the node's processes end")


def test_autostop_false_disarms_a_node(local_cluster) -> None:
    _, nodes, key = local_cluster(1)
    autostop = NodeAutostop(idle_s=600, action="true", check_s=0.3)
    with NodeClient(nodes[0], key) as client:
        client.exec(arm_command(autostop))
        client.exec(disarm_command())
        _wait_for(lambda: client.exec(status_command())[1].split() == [b"-", b"0"], 5, "the watcher exits")


def test_an_ssh_pool_refuses_autostop_before_anything_is_locked() -> None:
    from airflow_sky.infra.cluster import Cluster
    from airflow_sky.infra.ssh.cloud import SshCloud
    from airflow_sky.task import Resources

    cluster = Cluster("c", "ssh/box", SshCloud("box"))  # the pool is never read: nothing connects
    assert cluster.autostop_for(Resources()) is None
    with pytest.raises(
        ClusterError, match=r"resources\.autostop: the ssh infra has no way for a node to stop"
    ):
        cluster.autostop_for(Resources(autostop="10m"))
