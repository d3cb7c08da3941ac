"""The provision log on aws (moto): a launch through Cluster.provision records the driver's own lines and
one line per instance in the DynamoDB state table, and a teardown removes it with the cluster."""

from __future__ import annotations

import logging

import pytest

from airflow_sky.infra import provision_log
from airflow_sky.infra.cluster import Cluster
from tests.aws.conftest import REGION
from tests.aws.test_aws_cloud import M6I, cluster  # noqa: F401 - the module's cluster fixture
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture


def test_a_launch_keeps_its_provision_log_in_the_state_table_until_the_cluster_goes(
    cluster: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=provision_log.INFRA_LOGGER)  # as an Airflow task's logging does
    handle = Cluster(cluster, f"aws/{REGION}", MotoAwsCloud(REGION))
    nodes = handle.provision(2, M6I)
    lines: list[str] = []
    record = provision_log.show(handle.state_store(), lines.append, follow=False)
    assert record is not None and record["ended"] is True and record["ok"] is True
    text = [line.split(" ", 2)[2] for line in lines]
    assert text[0] == f"Provisioning cluster {cluster}: 2 node(s) (0 existing, 0 of them running)"
    assert any(t.startswith(f"aws: {cluster}: launching 2 x ") for t in text), text  # the driver's line
    for node in nodes:
        role = "head" if node.rank == 0 else f"worker{node.rank}"
        assert f"rank {node.rank} ({role}): {node.internal_ip}, instance {node.instance_id}, RUNNING" in text
    assert handle.provision(2, M6I) == nodes  # a reuse provisions nothing and keeps the log as it was
    assert provision_log.read(handle.state_store()) == record
    handle.terminate()
    assert provision_log.read(handle.state_store()) is None
