"""`down` of an aws cluster this machine lost the record of: found through the infra, and terminated.

moto (server mode) plays EC2 and DynamoDB; local play nodes play the instances (tests/aws/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sky.client import cluster_index
from airflow_sky.client.cli import main
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.home import HOME_ENV
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
from airflow_sky.task import Resources
from tests.aws.conftest import REGION, live_instances, moto_endpoint, play  # noqa: F401 - fixtures
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - fixture


@pytest.fixture
def lost_cluster(
    play: dict[str, Any],  # noqa: F811
    published_image: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    """An aws cluster of two instances that this machine's index does not name (a fresh sky home)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "sky-home"))
    monkeypatch.setenv(POOL_FILE_ENV, str(tmp_path / "no-pools.yaml"))
    name = "lost-aws"
    MotoAwsCloud(REGION).provision(ProvisionRequest(name, 2, Resources(instance_type="m6i.2xlarge")))
    yield name
    MotoAwsCloud(REGION).terminate(name)


def test_down_of_an_aws_cluster_missing_from_the_index_finds_and_terminates_its_instances(
    moto_endpoint: str,  # noqa: F811
    lost_cluster: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert len(live_instances(moto_endpoint, lost_cluster)) == 2
    assert cluster_index.read_index() == {}
    # status finds it the same way, and records it again
    assert main(["status", lost_cluster]) == 0
    assert "Clusters (aws)" in capsys.readouterr().out
    assert cluster_index.read_index() == {lost_cluster: "aws"}
    (Path(cluster_index.index_path())).unlink()  # lost again, as after a crash

    assert main(["down", lost_cluster, "-y"]) == 0
    assert f"Cluster {lost_cluster} terminated." in capsys.readouterr().out
    assert live_instances(moto_endpoint, lost_cluster) == []
    assert cluster_index.read_index() == {}

    # Found nowhere now: the error names every infra asked, and the one not set up here.
    assert main(["down", lost_cluster, "-y"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"airflow-sky: error: cluster {lost_cluster!r} not found (searched: local, aws")
    assert "gcp (no Airflow connection 'google_cloud_default')" in err and "Traceback" not in err
