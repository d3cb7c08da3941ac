"""The Cloud contract run against the aws infra: moto (server mode) plays EC2, SSM and DynamoDB; local
nodes play the instances (tests/play_nodes.py, test-only)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_sky.infra.aws.cloud import AwsCloud
from airflow_sky.infra.aws.instances import Member
from airflow_sky.infra.base import Endpoint
from tests.aws.conftest import REGION, ZONE, boto, live_instances, moto_image
from tests.infra.contract import CloudContract

TEST_IMAGE_PARAMETER = "/test/airflow-sky/dlami"


class MotoAwsCloud(AwsCloud):
    """AwsCloud whose default image is published under a test parameter: moto refuses to store one under
    the reserved /aws/ names the real images use. Waits are short: the play nodes are already up."""

    image_parameters = {"x86_64": TEST_IMAGE_PARAMETER, "arm64": TEST_IMAGE_PARAMETER}

    def __init__(self, location: str = f"{REGION}/{ZONE}", conn_id: str | None = None) -> None:
        super().__init__(location, conn_id)
        self.poll_s = 0.2
        self.ssh_timeout_s = 20


@pytest.fixture(scope="module")
def published_image(moto_endpoint: str) -> str:
    image = moto_image(moto_endpoint)
    boto("ssm", moto_endpoint).put_parameter(
        Name=TEST_IMAGE_PARAMETER, Value=image, Type="String", Overwrite=True
    )
    return image


class _ThirdNeverAnswers(MotoAwsCloud):
    """Fault injection: the third instance's machine never answers SSH, so provisioning fails after launch."""

    def _endpoint(self, m: Member) -> Endpoint:
        endpoint = super()._endpoint(m)
        if m.rank == 2:
            return Endpoint("127.0.0.254", 1, endpoint.user, endpoint.internal_ip, endpoint.host_key)
        return endpoint


class TestAwsCloud(CloudContract):
    @pytest.fixture(autouse=True)
    def _env(self, play: dict[str, Any], moto_endpoint: str, published_image: str) -> None:
        self.endpoint = moto_endpoint
        self.table = play["conn"]["extra"]["airflow_sky"]["state_table"]

    @pytest.fixture
    def cloud(self) -> AwsCloud:
        return MotoAwsCloud()

    @pytest.fixture
    def failing_cloud(self) -> AwsCloud:
        cloud = _ThirdNeverAnswers()
        cloud.ssh_timeout_s = 2
        return cloud

    def leftovers(self, cluster_name: str) -> list[object]:
        records = boto("dynamodb", self.endpoint).query(
            TableName=self.table,
            KeyConditionExpression="#c = :c",
            ExpressionAttributeNames={"#c": "cluster"},
            ExpressionAttributeValues={":c": {"S": cluster_name}},
        )["Items"]
        return [*live_instances(self.endpoint, cluster_name), *(json.dumps(r) for r in records)]
