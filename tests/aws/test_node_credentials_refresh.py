"""A running mount keeps reaching its bucket after its first credential is void, because the watch holder
wrote a fresh one to the node's credential server; and when a refresh is due, as a pure function.

Real parts: moto's server with IAM enforcement on, a real local node, the real rclone mount and
`rclone serve http`. moto never expires an STS session (it does not check Expiration), so "expired" is
made real another way: moto evaluates an assumed-role session's rights from its role's policies on every
request, so the first credential (a session of role A) is voided by deleting role A's policy once the
refresh wrote a session of role B. A session short enough for rclone to fetch it again within the test:
AssumeRole of 330 s (AWS's minimum is 900 s; moto takes less once botocore's client-side check is off
through the connection's `config_kwargs`), which rclone's SDK fetches again 5 minutes before it expires.
"""

from __future__ import annotations

import datetime
import json
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from airflow_sky.gang import state as js
from airflow_sky.gang.credential_refresh import INFO_KEY, LEAD_S, CredentialRefresh, refresh_due, refresh_time
from airflow_sky.gang.job import JobStatus
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.node import buckets, credentials
from airflow_sky.node.client import NodeClient
from airflow_sky.task.storage import MOUNT, BucketMount
from tests.aws.test_node_credentials import _client, moto_iam  # noqa: F401  (moto_iam: a fixture)
from tests.envs import patched_environ

DATA = "refresh-data"
NODE_CONN = "sky_nodes_aws"
REFRESHED = BucketMount("~/refreshed", "s3", DATA, "job/refreshed", MOUNT)
LEFT_ALONE = BucketMount("~/left", "s3", DATA, "job/left", MOUNT)  # its file is not rewritten: the control
UTC = datetime.UTC


# On the node: the credential server answers a mount's file only to its password (another user of the
# host has neither the password nor a way to read it: it is on no process's command line).
PROBE = r"""
entry=$(grep -hzo '^AIRFLOW_SKY_CREDS=[0-9]*:[0-9a-f]*' /proc/[0-9]*/environ | tr '\0' '\n' | head -n 1)
entry=${entry#AIRFLOW_SKY_CREDS=}; port=${entry%%:*}; pass=${entry#*:}
key=$(cd ~/.airflow_sky/mounts/creds && ls -d m-* | head -n 1)
get() {
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  if [ -n "$1" ]; then printf 'GET /%s/s3.json HTTP/1.0\r\nAuthorization: Basic %s\r\n\r\n' "$key" "$1" >&3
  else printf 'GET /%s/s3.json HTTP/1.0\r\n\r\n' "$key" >&3; fi
  head -n 1 <&3 | cut -d' ' -f2
}
echo none "$(get '')"
echo wrong "$(get "$(printf 'sky:%s' 0000 | base64 -w0)")"
echo right "$(get "$(printf 'sky:%s' "$pass" | base64 -w0)")"
echo cmdlines "$(grep -lF -f <(printf '%s\n' "$pass") /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
"""


@pytest.fixture(scope="module")
def world(moto_iam: str) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The provisioning user, two roles for the nodes (each may use the bucket), IAM enforcement on."""
    iam = _client("iam", moto_iam)
    iam.create_user(UserName="provisioner")
    admin = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="provisioner", PolicyName="all", PolicyDocument=json.dumps(admin))
    key = iam.create_access_key(UserName="provisioner")["AccessKey"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": "arn:aws:iam::123456789012:user/provisioner"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    bucket = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:*",
                "Resource": [f"arn:aws:s3:::{DATA}", f"arn:aws:s3:::{DATA}/*"],
            }
        ],
    }
    roles = {}
    for name in ("node-a", "node-b"):
        roles[name] = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"][
            "Arn"
        ]
        iam.put_role_policy(RoleName=name, PolicyName="bucket", PolicyDocument=json.dumps(bucket))
    _client("s3", moto_iam).create_bucket(Bucket=DATA)
    requests.post(f"{moto_iam}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    admin_client = lambda service: _client(service, moto_iam, key["AccessKeyId"], key["SecretAccessKey"])  # noqa: E731
    yield {"key": key, "roles": roles, "endpoint": moto_iam, "admin": admin_client}


def _conn(world: dict[str, Any], role: str) -> dict[str, str]:
    conn = {
        "conn_type": "aws",
        "login": world["key"]["AccessKeyId"],
        "password": world["key"]["SecretAccessKey"],
        "extra": {
            "endpoint_url": world["endpoint"],
            "region_name": "us-east-1",
            "config_kwargs": {"parameter_validation": False},  # a 330 s session (module doc)
            "airflow_sky": {"node_role_arn": world["roles"][role]},
        },
    }
    return {f"AIRFLOW_CONN_{NODE_CONN.upper()}": json.dumps(conn)}


def _wait_for(check: Callable[[], bool], what: str, client: NodeClient, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            _, logs, _ = client.exec(
                "tail -n 15 ~/.airflow_sky/mounts/m-*/log; ls -laR ~/.airflow_sky/mounts/creds"
            )
            raise AssertionError(f"{what} within {timeout_s:.0f}s; the node's mount logs:\n{logs.decode()}")
        time.sleep(1.0)


def _listed(s3: Any, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=DATA, Prefix=prefix).get("Contents", [])]


def _in_bucket(s3: Any, key: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            s3.head_object(Bucket=DATA, Key=key)
            return True
        except ClientError:
            return False

    return check


def test_a_mount_keeps_writing_after_its_first_credential_is_void(
    world, local_cluster, tmp_path, monkeypatch
):
    monkeypatch.setattr(credentials, "ROLE_DURATION_S", 330)  # rclone fetches it again after ~30 s
    s3 = world["admin"]("s3")
    _, nodes, ssh_key = local_cluster(1)
    with patched_environ(_conn(world, "node-a")):
        record = buckets.bucket_record([REFRESHED, LEFT_ALONE], None, None, frozenset(), infra="local")
        plan = buckets.plan_from_record(record)
    assert plan is not None
    first = plan.served["s3"].options
    with NodeClient(nodes[0], ssh_key) as client:
        buckets.attach_buckets(client, plan, lambda line: None)
        rc, _, err = client.exec("echo one > ~/refreshed/one && echo one > ~/left/one")
        assert rc == 0, err.decode()
        rc, out, err = client.exec(f"bash -c {shlex.quote(PROBE)}")
        assert rc == 0, err.decode()
        assert out.decode().split() == ["none", "401", "wrong", "401", "right", "200", "cmdlines", "0"], out
        _wait_for(_in_bucket(s3, "job/refreshed/one"), "the first write reached the bucket", client)
        _wait_for(
            _in_bucket(s3, "job/left/one"), "the control mount's first write reached the bucket", client
        )

        # The watch holder's refresher for a job whose record holds the refreshed mount only.
        states = js.JobStates(LocalStateStore(tmp_path / "state"))
        only = {**record, "mounts": [REFRESHED.to_dict()]}
        state, _ = states.allocate("run-1", {"buckets": only})
        states.update(state.job_id, lambda s: js.set_status(s, JobStatus.RUNNING, time.time()))
        said: list[str] = []
        refresher = CredentialRefresh(
            states, state.job_id, lambda: {0: client}, said.append, lambda calls: [c() for c in calls]
        )
        with patched_environ(_conn(world, "node-b")):  # the fresh session is role B's
            state = refresher.round(states.require(state.job_id))
        assert "replaced the nodes' bucket credentials" in said[-1], said
        entry = state.info[INFO_KEY]
        assert datetime.datetime.fromisoformat(entry["expires"]) > datetime.datetime.now(UTC)
        assert not refresh_due(entry, datetime.datetime.now(UTC))  # recorded: the next rounds do nothing

        # The first credential is void from now on (moto reads role A's policies on every request).
        world["admin"]("iam").delete_role_policy(RoleName="node-a", PolicyName="bucket")
        void = _client(
            "s3",
            world["endpoint"],
            first["access_key_id"],
            first["secret_access_key"],
            first["session_token"],
        )
        with pytest.raises(ClientError):
            void.put_object(Bucket=DATA, Key="job/refreshed/void", Body=b"x")

        # A MOUNT's upload that is refused is not tried again: write a new file every second or so until
        # the mounts have fetched their credential again (rclone: 5 minutes before the first expires).
        written = [0]

        def arrived() -> bool:
            written[0] += 1
            n = written[0]
            # (a refused upload fails the write's close: EIO)
            client.exec(f"echo {n} > ~/refreshed/two-{n}; echo {n} > ~/left/two-{n}; true")
            return bool(_listed(s3, "job/refreshed/two-"))

        _wait_for(arrived, "a write after the first credential was void arrived", client)
        # The control mount fetched its file again too, found the void session, and uploaded nothing.
        assert not _listed(s3, "job/left/two-")
        buckets.detach_buckets(client, lambda line: None, flush_timeout_s=1)


def test_refresh_is_due_at_half_life_and_ahead_of_rclones_own_fetch() -> None:
    issued = datetime.datetime(2026, 12, 5, 0, 0, tzinfo=UTC)
    hours = lambda h: issued + datetime.timedelta(hours=h)  # noqa: E731
    assert refresh_time(issued, hours(12)) == hours(6)  # AssumeRole's 12 h: at 6 h
    assert refresh_time(issued, hours(36)) == hours(18)  # GetFederationToken's 36 h
    assert refresh_time(issued, hours(1)) == hours(0.5)  # a gcs token's hour
    fifteen = issued + datetime.timedelta(minutes=15)  # AWS's shortest session: LEAD_S before its end
    assert refresh_time(issued, fifteen) == fifteen - datetime.timedelta(seconds=LEAD_S)
    short = issued + datetime.timedelta(seconds=330)  # shorter than LEAD_S: at half its life, never at once
    assert refresh_time(issued, short) == issued + datetime.timedelta(seconds=165)
    assert refresh_time(issued, None) is None
    entry = {"issued": issued.isoformat(), "expires": hours(12).isoformat()}
    assert not refresh_due(entry, hours(5.9))
    assert refresh_due(entry, hours(6)) and refresh_due(entry, hours(13))
    assert refresh_due(None, issued)  # no record: the attach's credential, of unknown age
    assert not refresh_due({"issued": issued.isoformat(), "expires": None}, hours(100))  # never expires


def test_a_round_that_is_not_due_touches_no_node_and_mints_nothing(tmp_path: Path) -> None:
    states = js.JobStates(LocalStateStore(tmp_path))
    now = datetime.datetime.now(UTC)
    entry = {"issued": now.isoformat(), "expires": (now + datetime.timedelta(hours=12)).isoformat()}
    info = {"buckets": {"mounts": [REFRESHED.to_dict()], "node_identity": []}, INFO_KEY: entry}
    state, _ = states.allocate("run-2", info)

    def no_nodes() -> dict[int, NodeClient]:
        raise AssertionError("a round that is not due opened a node")

    refresher = CredentialRefresh(states, state.job_id, no_nodes, print, lambda calls: None)
    assert refresher.round(state) is state
    # Nodes with an identity of their own (an instance profile) never need one.
    own = {"buckets": {"mounts": [REFRESHED.to_dict()], "node_identity": ["s3"]}}
    state, _ = states.allocate("run-3", own)
    assert CredentialRefresh(states, state.job_id, no_nodes, print, lambda calls: None).round(state) is state
