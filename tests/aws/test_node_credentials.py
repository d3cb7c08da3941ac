"""A node's bucket credential reaches the job's own buckets and folders and nothing else.

moto in server mode with its IAM enforcement on (`/moto-api/reset-auth`, what INITIAL_NO_AUTH_ACTION_COUNT
sets): the provisioning identity is an IAM user with every right; the node credential is what
node.buckets mints from its connection (AssumeRole of the connection's `airflow_sky.node_role_arn`, with
the session policy credential_scope builds). moto does not apply session policies, and evaluates no
`s3:prefix` condition for S3 requests: the test puts the very policy the code built on the role (without
its listing condition), so moto enforces the objects and services part of it; the listing condition is
checked on the document itself (test_the_listing_condition_admits_only_the_job_folders).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

from airflow_sky.errors import SkyError
from airflow_sky.node import buckets, rclone
from airflow_sky.node.credential_scope import Scope, job_scopes, policy_text, s3_session_policy
from airflow_sky.task.storage import COPY, BucketMount
from tests.envs import patched_environ
from tests.ports import free_port

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account
JOBS = "node-cred-jobs"
OTHER = "node-cred-other"
OWN = f"{JOBS}/runs/run-1"  # the job's own jobs-bucket prefix
NODE_CONN = "sky_nodes_aws"


@pytest.fixture(scope="module")
def moto_iam() -> Iterator[str]:
    """A moto server of its own (its auth switch is process-wide: never the shared one)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(f"{endpoint}/moto-api/", timeout=2)
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.2)
    try:
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def _client(
    service: str, endpoint: str, key: str = "setup", secret: str = "setup", token: str | None = None
) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
    )


@pytest.fixture(scope="module")
def world(moto_iam: str) -> Iterator[dict[str, Any]]:
    """The provisioning user (all rights), the nodes' role, two jobs' files, another bucket, the state table;
    then IAM enforcement on."""
    iam = _client("iam", moto_iam)
    iam.create_user(UserName="provisioner")
    admin = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="provisioner", PolicyName="all", PolicyDocument=json.dumps(admin))
    key = iam.create_access_key(UserName="provisioner")["AccessKey"]
    user_arn = f"arn:aws:iam::{ACCOUNT}:user/provisioner"
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": user_arn}, "Action": "sts:AssumeRole"}],
    }
    role_arn = iam.create_role(RoleName="sky-node-data", AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    s3 = _client("s3", moto_iam)
    for bucket in (JOBS, OTHER):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=JOBS, Key="runs/run-1/workdir/train.py", Body=b"print(1)")
    s3.put_object(Bucket=JOBS, Key="runs/run-2/workdir/secret.py", Body=b"other job")
    s3.put_object(Bucket=OTHER, Key="data.txt", Body=b"other bucket")
    _client("dynamodb", moto_iam).create_table(
        TableName="airflow-sky-state",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    requests.post(f"{moto_iam}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    with pytest.raises(ClientError):  # enforcement is on: an unknown key opens nothing
        _client("s3", moto_iam).list_buckets()
    conn = {
        "conn_type": "aws",
        "login": key["AccessKeyId"],
        "password": key["SecretAccessKey"],
        "extra": {
            "endpoint_url": moto_iam,
            "region_name": REGION,
            "airflow_sky": {"node_role_arn": role_arn},
        },
    }
    admin_iam = _client("iam", moto_iam, key["AccessKeyId"], key["SecretAccessKey"])
    with patched_environ({f"AIRFLOW_CONN_{NODE_CONN.upper()}": json.dumps(conn)}):
        yield {"key": key, "role": role_arn, "iam": admin_iam, "endpoint": moto_iam}


MOUNTS = [BucketMount("~/sky_workdir", "s3", JOBS, "runs/run-1/workdir", COPY)]


def _node_credential(world: dict[str, Any]) -> dict[str, str]:
    plan = buckets.bucket_remotes(MOUNTS, node_conns={"s3": NODE_CONN})
    # The session expires: it is served to the node's rclone (node.credential_server), not in rclone.conf.
    assert plan.remotes["sky-s3"]["env_auth"] == "true"
    assert not {"access_key_id", "secret_access_key", "session_token"} & set(plan.remotes["sky-s3"])
    options = dict(plan.served["s3"].options)
    # moto applies no session policy: the role carries the policy the code sent (its listing condition
    # left out, which moto cannot evaluate for S3), so what moto enforces is what the code built.
    policy = s3_session_policy(job_scopes(MOUNTS))
    for statement in policy["Statement"]:
        statement.pop("Condition", None)
        if statement["Action"] == "s3:ListBucket":  # moto names the action by the API call it serves
            statement["Action"] = ["s3:ListBucket", "s3:ListObjectsV2", "s3:ListObjects"]
    world["iam"].put_role_policy(
        RoleName="sky-node-data", PolicyName="session", PolicyDocument=policy_text(policy)
    )
    return options


def _as_node(service: str, world: dict[str, Any], options: dict[str, str]) -> Any:
    return _client(
        service,
        world["endpoint"],
        options["access_key_id"],
        options["secret_access_key"],
        options["session_token"],
    )


def test_a_node_credential_is_a_scoped_session_never_the_provisioning_key(world) -> None:
    options = _node_credential(world)
    key = world["key"]
    assert options["access_key_id"] != key["AccessKeyId"]
    assert key["SecretAccessKey"] not in json.dumps(options)
    assert options["session_token"]
    assert key["SecretAccessKey"] not in rclone.config_text({"sky-s3": options})


def test_a_node_credential_reads_and_writes_only_its_own_folder(world) -> None:
    options = _node_credential(world)
    s3 = _as_node("s3", world, options)
    own = s3.get_object(Bucket=JOBS, Key="runs/run-1/workdir/train.py")["Body"].read()
    assert own == b"print(1)"
    s3.put_object(Bucket=JOBS, Key="runs/run-1/workdir/out.txt", Body=b"written by the job")
    listed = s3.list_objects_v2(Bucket=JOBS, Prefix="runs/run-1/")
    assert {o["Key"] for o in listed["Contents"]} >= {
        "runs/run-1/workdir/train.py",
        "runs/run-1/workdir/out.txt",
    }
    refused = [
        lambda: s3.get_object(Bucket=JOBS, Key="runs/run-2/workdir/secret.py"),  # another job's prefix
        lambda: s3.put_object(Bucket=JOBS, Key="runs/run-2/workdir/planted.py", Body=b"x"),
        lambda: s3.get_object(Bucket=OTHER, Key="data.txt"),  # another bucket
        lambda: s3.list_objects_v2(Bucket=OTHER),
        lambda: s3.put_object(Bucket=OTHER, Key="planted", Body=b"x"),
        lambda: _as_node("ec2", world, options).describe_instances(),  # EC2
        lambda: _as_node("ec2", world, options).terminate_instances(InstanceIds=["i-0123456789abcdef0"]),
        lambda: _as_node("dynamodb", world, options).scan(TableName="airflow-sky-state"),  # the state table
        lambda: _as_node("dynamodb", world, options).put_item(
            TableName="airflow-sky-state", Item={"pk": {"S": "forged"}}
        ),
        lambda: _as_node("iam", world, options).list_users(),
    ]
    for attempt in refused:
        with pytest.raises(ClientError) as refusal:
            attempt()
        response = refusal.value.response
        code, status = response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]
        assert status == 403 or code in {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}, (
            code
        )


def test_rclone_on_a_node_copies_its_folder_and_is_refused_another_bucket(world, tmp_path: Path) -> None:
    options = _node_credential(world)
    remote = {"type": "s3", "provider": "Other", "endpoint": world["endpoint"], "force_path_style": "true"}
    config = tmp_path / "rclone.conf"
    config.write_text(rclone.config_text({"sky-s3": {**remote, **options}}))
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}  # no AWS_CA_BUNDLE: a plain-http endpoint
    base = ["rclone", "--config", str(config), "--retries", "1", "--low-level-retries", "1"]
    run = lambda *args: subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    copied = run("copyto", f"sky-s3:{OWN}/workdir", str(tmp_path / "workdir"))
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "workdir" / "train.py").read_bytes() == b"print(1)"
    assert run("copyto", f"sky-s3:{OTHER}/data.txt", str(tmp_path / "stolen")).returncode != 0
    assert not (tmp_path / "stolen").exists()
    # Another job's object: its HEAD is refused, so rclone takes it for a folder and copies nothing.
    run("copyto", f"sky-s3:{JOBS}/runs/run-2/workdir/secret.py", str(tmp_path / "s2"))
    assert not (tmp_path / "s2").is_file() and not any((tmp_path / "s2").rglob("*"))


def test_the_listing_condition_admits_only_the_job_folders() -> None:
    """moto cannot evaluate `s3:prefix`: the document the code sends STS is checked here."""
    mounts = [
        *MOUNTS,
        BucketMount("/ckpt", "s3", "ckpt-bucket"),
        BucketMount("~/data", "s3", JOBS, "runs/run-1/mounts/0", COPY),  # inside the workdir's? no: a sibling
        BucketMount("~/in", "s3", "ckpt-bucket", "sub"),  # inside a whole bucket: dropped
    ]
    scopes = job_scopes(mounts)
    assert scopes == [
        Scope("s3", "ckpt-bucket"),
        Scope("s3", JOBS, "runs/run-1/mounts/0"),
        Scope("s3", JOBS, "runs/run-1/workdir"),
    ]
    policy = s3_session_policy(scopes)
    listing = [s for s in policy["Statement"] if s["Action"] == "s3:ListBucket"]
    whole, folders = listing
    assert whole == {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": ["arn:aws:s3:::ckpt-bucket"]}
    assert folders["Resource"] == f"arn:aws:s3:::{JOBS}"
    assert folders["Condition"] == {
        "StringLike": {
            "s3:prefix": [
                "runs/run-1/mounts/0",
                "runs/run-1/mounts/0/*",
                "runs/run-1/workdir",
                "runs/run-1/workdir/*",
            ]
        }
    }
    objects = policy["Statement"][-1]["Resource"]
    assert f"arn:aws:s3:::{JOBS}/runs/run-1/workdir/*" in objects
    assert not any(r.endswith(f"{JOBS}/*") or "run-2" in r for r in objects)
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert all(a.startswith("s3:") for a in actions) and "s3:*" not in actions
    assert "s3:DeleteBucket" not in actions and "s3:PutBucketPolicy" not in actions


def test_too_many_folders_for_a_session_policy_is_a_clear_error() -> None:
    many = [BucketMount(f"~/d{i}", "s3", JOBS, f"folder-{i:03d}-with-a-long-name") for i in range(40)]
    with pytest.raises(SkyError, match="over STS's 2048"):
        s3_session_policy(job_scopes(many))


def test_iam_user_keys_get_a_federation_token_of_the_longest_duration(moto_endpoint: str) -> None:
    """A connection with IAM user keys and no role federates (moto without enforcement: it accepts the
    call and returns a session of the asked duration)."""
    conn = {
        "conn_type": "aws",
        "login": "AKIAPROVISIONING",
        "password": "provisioning-secret-value",
        "extra": {"endpoint_url": moto_endpoint, "region_name": REGION},
    }
    with patched_environ({"AIRFLOW_CONN_SKY_NODES_AWS": json.dumps(conn)}):
        plan = buckets.bucket_remotes(MOUNTS, node_conns={"s3": NODE_CONN})
    options = plan.served["s3"].options
    assert options["access_key_id"] != "AKIAPROVISIONING" and options["session_token"]
    assert "provisioning-secret-value" not in json.dumps(options)
    assert plan.expires is not None
    left = plan.expires - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(hours=35) < left <= datetime.timedelta(hours=36)
    assert "provisioning-secret-value" not in repr(plan)


def test_local_nodes_without_a_node_data_connection_are_refused_naming_the_setting(
    moto_endpoint: str,
) -> None:
    provisioning = {
        "conn_type": "aws",
        "login": "AKIAPROVISIONING",
        "password": "provisioning-secret-value",
        "extra": {"endpoint_url": moto_endpoint},
    }
    with patched_environ({"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(provisioning)}):
        os.environ.pop("AIRFLOW_CONN_SKY_NODES_AWS", None)
        for infra in ("local", "ssh/pool", "gcp/us-central1"):
            with pytest.raises(
                SkyError,
                match=r"node_aws_conn_id.*never the provisioning|never the provisioning.*node_aws_conn_id",
            ) as e:
                buckets.bucket_record(MOUNTS, None, None, frozenset(), infra=infra)
            assert "'sky_nodes_aws'" in str(e.value)
        # On aws, the job's bucket connection mints the (scoped) node credential.
        record = buckets.bucket_record(MOUNTS, None, None, frozenset(), infra="aws/us-east-1")
        assert record["node_conns"] == {"s3": "aws_default"}
