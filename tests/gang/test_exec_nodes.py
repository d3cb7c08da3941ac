"""`exec` runs without setup, so it never runs on a node that has not had it: the rule, as a pure function."""

from __future__ import annotations

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.gang.phases import check_exec_nodes
from airflow_sky.infra.base import Node, NodeStatus


def _nodes(*statuses: NodeStatus) -> list[Node]:
    return [
        Node(r, f"10.0.0.{r + 1}", f"10.0.0.{r + 1}", 22, "sky", f"i-{r}", status=s)
        for r, s in enumerate(statuses)
    ]


def test_exec_on_a_cluster_that_is_up_and_big_enough_passes():
    check_exec_nodes("c", "local", _nodes(NodeStatus.RUNNING, NodeStatus.RUNNING), 2, "t.yaml")


def test_exec_that_needs_more_nodes_is_refused_with_the_launch_that_adds_them():
    with pytest.raises(
        ClusterError, match=r"has 2 node\(s\); the task needs 3.*airflow-sky launch -c c t.yaml"
    ):
        check_exec_nodes("c", "local", _nodes(NodeStatus.RUNNING, NodeStatus.RUNNING), 3, "t.yaml")


def test_exec_on_a_cluster_with_a_lost_node_is_refused_naming_the_rank():
    with pytest.raises(ClusterError, match=r"rank 1 is PREEMPTED.*airflow-sky launch -c c t.yaml"):
        check_exec_nodes("c", "local", _nodes(NodeStatus.RUNNING, NodeStatus.PREEMPTED), 2, "t.yaml")


def test_exec_on_no_cluster_is_refused():
    with pytest.raises(ClusterError, match="does not exist on local"):
        check_exec_nodes("c", "local", [], 1, "t.yaml")


def test_exec_on_a_stopped_cluster_suggests_start_not_a_launch_that_reruns_setup():
    with pytest.raises(ClusterError) as stopped:
        check_exec_nodes("c", "local", _nodes(NodeStatus.STOPPED, NodeStatus.STOPPED), 2, "t.yaml")
    assert "is stopped (rank 0 is STOPPED, rank 1 is STOPPED)" in str(stopped.value)
    assert "airflow-sky start c;" in str(stopped.value)
    assert "launch" not in str(stopped.value)


def test_the_suggested_launch_is_the_one_given_with_all_its_flags():
    launch = "airflow-sky launch -c c t.yaml --num-nodes 3 --env 'A=b c'"
    with pytest.raises(ClusterError) as missing:
        check_exec_nodes("c", "local", [], 3, "t.yaml", launch_command=launch)
    assert f"run `{launch}`" in str(missing.value)
    with pytest.raises(ClusterError) as small:
        check_exec_nodes("c", "local", _nodes(NodeStatus.STOPPED), 3, "t.yaml", launch_command=launch)
    assert f"run `{launch}`" in str(small.value)  # too small: a launch grows it (and starts the stopped)


def test_exec_on_no_cluster_names_the_closest_known_cluster():
    with pytest.raises(ClusterError) as missing:
        check_exec_nodes("trian", "local", [], 1, "t.yaml", known_clusters=["train", "dev"])
    message = str(missing.value)
    assert message.startswith("cluster 'trian' does not exist on local; launch it first")
    assert message.endswith("runs setup; did you mean 'train'?")
