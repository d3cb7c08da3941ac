"""The contract every Cloud implementation passes. A driver's test module subclasses CloudContract.

Subclasses provide `cloud` (a fixture returning the driver) and `leftovers(cluster)` (what of the cluster
still exists outside the driver's own view: processes, instances), and may provide `failing_cloud`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import Cloud, NodeStatus, ProvisionRequest
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.client import NodeClient
from airflow_sky.task import Resources


class CloudContract:
    @pytest.fixture
    def cloud(self) -> Cloud:
        raise NotImplementedError

    @pytest.fixture
    def failing_cloud(self) -> Cloud | None:
        """A driver configured so that provisioning fails midway, or None if the driver cannot simulate it."""
        return None

    def leftovers(self, cluster_name: str) -> list[object]:
        raise NotImplementedError

    @pytest.fixture
    def cluster(self, cloud: Cloud) -> Iterator[str]:
        name = f"contract-{uuid.uuid4().hex[:8]}"
        yield name
        cloud.terminate(name)

    def test_provision_returns_running_nodes_ranked_head_first(self, cloud: Cloud, cluster: str) -> None:
        nodes = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        assert [n.rank for n in nodes] == [0, 1]
        assert all(n.status is NodeStatus.RUNNING for n in nodes)
        assert len({n.internal_ip for n in nodes}) == 2
        assert all(n.host_key for n in nodes), "host keys must be learned at provision time to pin them"

    def test_nodes_are_reachable_over_ssh_with_the_cluster_key(self, cloud: Cloud, cluster: str) -> None:
        nodes = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        for node in nodes:
            with NodeClient(node, cloud.key_file_for(cluster, node)) as client:
                assert client.exec("echo ok") == (0, b"ok\n", b"")

    def test_provision_is_idempotent(self, cloud: Cloud, cluster: str) -> None:
        first = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        second = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        assert [n.instance_id for n in second] == [n.instance_id for n in first]

    def test_nodes_reads_the_cluster_back_without_side_effects(self, cloud: Cloud, cluster: str) -> None:
        provisioned = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        assert cloud.nodes(cluster) == provisioned
        assert cloud.nodes(cluster) == provisioned

    def test_replace_keeps_the_rank_on_a_new_node(self, cloud: Cloud, cluster: str) -> None:
        old = cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        new = cloud.replace(cluster, 1)
        assert new.rank == 1 and new.status is NodeStatus.RUNNING
        assert new.instance_id != old[1].instance_id
        assert [n.instance_id for n in cloud.nodes(cluster)] == [old[0].instance_id, new.instance_id]

    def test_terminate_leaves_nothing(self, cloud: Cloud, cluster: str) -> None:
        cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=2))
        cloud.terminate(cluster)
        assert cloud.nodes(cluster) == []
        assert self.leftovers(cluster) == []

    def test_opened_ports_are_the_ports_asked_at_provision_and_go_with_the_cluster(
        self, cloud: Cloud, cluster: str
    ) -> None:
        assert cloud.opened_ports(cluster) == ()
        nodes = cloud.provision(ProvisionRequest(cluster, 1, Resources(ports=[6006, "8265"])))
        assert cloud.opened_ports(cluster) == ("6006", "8265")
        # What `status --endpoints` prints: each port on the head's reachable (SSH) address.
        head = nodes[0].ssh_host
        assert Cluster(cluster, cloud.name, cloud).endpoints() == {6006: f"{head}:6006", 8265: f"{head}:8265"}
        cloud.provision(ProvisionRequest(cluster, 1))  # no ports asked: the cluster keeps its own
        assert cloud.opened_ports(cluster) == ("6006", "8265")
        cloud.terminate(cluster)
        assert cloud.opened_ports(cluster) == ()

    def test_terminate_of_an_unknown_cluster_is_a_no_op(self, cloud: Cloud) -> None:
        cloud.terminate(f"never-existed-{uuid.uuid4().hex[:6]}")

    def test_failed_provision_cleans_up_after_itself(self, failing_cloud: Cloud | None, cluster: str) -> None:
        if failing_cloud is None:
            return  # this driver cannot inject a mid-provision failure; covered by its own tests
        with pytest.raises(ClusterError):
            failing_cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=3))
        assert failing_cloud.nodes(cluster) == []
        assert self.leftovers(cluster) == []

    def test_state_store_writes_only_at_the_version_read(self, cloud: Cloud, cluster: str) -> None:
        cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=1))
        store = cloud.state_store(cluster)
        assert store.get("jobs/1") is None
        first = store.put("jobs/1", {"status": "INIT"}, None)
        assert first is not None and store.put("jobs/1", {"status": "X"}, None) is None  # exists
        second = store.put("jobs/1", {"status": "RUNNING"}, first.version)
        assert second is not None and second.version != first.version
        assert store.put("jobs/1", {"status": "LOST"}, first.version) is None  # a stale writer loses
        assert store.get("jobs/1") == second
        assert store.keys("jobs") == ["jobs/1"]

    def test_state_store_stamps_each_record_on_its_own_clock(self, cloud: Cloud, cluster: str) -> None:
        cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=1))
        store = cloud.state_store(cluster)
        first = store.put("jobs/1", {"status": "INIT"}, None)
        assert first is not None and first.written_at is not None
        read = store.get("jobs/1")
        assert (
            read is not None and read.written_at is not None and abs(read.written_at - first.written_at) < 2
        )
        now = store.now()  # the clock the stamps are on (no worker's: see tests/gang/test_fencing.py)
        assert first.written_at - 2 <= now < time.time() + 3600
        second = store.put("jobs/1", {"status": "RUNNING"}, first.version)
        assert (
            second is not None and second.written_at is not None and second.written_at >= first.written_at - 2
        )

    def test_state_store_goes_with_the_cluster(self, cloud: Cloud, cluster: str) -> None:
        cloud.provision(ProvisionRequest(cluster_name=cluster, num_nodes=1))
        cloud.state_store(cluster).put("jobs/1", {"status": "INIT"}, None)
        cloud.terminate(cluster)
        assert cloud.state_store(cluster).get("jobs/1") is None
