"""Where the local cluster keeps its state, and the records in it.

    <root>/                       AIRFLOW_SKY_LOCAL_ROOT, default ~/.airflow_sky/local
      addresses.lock              serializes loopback address allocation across clusters
      <cluster>/
        cluster.lock
        id_ed25519, id_ed25519.pub  the cluster key pair (clients authenticate with it)
        ports.json                the task's resources.ports, recorded at provision (`status --endpoints`)
        state/                    the cluster's job state (infra.local.state_store): jobs/<id>.json, ...
        instances/<instance_id>/
          node.json               the instance's tags: rank, ip, port, host key, state
          host_key                the node's SSH host key (public half pinned in node.json)
          authorized_keys
          ready.json              written by the node server once it listens
          server.pid              the server's pid as this machine sees it (the namespace's outside)
          server.log
          home -> <homes>/<id>    the node's $HOME (a short path, see below)

    <homes>/                      AIRFLOW_SKY_LOCAL_HOMES, default /var/tmp/sky-<uid> (0700, ours)
      <id>/                       a node's $HOME: short, so that a unix socket under it fits (108 bytes)
      <id>.tmp/                   its /tmp (bind-mounted in its mount namespace) or $TMPDIR

The instance records are the source of truth for membership and ranks, like tags on cloud instances.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.home import sky_home

ROOT_ENV = "AIRFLOW_SKY_LOCAL_ROOT"
# Node homes live apart from the state root: short paths (a tool that puts an AF_UNIX socket under $HOME,
# like `ray start --temp-dir=$HOME/ray`, fails past 107 bytes), and outside /tmp, which a node in its own
# mount namespace sees replaced by its own.
HOMES_ENV = "AIRFLOW_SKY_LOCAL_HOMES"
# Set in the environment of every process of a node, so that teardown finds all of them (like a cgroup).
NODE_MARKER_ENV = "AIRFLOW_SKY_LOCAL_NODE"
# ... together with the state root it belongs to: two roots on one machine (two users, two test runs) may
# both have a cluster called `train`, and stopping one must never touch the other's processes.
NODE_ROOT_ENV = "AIRFLOW_SKY_LOCAL_NODE_ROOT"
# The node server's own needs from the launcher's environment, not passed on to the commands it runs.
SERVER_ONLY_ENV = ("PYTHONPATH",)
DEFAULT_SSH_PORT_ENV = "AIRFLOW_SKY_LOCAL_SSH_PORT"
DEFAULT_SSH_PORT = 2222
CLUSTER_KEY = "id_ed25519"

# Instance states as the local "cloud" records them (mapped to NodeStatus by the driver).
STATE_RUNNING = "running"
STATE_PREEMPTED = "preempted"
STATE_TERMINATED = "terminated"
STATE_STOPPED = "stopped"
# A node's request to its own server (autostop's action): `stop` or `down`, like `shutdown` on a VM.
POWEROFF_PATH = ".airflow_sky/poweroff"
# The local node's stand-in for a cloud's metadata service: the epoch second a preemption notice gives it
# (written by `local preempt --notice`; the node record's NOTICE_KEY is the infra's own word on it).
NOTICE_PATH = ".airflow_sky/metadata/preemption-notice"
NOTICE_KEY = "preempt_at"


def root() -> Path:
    configured = os.environ.get(ROOT_ENV)
    return Path(configured) if configured else sky_home() / "local"


def root_id() -> str:
    """The value of NODE_ROOT_ENV for nodes of this root."""
    return str(root().resolve())


def cluster_dir(cluster_name: str) -> Path:
    return root() / cluster_name


def instances_dir(cluster_name: str) -> Path:
    return cluster_dir(cluster_name) / "instances"


def state_dir(cluster_name: str) -> Path:
    return cluster_dir(cluster_name) / "state"


def cluster_key_path(cluster_name: str) -> Path:
    return cluster_dir(cluster_name) / CLUSTER_KEY


def ports_path(cluster_name: str) -> Path:
    return cluster_dir(cluster_name) / "ports.json"


def homes_root() -> Path:
    """Where node homes and tmp dirs live; created 0700 and refused when another user owns it."""
    configured = os.environ.get(HOMES_ENV)
    path = Path(configured) if configured else Path("/var/tmp") / f"sky-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.is_symlink():
        raise ClusterError(
            f"{path} (local node homes) belongs to another user; set ${HOMES_ENV} to a dir of yours"
        )
    return path


def short_home(instance_id: str) -> Path:
    return homes_root() / instance_id.removeprefix("local-")


def short_tmp(instance_id: str) -> Path:
    return homes_root() / f"{instance_id.removeprefix('local-')}.tmp"


def _instance_file(name: str) -> Callable[[Path], Path]:
    """The path of one of an instance dir's files (the layout above), given the instance dir."""

    def path(node_dir: Path) -> Path:
        return node_dir / name

    return path


server_pid_path = _instance_file("server.pid")
node_record_path = _instance_file("node.json")
node_home = _instance_file("home")
host_key_path = _instance_file("host_key")
authorized_keys_path = _instance_file("authorized_keys")
ready_path = _instance_file("ready.json")
server_log_path = _instance_file("server.log")


def read_node_record(node_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(node_record_path(node_dir).read_text())
    return data


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Readers never see a half-written record (write a temp file, then rename over)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
