"""The local infra leaves nothing behind after a failure, and `local up` never keeps a size silently.

Real node servers under the test run's local root; GPU shares are refused by the real count of this
machine's GPUs (1000 per node is more than any machine has).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_sky.client.cli.local import shrink_refusal
from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import NodeStatus, ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.task import Resources

CLI = [sys.executable, "-m", "airflow_sky.client.cli", "local"]
TOO_MANY_GPUS = Resources(accelerators="L4:1000")


def _homes() -> set[str]:
    return set(os.listdir(layout.homes_root()))


def test_a_refused_provision_leaves_no_node_dir_home_tmp_or_cluster_dir() -> None:
    cloud = LocalCloud()
    before = _homes()
    for _ in range(2):  # it used to leave one more node dir and home each time
        with pytest.raises(ClusterError, match="accelerators:"):
            cloud.provision(ProvisionRequest("nogpu", 2, TOO_MANY_GPUS))
    assert not layout.cluster_dir("nogpu").exists()
    assert _homes() == before
    assert "nogpu" not in cloud.clusters()


def test_a_failed_grow_keeps_the_running_node_and_leaks_nothing(local_cluster) -> None:
    name, nodes, _ = local_cluster(1)
    cloud = LocalCloud()
    before = _homes()
    with pytest.raises(ClusterError, match="accelerators:"):
        cloud.provision(ProvisionRequest(name, 2, TOO_MANY_GPUS))
    assert [(n.rank, n.instance_id, n.status) for n in cloud.nodes(name)] == [
        (0, nodes[0].instance_id, NodeStatus.RUNNING)
    ]
    assert [p.name for p in layout.instances_dir(name).iterdir()] == [nodes[0].instance_id]
    assert _homes() == before


def test_a_node_that_never_gets_ready_goes_with_its_process_and_dirs() -> None:
    cloud = LocalCloud(ready_timeout_s=0.001)  # no server answers that fast: the wait fails
    before = _homes()
    with pytest.raises(ClusterError):
        cloud.provision(ProvisionRequest("unready", 1))
    assert not layout.cluster_dir("unready").exists()
    assert _homes() == before
    assert daemon.processes_with_marker("unready") == []


def test_up_with_fewer_nodes_than_the_cluster_has_is_refused_in_one_line() -> None:
    def up(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "up", "shrink", *args], capture_output=True, text=True, timeout=120)

    try:
        assert up("--nodes", "2").returncode == 0
        refused = up("--nodes", "1")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
        assert "local cluster shrink has 2 nodes" in refused.stderr
        assert "airflow-sky local down shrink" in refused.stderr and "--nodes 2" in refused.stderr
        assert len(LocalCloud().nodes("shrink")) == 2
        kept = up()  # no --nodes: the cluster's own size
        assert kept.returncode == 0, kept.stderr
        assert kept.stdout.count("RUNNING") == 2
    finally:
        subprocess.run([*CLI, "down", "shrink"], capture_output=True, text=True, timeout=120)
    assert daemon.processes_with_marker("shrink") == []


def test_shrink_refusal_names_the_size_and_both_ways_out() -> None:
    assert shrink_refusal("demo", 3, None) is None
    assert shrink_refusal("demo", 3, 3) is None
    assert shrink_refusal("demo", 3, 4) is None  # a cluster grows in place
    assert shrink_refusal("demo", 0, 2) is None
    assert shrink_refusal("demo", 3, 2) == (
        "--nodes: local cluster demo has 3 nodes, more than 2; to resize it run "
        "`airflow-sky local down demo` then `airflow-sky local up demo --nodes 2`, or keep it with --nodes 3"
    )
