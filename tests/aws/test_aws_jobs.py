"""A whole sky_job on the aws infra, through real Airflow (`airflow dags test`).

moto (server mode) plays EC2, SSM and DynamoDB; local nodes play the instances it launches (the test-only
resolver in tests/play_nodes.py maps instance ids to them). A spot interruption is what AWS would do:
the instance is terminated in EC2 and the machine playing it dies with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.aws.conftest import REGION, boto, live_instances, play_dag_env
from tests.aws.test_aws_contract import TEST_IMAGE_PARAMETER, published_image  # noqa: F401 - fixture
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.play_nodes import lose_when_started

REPO = Path(__file__).resolve().parents[2]


def _rank_instance(endpoint: str, cluster: str, rank: int) -> str | None:
    for r in boto("ec2", endpoint).describe_instances(
        Filters=[
            {"Name": "tag:airflow-sky-cluster", "Values": [cluster]},
            {"Name": "tag:airflow-sky-rank", "Values": [str(rank)]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )["Reservations"]:
        for i in r["Instances"]:
            return str(i["InstanceId"])
    return None


def _interrupt(endpoint: str, cluster: str) -> str:
    """A spot interruption as AWS does it: rank 1's instance is terminated."""
    instance = _rank_instance(endpoint, cluster, 1)
    assert instance is not None
    boto("ec2", endpoint).terminate_instances(InstanceIds=[instance])
    return instance


def test_a_spot_job_on_aws_runs_recovers_an_interrupted_rank_and_leaves_no_instance(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    moto_endpoint: str,
    play: dict[str, Any],
    published_image: str,  # noqa: F811
) -> None:
    cluster = "aws-e2e"
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

task = Task(
    name="spotjob",
    num_nodes=2,
    resources=Resources(
        infra="aws/{REGION}", instance_type="m6i.2xlarge", use_spot=True,
        image_id="resolve:ssm:{TEST_IMAGE_PARAMETER}",
    ),
    envs={{"PROBE": {str(tmp_path)!r}}},
    setup='echo "$SKYPILOT_SETUP_NODE_RANK" >> "$PROBE/setups"',
    run='echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT $SKYPILOT_NUM_NODES" >> "$PROBE/starts"; '
        'echo "$SKYPILOT_CLUSTER_INFO" > "$PROBE/info-$SKYPILOT_NODE_RANK"; sleep 6',
)
with DAG("aws_spot_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=True)
"""
    env = play_dag_env()
    interrupter = lose_when_started(tmp_path, play, lambda: _interrupt(moto_endpoint, cluster))
    result = run_dag("aws_spot_job", source, env=env)
    interrupter.join(timeout=1)
    assert result.returncode == 0, result.digest
    starts = [line.split() for line in (tmp_path / "starts").read_text().splitlines()]
    by_generation = {g: sorted(s[0] for s in starts if s[1] == g) for g in ("0", "1")}
    assert by_generation == {"0": ["0", "1"], "1": ["0", "1"]}, starts
    assert "RECOVER: node of rank 1 lost" in result.output
    assert sorted((tmp_path / "setups").read_text().split()).count("1") == 2  # the new node was set up
    info = json.loads((tmp_path / "info-0").read_text())
    assert (info["cloud"], info["region"], info["cluster_name"]) == ("aws", REGION, cluster)
    assert live_instances(moto_endpoint, cluster) == []
