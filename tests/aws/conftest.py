"""Fixtures for the aws infra: moto in server mode on loopback, and local nodes that play the instances.

moto plays EC2, SSM and DynamoDB over real HTTP (the amazon provider's hooks talk to it through the
connection's endpoint_url). Its instances are not machines: tests/play_nodes.py maps each instance id to a
local node (a real SSH server) so that jobs run; nothing ever connects to an address moto returns.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from airflow_sky.infra.aws.cloud import ENDPOINT_RESOLVER_ENV
from tests.envs import patched_environ
from tests.play_nodes import PLAY_ENV, play_cluster
from tests.ports import free_port

REGION = "us-east-1"
ZONE = "us-east-1a"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def boto(service: str, endpoint: str, region: str = REGION) -> Any:
    return boto3.client(service, region_name=region, endpoint_url=endpoint)


def moto_image(endpoint: str, region: str = REGION) -> str:
    return str(boto("ec2", endpoint, region).describe_images()["Images"][0]["ImageId"])


def moto_connection(endpoint: str, ssh_key_file: str) -> dict[str, Any]:
    """An aws connection to moto whose SSH key is `ssh_key_file`, with a state table of its own."""
    return {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {
            "region_name": REGION,
            "endpoint_url": endpoint,
            "airflow_sky": {
                "ssh_key_file": ssh_key_file,
                "ssh_cidr": "10.0.0.0/8",
                "state_table": f"sky-state-{uuid.uuid4().hex[:6]}",
                "regions": [REGION],
            },
        },
    }


@pytest.fixture(scope="module")
def play(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's play nodes (PLAY_NODES, default 6) and the aws_default connection that reaches them.

    The connection carries moto's endpoint and, as its SSH key, the play cluster's key: the key pair EC2
    imports is that key's public half, and the play nodes accept it, as instances launched with it would.
    """
    with play_cluster(tmp_path_factory.mktemp("aws-play"), "awsplay") as play:
        conn = moto_connection(moto_endpoint, play["key"])
        env = {
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
            ENDPOINT_RESOLVER_ENV: "tests.play_nodes:resolve",
        }
        with patched_environ(env):
            yield play | {"conn": conn}


def live_instances(endpoint: str, cluster: str, region: str = REGION) -> list[str]:
    """Instances of `cluster` that are not terminated (or on their way): what would still cost money."""
    ec2 = boto("ec2", endpoint, region)
    found = []
    for reservation in ec2.describe_instances(
        Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [cluster]}]
    )["Reservations"]:
        for i in reservation["Instances"]:
            if i["State"]["Name"] not in ("shutting-down", "terminated"):
                found.append(i["InstanceId"])
    return found


def play_dag_env() -> dict[str, str]:
    """What an `airflow dags test` of an aws DAG on play nodes needs from this process: the moto connection,
    the play resolver (it lives in the tests package) and moto's keys."""
    env = {
        k: os.environ[k]
        for k in (
            "AIRFLOW_CONN_AWS_DEFAULT",
            ENDPOINT_RESOLVER_ENV,
            PLAY_ENV,
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        )
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env
