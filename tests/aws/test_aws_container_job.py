"""A whole container job (`image_id: docker:<image>`) on the aws infra, through real Airflow (`airflow dags test`).

moto (server mode) plays EC2, SSM and DynamoDB; local nodes play the instances (tests/play_nodes.py), and
Podman on this machine is their container runtime. The image is a localhost/ one (never pulled: used as
present on the node). The play nodes ran no boot prep (aws user data), so the sync's ensure step finds no
prep marker and goes on at once. An instance's container is named after its EC2 instance id and lives as
long as the VM: the infra terminates instances and removes no container, so the harness makes an instance
moto terminated take its container with it (play_nodes.instances_take_their_containers).
"""

from __future__ import annotations

import datetime
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ssm.models import Parameter, ssm_backends

from airflow_sky.infra.aws.network import DEFAULT_IMAGE_PARAMETERS
from airflow_sky.node.container import instance_container_name
from airflow_sky.node.container_login import PREP_RUNNING
from tests.aws.conftest import REGION, boto, live_instances, moto_image, play_dag_env
from tests.containers import images
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.play_nodes import instances_take_their_containers

pytestmark = pytest.mark.timeout(1500)  # the base image is built once per machine (debootstrap)

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "aws-ctr"
IMAGE_ID = f"docker:{images.BASE_IMAGE}"

# Where each step ran: the container (Podman's /run/.containerenv; this machine's /.dockerenv is not in the
# image), the image's Debian release and SkyPilot's env.
WHERE = (
    "ctr=$(test -f /run/.containerenv && echo yes || echo no) host=$(test -e /.dockerenv && echo yes || echo no) "
    "debian=$(cat /etc/debian_version)"
)
SETUP = f'echo "probe setup rank=$SKYPILOT_SETUP_NODE_RANK {WHERE}"'
RUN = (
    f'echo "probe run rank=$SKYPILOT_NODE_RANK nodes=$SKYPILOT_NUM_NODES {WHERE} '
    'cloud=$(python3 -c \'import json, os; print(json.loads(os.environ["SKYPILOT_CLUSTER_INFO"])["cloud"])\')"'
)


@pytest.fixture(scope="module")
def default_image(moto_endpoint: str) -> str:
    """The default image (a container task runs on it) published where AWS publishes it: moto refuses a
    put under the reserved /aws/ names, so the parameter goes into the server's store as its own defaults do."""
    image = moto_image(moto_endpoint)
    store = ssm_backends[DEFAULT_ACCOUNT_ID][REGION]._parameters
    for name in set(DEFAULT_IMAGE_PARAMETERS.values()):
        store[name].append(
            Parameter(  # type: ignore[abstract]  # as moto's own defaults are made
                account_id=DEFAULT_ACCOUNT_ID,
                name=name,
                value=image,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=datetime.datetime.now(datetime.UTC),
                version=1,
                data_type="aws:ec2:image",
            )
        )
    return image


def _terminated(endpoint: str) -> Any:
    """Which of these instance ids EC2 (moto) no longer runs: terminated, on its way, or unknown."""

    def gone(ids: list[str]) -> Iterable[str]:
        found = boto("ec2", endpoint).describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])
        alive = {
            i["InstanceId"]
            for r in found["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] not in ("shutting-down", "terminated")
        }
        return set(ids) - alive

    return gone


@pytest.fixture
def vms_end_with_containers(play: dict[str, Any], moto_endpoint: str) -> Iterator[None]:
    with instances_take_their_containers(play, _terminated(moto_endpoint)):
        yield


def _cluster_instances(endpoint: str) -> list[str]:
    return [
        i["InstanceId"]
        for r in boto("ec2", endpoint).describe_instances(
            Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [CLUSTER]}]
        )["Reservations"]
        for i in r["Instances"]
    ]


def test_a_docker_job_on_aws_runs_setup_and_run_in_the_image_on_both_ranks_and_leaves_no_container(
    run_dag: Any,  # noqa: F811
    moto_endpoint: str,
    play: dict[str, Any],
    default_image: str,
    vms_end_with_containers: None,
) -> None:
    images.base_image()
    assert not os.path.exists(PREP_RUNNING), f"{PREP_RUNNING} exists: the ensure step would wait for it"
    before = set(images.node_containers())
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

task = Task(
    name="ctrjob",
    num_nodes=2,
    resources=Resources(infra="aws/{REGION}", instance_type="m6i.2xlarge", image_id={IMAGE_ID!r}),
    setup={SETUP!r},
    run={RUN!r},
)
with DAG("aws_container_job", schedule=None) as dag:
    sky_job(task, cluster_name={CLUSTER!r}, down=True)
"""
    env = play_dag_env()
    env["AIRFLOW__SKY__DOCKER_RUN_OPTIONS"] = images.RUN_OPTIONS
    result = run_dag("aws_container_job", source, env=env)
    out = result.output
    assert result.returncode == 0, result.digest
    for rank in (0, 1):
        assert f"probe setup rank={rank} ctr=yes host=no debian=12." in out, out[-6000:]
        run_line = rf"probe run rank={rank} nodes=2 ctr=yes host=no debian=12\.\d+ cloud=aws\b"
        assert re.search(run_line, out), out[-6000:]
        # The ensure step started the container without waiting: no boot prep ran on the play node (its
        # record says so in the provision log), so there was no marker to wait for.
        assert f"rank {rank}: no container prep record on this node yet" in out, out[-6000:]
        assert f"rank {rank}: pulled {images.BASE_IMAGE} with podman in" in out
    instances = _cluster_instances(moto_endpoint)
    assert len(instances) == 2
    assert live_instances(moto_endpoint, CLUSTER) == []
    ours = {instance_container_name(i) for i in instances}
    deadline = time.monotonic() + 120  # the harness removes a terminated instance's container within a poll
    while ours & set(images.node_containers()) and time.monotonic() < deadline:
        time.sleep(1)
    left = set(images.node_containers()) - before
    assert not ours & left, f"a container outlived its instance: {sorted(ours & left)}"
