"""The ssh infra's StateStore: JSON records on the pool's state host, written by compare-and-swap.

An ssh pool has no object store, and the records must not live on an Airflow worker (with Celery or
Kubernetes executors a job's tasks run on different machines). Nor on a host that runs jobs: a job there
runs as the login user and could rewrite them (point another cluster's rank at its own host, free a host it
still runs on). So they live on the pool's *state host*, a host/user the pool definition names (`state:`)
and no job runs as, under `~/.airflow_sky/state/<pool>/<cluster>/`. Reads go over SFTP
(no process spawned on the host); a write runs a short python3 script there that takes an flock, compares
the version and replaces the file atomically, so two writers that race never both win. The script stamps
each record with the state host's clock (`at`): one clock for every writer, whatever the workers' clocks say.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra.ssh.hosts import unusable_reason
from airflow_sky.infra.state_store import StateStore, Versioned, is_cluster_store, validate_key
from airflow_sky.node.client import NodeClient

STATE_ROOT = ".airflow_sky/state"
HOST_LOCKS_ROOT = ".airflow_sky/host-locks"  # every pool's host locks on the state host (host_locks.py)

# argv: record path, expected version ("-" = only if absent); stdin: the data. Prints the new version and
# the host's time of the write, or "conflict". The lock file sits beside the records; rename makes the new record appear at once.
_CAS_SCRIPT = r"""
import fcntl, json, os, sys, tempfile, time
path, expected = sys.argv[1], sys.argv[2]
directory = os.path.dirname(path)
os.makedirs(directory, mode=0o700, exist_ok=True)
data = json.load(sys.stdin)
root = sys.argv[3]
with open(os.path.join(root, ".lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        with open(path) as f:
            current = json.load(f)["version"]
    except FileNotFoundError:
        current = None
    if (None if expected == "-" else int(expected)) != current:
        print("conflict")
        sys.exit(0)
    version = (current or 0) + 1
    at = time.time()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".rec.")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": version, "data": data, "at": at}, f, sort_keys=True)
    os.replace(tmp, path)
    print(version, repr(at))
"""


class SshStateStore(StateStore):
    """One cluster's records on the pool's state host; `client` opens (or reuses) the connection to it.

    `root` (relative to the state user's home) replaces the cluster's directory: the host locks' store.
    """

    def __init__(
        self,
        client: Callable[[], NodeClient],
        pool: str,
        cluster: str,
        host_label: str,
        root: str | None = None,
    ) -> None:
        self._client = client
        self.root = root or f"{STATE_ROOT}/{pool}/{cluster}"
        self.host_label = host_label

    def _path(self, key: str) -> str:
        return f"{self.root}/{validate_key(key)}.json"

    def _unreachable(self, e: RemoteError) -> ClusterError:
        return ClusterError(
            f"the ssh pool's state host {self.host_label} (the pool's `state`, which keeps its clusters' "
            f"job records) cannot be used: {unusable_reason(e)}"
        )

    def get(self, key: str) -> Versioned | None:
        try:
            raw = self._client().read_file(self._path(key), max_bytes=16 * 1024 * 1024)
        except RemoteError as e:
            raise self._unreachable(e) from e
        if raw is None:
            return None
        record = json.loads(raw)
        at = record.get("at")
        return Versioned(int(record["version"]), record["data"], float(at) if at is not None else None)

    def put(self, key: str, data: dict[str, Any], expected_version: int | None) -> Versioned | None:
        path = self._path(key)
        command = (
            f"python3 -c {shlex.quote(_CAS_SCRIPT)} {shlex.quote(path)} "
            f"{'-' if expected_version is None else int(expected_version)} {shlex.quote(self.root)}"
        )
        try:
            rc, out, err = self._client().exec(
                f"mkdir -p {shlex.quote(self.root)} && {command}", stdin=json.dumps(data).encode(), timeout=60
            )
        except RemoteError as e:
            raise self._unreachable(e) from e
        text = out.decode().strip()
        if rc != 0:
            raise ClusterError(
                f"state write on {self.host_label} failed (exit {rc}): {err.decode(errors='replace').strip()[-300:]}"
            )
        if text == "conflict":
            return None
        version, at = text.split()
        return Versioned(int(version), data, float(at))

    def keys(self, prefix: str) -> list[str]:
        try:
            names = self._client().listdir(f"{self.root}/{validate_key(prefix)}")
        except RemoteError as e:
            raise self._unreachable(e) from e
        return sorted(
            f"{prefix}/{n[:-5]}" for n in names or [] if n.endswith(".json") and not n.startswith(".")
        )

    def remove_all(self) -> None:
        """Delete every record of the cluster (teardown)."""
        try:
            self._client().exec(f"rm -rf -- {shlex.quote(self.root)}", timeout=60)
        except RemoteError as e:
            raise self._unreachable(e) from e


def list_clusters(client: NodeClient, pool: str) -> list[str]:
    """The clusters with records on the state host."""
    names = client.listdir(f"{STATE_ROOT}/{pool}") or []
    return sorted(n for n in names if not n.startswith(".") and is_cluster_store(n))
