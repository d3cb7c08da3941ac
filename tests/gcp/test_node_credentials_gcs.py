"""gcs node credentials: a downscoped token (Credential Access Boundary) of the connection's credentials,
never its key file.

Google's token exchange (sts.googleapis.com) is unreachable here and no fake of it exists: the boundary the
code builds is checked as the exchange would receive it (google.auth's own serialisation), and the one
network step, the downscoped Credentials' refresh, is replaced by a stand-in that returns a token, to
show what the node's remote then holds. No emulator evaluates the boundary's CEL conditions.
"""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import downscoped

from airflow_sky.errors import SkyError
from airflow_sky.node import buckets
from airflow_sky.node.credential_scope import GCS_ROLE, Scope, gcs_boundary_rules, job_scopes
from airflow_sky.node.credentials import downscoped_credentials
from airflow_sky.task.storage import COPY, BucketMount
from tests.envs import patched_environ

MOUNTS = [
    BucketMount("~/sky_workdir", "gcs", "jobs-bucket", "uploads/run-3/workdir", COPY),
    BucketMount("/ckpt", "gcs", "ckpt-bucket"),
]


def _key_file() -> dict[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": "sky-test",
        "private_key_id": uuid.uuid4().hex,
        "private_key": pem,
        "client_email": "provisioner@sky-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


def test_the_boundary_has_a_rule_per_bucket_and_conditions_for_folders() -> None:
    rules = gcs_boundary_rules(job_scopes(MOUNTS))
    assert [r["available_resource"] for r in rules] == [
        "//storage.googleapis.com/projects/_/buckets/ckpt-bucket",
        "//storage.googleapis.com/projects/_/buckets/jobs-bucket",
    ]
    whole, folder = rules
    assert "availability_condition" not in whole and whole["available_permissions"] == [GCS_ROLE]
    expression = folder["availability_condition"]["expression"]
    own = "projects/_/buckets/jobs-bucket/objects/uploads/run-3/workdir"
    assert f"resource.name.startsWith('{own}/')" in expression
    assert "startsWith('uploads/run-3/workdir/')" in expression  # listing inside the folder
    assert "run-4" not in expression and "startsWith('uploads/')" not in expression


def test_a_folder_that_would_end_the_condition_string_is_refused() -> None:
    with pytest.raises(SkyError, match="quote or backslash"):
        gcs_boundary_rules([Scope("gcs", "b", "x') || true || ('")])


def test_the_exchange_gets_the_boundary_as_google_auth_serialises_it() -> None:
    from google.oauth2 import service_account

    source = service_account.Credentials.from_service_account_info(
        _key_file(), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    token = downscoped_credentials(source, job_scopes(MOUNTS))
    assert isinstance(token, downscoped.Credentials)
    sent = token._credential_access_boundary.to_json()["accessBoundary"]["accessBoundaryRules"]
    assert [r["availableResource"].rsplit("/", 1)[1] for r in sent] == ["ckpt-bucket", "jobs-bucket"]
    assert sent[1]["availabilityCondition"]["expression"].count("uploads/run-3/workdir") == 4


def test_a_node_gets_a_downscoped_token_never_the_key_file(monkeypatch) -> None:
    key = _key_file()
    conn = {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(key)}}
    expiry = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(hours=1)

    def exchange(self, request):  # a stand-in for Google's STS token exchange (unreachable here)
        assert self._credential_access_boundary.rules  # only a bounded token is ever asked for
        self.token, self.expiry = "downscoped-token", expiry

    monkeypatch.setattr(downscoped.Credentials, "refresh", exchange)
    with patched_environ({"AIRFLOW_CONN_SKY_NODES_GCP": json.dumps(conn)}):
        plan = buckets.bucket_remotes(MOUNTS, node_conns={"gcs": "sky_nodes_gcp"})
    options = plan.served["gcs"].options  # served to the node's rclone (node.credential_server)
    assert json.loads(options["token"])["access_token"] == "downscoped-token"
    assert not {"service_account_credentials", "token"} & set(plan.remotes["sky-gcs"])
    text = json.dumps(options)
    assert key["private_key_id"] not in text and "PRIVATE KEY" not in text
    assert plan.expires is not None


def test_a_failed_exchange_is_an_error_not_the_key_file() -> None:
    """With the exchange unreachable (as here), minting fails clearly; nothing falls back to the key."""
    key = _key_file()
    conn = {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(key)}}
    with (
        patched_environ({"AIRFLOW_CONN_SKY_NODES_GCP": json.dumps(conn)}),
        pytest.raises(SkyError, match="downscoped token exchange failed") as failure,
    ):
        buckets.bucket_remotes(MOUNTS, node_conns={"gcs": "sky_nodes_gcp"})
    assert "PRIVATE KEY" not in str(failure.value)
