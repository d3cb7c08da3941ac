"""`airflow-sky launch -c C 'echo hi'` on aws, through the real CLI (a real DAG run in its process).

moto (server mode) plays EC2, SSM and DynamoDB; one local play node plays the instance it launches
(tests/play_nodes.py), so the command really runs; `--down` leaves no instance behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.infra.aws.cloud import ENDPOINT_RESOLVER_ENV
from tests.aws.conftest import REGION, live_instances, moto_connection, moto_endpoint  # noqa: F401 - fixture
from tests.aws.test_aws_contract import TEST_IMAGE_PARAMETER, published_image  # noqa: F401 - fixture
from tests.play_nodes import PLAY_ENV, play_cluster

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def aws_env(
    moto_endpoint: str,  # noqa: F811
    published_image: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """The CLI's environment: the aws_default connection to moto, and one play node behind it."""
    with play_cluster(tmp_path_factory.mktemp("forms-aws-play"), "formsaws", size=1) as play:
        env = dict(os.environ)
        env.pop("AIRFLOW_HOME", None)
        env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("forms-aws-airflow"))
        home = tmp_path_factory.mktemp("forms-aws-home")
        env["AIRFLOW_SKY_HOME"] = str(home)
        env["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(moto_connection(moto_endpoint, play["key"]))
        env[ENDPOINT_RESOLVER_ENV] = "tests.play_nodes:resolve"  # the resolver lives in the tests package
        env[PLAY_ENV] = str(play["file"])
        env["PYTHONPATH"] = str(REPO)
        yield env


def test_launch_runs_a_command_on_aws_and_leaves_no_instance(
    aws_env: dict[str, str],
    moto_endpoint: str,  # noqa: F811
) -> None:
    cluster = "awscmd"
    flags = ["--infra", f"aws/{REGION}", "--instance-type", "m6i.large", "-y", "--down"]
    flags += ["--image-id", f"resolve:ssm:{TEST_IMAGE_PARAMETER}"]
    result = subprocess.run(
        [*CLI, "launch", "-c", cluster, *flags, 'echo "hi on $SKYPILOT_CLUSTER_INFO"'],
        env=aws_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "hi on {" in line]
    info = json.loads(line.split("hi on ", 1)[1])
    assert (info["cluster_name"], info["cloud"], info["region"]) == (cluster, "aws", REGION)
    assert live_instances(moto_endpoint, cluster) == []
    # The summary names what the launch cost: its node-hours at the catalog's on-demand price.
    (cost,) = [line for line in result.stdout.splitlines() if line.startswith("Cost: $")]
    assert "node-hours of m6i.large on demand at $" in cost and "catalog of " in cost, cost
