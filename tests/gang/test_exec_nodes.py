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
