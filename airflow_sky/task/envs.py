"""Per-node environments of a task's setup and run scripts, with SkyPilot's SKYPILOT_* variables.

Pure functions (no Airflow, no I/O), golden-tested. Order of precedence inside one node's env: the task's
`envs`, then its `secrets` (a secret wins over an env of the same name), then the framework variables
(SKYPILOT_*, PYTHONUNBUFFERED). SkyPilot exports user envs first and its own variables after them, so a
task cannot override SKYPILOT_NODE_RANK & co.; we do the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from airflow_sky.task.schema import ENV_KEY_PATTERN
from airflow_sky.task.task import Task

_ENV_KEY = re.compile(ENV_KEY_PATTERN)


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What SKYPILOT_CLUSTER_INFO carries."""

    cluster_name: str
    cloud: str
    region: str | None = None
    zone: str | None = None


def make_task_id(cluster_name: str, job_id: int, submitted_at: datetime) -> str:
    """SKYPILOT_TASK_ID: `sky-<%Y-%m-%d-%H-%M-%S-%f>_<cluster>_<jobid>`, stable across a job's recoveries."""
    return f"sky-{submitted_at:%Y-%m-%d-%H-%M-%S-%f}_{cluster_name}_{job_id}"


def pipeline_task_ids(
    pipeline: str, task_names: Sequence[str], started_at: datetime, run_key: str
) -> list[str]:
    """Each pipeline task's SKYPILOT_TASK_ID, known before the first one starts (SKYPILOT_TASK_IDS lists
    them all): `sky-<%Y-%m-%d-%H-%M-%S-%f>_<pipeline>_<task>_<run key>-<index>`, as SkyPilot's managed
    pipelines name them, with the run's key (unique per DAG run) where SkyPilot has its job id."""
    return [
        f"sky-{started_at:%Y-%m-%d-%H-%M-%S-%f}_{pipeline}_{name}_{run_key}-{index}"
        for index, name in enumerate(task_names)
    ]


def cluster_info_json(cluster: ClusterInfo) -> str:
    """SKYPILOT_CLUSTER_INFO: JSON with cluster_name, cloud, region and zone."""
    return json.dumps(
        {
            "cluster_name": cluster.cluster_name,
            "cloud": cluster.cloud,
            "region": cluster.region,
            "zone": cluster.zone,
        }
    )


def node_envs(
    task: Task,
    node_ips: Sequence[str],
    cluster: ClusterInfo,
    task_id: str,
    num_gpus_per_node: int,
    task_ids: Sequence[str] = (),
    *,
    phase: Literal["setup", "run"],
) -> list[dict[str, str]]:
    """The env of `phase`'s script on each node, in rank order; node_ips[0] is the head (rank 0). The setup's
    rank, IPs and GPUs have SKYPILOT_SETUP_* names.

    `node_ips`: for run, the internal IPs of the nodes the task runs on; for setup, of every node of the
    cluster (setup runs on each, as in SkyPilot). SKYPILOT_NUM_NODES is the task's node count in both: as
    SkyPilot sets it for setup (task_codegen), the run's size, never a larger cluster's.
    `task_ids`: in a pipeline, every task's SKYPILOT_TASK_ID (SKYPILOT_TASK_IDS, one per line).
    """
    if not node_ips:
        raise ValueError("node_ips is empty: a task runs on at least one node")
    if phase == "setup" and len(node_ips) < task.num_nodes:
        raise ValueError(
            f"node_ips has {len(node_ips)} IPs; setup runs on every node of the cluster, "
            f"which has at least the task's num_nodes ({task.num_nodes})"
        )
    if isinstance(num_gpus_per_node, bool) or not isinstance(num_gpus_per_node, int) or num_gpus_per_node < 0:
        raise ValueError(f"num_gpus_per_node must be an integer >= 0, got {num_gpus_per_node!r}")
    prefix = "SKYPILOT_SETUP_" if phase == "setup" else "SKYPILOT_"
    shared = {
        f"{prefix}NODE_IPS": "\n".join(node_ips),
        f"{prefix}NUM_GPUS_PER_NODE": str(num_gpus_per_node),
        "SKYPILOT_NUM_NODES": str(task.num_nodes if phase == "setup" else len(node_ips)),
        "SKYPILOT_TASK_ID": task_id,
        "SKYPILOT_CLUSTER_INFO": cluster_info_json(cluster),
        "PYTHONUNBUFFERED": "1",
    }
    if task_ids:
        shared["SKYPILOT_TASK_IDS"] = "\n".join(task_ids)
    user = task.envs_and_secrets
    return [{**user, f"{prefix}NODE_RANK": str(rank), **shared} for rank in range(len(node_ips))]


run_envs = functools.partial(node_envs, phase="run")  # the run script's env for each node
setup_envs = functools.partial(node_envs, phase="setup")  # the setup script's env for each node


def env_file_text(env: Mapping[str, str]) -> str:
    """A bash-sourceable env file: `export KEY=<shlex-quoted value>` per line.

    The env travels in a file because sshd drops variables it does not AcceptEnv; quoting keeps quotes,
    `$`, spaces, newlines and unicode intact. A NUL byte cannot live in an environment variable.
    """
    lines = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_KEY.match(key):
            raise ValueError(f"invalid environment variable name {key!r}; names must match {ENV_KEY_PATTERN}")
        if not isinstance(value, str):
            raise ValueError(f"environment variable {key} must be a string, got {type(value).__name__}")
        if "\0" in value:
            raise ValueError(f"environment variable {key} contains a NUL byte, which bash cannot carry")
        lines.append(f"export {key}={shlex.quote(value)}\n")
    return "".join(lines)
