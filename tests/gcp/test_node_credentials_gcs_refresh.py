"""gcs: a node's mount takes its downscoped token from the node's credential server, and a refresh switches
the running mount to a new token.

Real parts: a real local node, the real rclone mount (rclone 1.60's gcs remote without a key or token uses
application default credentials, pointed at the node's server by GCE_METADATA_HOST) and `rclone serve
http`, the fake GCS JSON API (tests/gcp/fake_gcs.py) as the bucket. Google's token exchange is unreachable
here: the downscoped Credentials' refresh is a stand-in handing out tok-1, tok-2, ... (as in
test_node_credentials_gcs). The fake checks no token: the test reads the Authorization header of every
request rclone sent and sees the mount use the new token after the refresh. The fake takes no chunked
upload (rclone's), so the mount reads objects; a read needs the token as much as a write.
"""

from __future__ import annotations

import datetime
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from google.auth import downscoped

from airflow_sky.node import buckets, credential_server
from airflow_sky.node.client import NodeClient
from airflow_sky.task.storage import MOUNT, BucketMount
from tests.envs import patched_environ
from tests.gcp import fake_gcs
from tests.gcp.test_node_credentials_gcs import _key_file

CKPT = BucketMount("~/ckpt", "gcs", "ckpt-refresh", "job", MOUNT)


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s"
        time.sleep(0.5)


def test_a_gcs_mount_switches_to_the_refreshed_token(local_cluster, monkeypatch) -> None:
    tokens = (f"tok-{n}" for n in itertools.count(1))

    def exchange(self: Any, request: Any) -> None:  # a stand-in for Google's token exchange
        self.token = next(tokens)
        self.expiry = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(hours=1)

    monkeypatch.setattr(downscoped.Credentials, "refresh", exchange)
    # rclone reads the token again once `expires_in` is within oauth2's 10 s margin: on every request here.
    monkeypatch.setattr(credential_server, "GCS_REREAD_S", 1)
    seen: list[tuple[str, str | None]] = []
    dispatch = fake_gcs._Handler._dispatch

    def recording(self: Any, method: str) -> None:
        seen.append((f"{method} {self.path}", self.headers.get("Authorization")))
        dispatch(self, method)

    monkeypatch.setattr(fake_gcs._Handler, "_dispatch", recording)
    fake = fake_gcs.FakeGcs().start()
    fake.add_bucket(CKPT.bucket)
    conn = {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(_key_file())}}
    env = {"AIRFLOW_CONN_SKY_NODES_GCP": json.dumps(conn), "STORAGE_EMULATOR_HOST": ""}
    _, nodes, ssh_key = local_cluster(1)

    def plan() -> buckets.BucketPlan:
        with patched_environ(env):
            made = buckets.bucket_remotes([CKPT], node_conns={"gcs": "sky_nodes_gcp"})
        made.remotes["sky-gcs"]["endpoint"] = f"{fake.endpoint}/storage/v1/"  # type: ignore[index]
        return made

    def read(name: str) -> Callable[[], bool]:
        def check() -> bool:  # (the mount's directory cache may not know a new object for 5 s)
            rc, out, _ = client.exec(f"cat ~/ckpt/{name}")
            return rc == 0 and out.decode().strip() == name

        return check

    # The fake takes no chunked upload (rclone's): the mount reads, which needs the token as much.
    fake.upload(CKPT.bucket, "job/one", b"one\n", "text/plain", {})
    try:
        with NodeClient(nodes[0], ssh_key) as client:
            first = plan()
            assert "token" not in first.remotes["sky-gcs"]  # served, never in rclone.conf
            buckets.attach_buckets(client, first, lambda line: None)
            _wait_for(read("one"), "the mount read an object")
            assert {auth for _, auth in seen} == {"Bearer tok-1"}, seen

            before = len(seen)
            assert buckets.refresh_credentials(client, plan()) == 1
            fake.upload(CKPT.bucket, "job/two", b"two\n", "text/plain", {})
            _wait_for(read("two"), "the mount read an object after the refresh")
            assert seen[before:] and {auth for _, auth in seen[before:]} == {"Bearer tok-2"}, seen[before:]
            buckets.detach_buckets(client, lambda line: None, flush_timeout_s=5)
    finally:
        fake.stop()
