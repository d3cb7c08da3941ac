"""Fixtures for the gcp infra: the fake GCE and GCS APIs (no emulator exists) and local nodes playing VMs.

The google-cloud-compute and google-cloud-storage clients talk to them over real HTTP through the
connection's `compute_endpoint` / `storage_endpoint` (anonymous credentials, allowed only for such local
endpoints); tests/play_nodes.py maps each VM name to a local node; nothing connects to the addresses the fake
GCE returns.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sky.infra.gcp.cloud import ENDPOINT_RESOLVER_ENV
from tests.envs import patched_environ
from tests.gcp.fake_gce import FakeGce
from tests.gcp.fake_gcs import FakeGcs
from tests.play_nodes import play_cluster

PROJECT = "test-project"
REGION = "us-central1"
ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def gce() -> Iterator[FakeGce]:
    fake = FakeGce(PROJECT).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def gcs() -> Iterator[FakeGcs]:
    fake = FakeGcs().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def gplay(gce: FakeGce, gcs: FakeGcs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's play nodes and the google_cloud_default connection that reaches the fakes and them."""
    with play_cluster(tmp_path_factory.mktemp("gcp-play"), "gcpplay") as play:
        conn = {
            "conn_type": "google_cloud_platform",
            "extra": {
                "project": PROJECT,
                "airflow_sky": {
                    "ssh_key_file": play["key"],
                    "ssh_cidr": "10.0.0.0/8",
                    "state_bucket": f"sky-state-{uuid.uuid4().hex[:6]}",
                    "regions": [REGION],
                    "compute_endpoint": gce.endpoint,
                    "storage_endpoint": gcs.endpoint,
                    "anonymous_credentials": True,
                },
            },
        }
        env = {
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(conn),
            ENDPOINT_RESOLVER_ENV: "tests.play_nodes:resolve",
        }
        with patched_environ(env):
            yield play | {"conn": conn}
