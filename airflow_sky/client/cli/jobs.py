"""`airflow-sky queue | logs | cancel | ssh`: the jobs and nodes of a cluster, like `sky queue/logs/cancel/ssh`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from airflow_sky.errors import ClusterError


def register(subparsers: Any) -> None:
    queue = subparsers.add_parser("queue", help="list a cluster's jobs")
    queue.add_argument("cluster")
    queue.set_defaults(handler=_queue)

    logs = subparsers.add_parser("logs", help="print (and follow) a job's node logs")
    logs.add_argument("cluster")
    logs.add_argument("job_id", nargs="?", type=int, help="default: the latest job")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and return")
    logs.add_argument(
        "--status", action="store_true", help="print the job's status only; exit 0 only if it SUCCEEDED"
    )
    logs.set_defaults(handler=_logs)

    cancel = subparsers.add_parser("cancel", help="kill a job's processes on every node (CANCELLED)")
    cancel.add_argument("cluster")
    cancel.add_argument("job_ids", nargs="*", type=int, help="default: the latest unfinished job")
    cancel.add_argument("--all", action="store_true", help="cancel every unfinished job")
    cancel.set_defaults(handler=_cancel)

    ssh = subparsers.add_parser(
        "ssh",
        help="open a shell (or run a command) on a node; `ssh check|unlock POOL` for ssh node pools",
        usage="airflow-sky ssh CLUSTER [RANK] [COMMAND ...] | ssh check POOL | ssh unlock POOL [HOST ...] [--force]",
    )
    ssh.add_argument("cluster", metavar="CLUSTER", help="a cluster, or `check` / `unlock` followed by a pool")
    ssh.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="[RANK] [COMMAND ...]",
        help="node rank (default: 0, the head), then a command to run instead of a shell",
    )
    ssh.set_defaults(handler=_ssh)


def _when(timestamp: Any) -> str:
    if not timestamp:
        return "-"
    if isinstance(timestamp, str):
        return timestamp.replace("T", " ")[:19]
    return datetime.fromtimestamp(float(timestamp), UTC).strftime("%Y-%m-%d %H:%M:%S")


def _queue(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    records = sdk.queue(args.cluster)
    table = Table(title=f"Job queue of {args.cluster}")
    for column in ("ID", "NAME", "SUBMITTED", "STARTED", "ENDED", "NODES", "STATUS"):
        table.add_column(column)
    for record in reversed(records):
        table.add_row(
            str(record["job_id"]),
            str(record.get("name") or "-"),
            _when(record.get("submitted_at")),
            _when(record.get("started_at")),
            _when(record.get("ended_at")),
            str(record.get("num_nodes") or "-"),
            str(record.get("status")),
        )
    Console(soft_wrap=True).print(table)
    return 0


def _logs(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    if args.status:
        statuses = sdk.job_status(args.cluster, [args.job_id] if args.job_id is not None else None)
        job_id, status = next(iter(statuses.items()))
        if status is None:
            raise ClusterError(f"cluster {args.cluster!r} has no job {job_id}")
        print(f"Job {job_id}: {status.value}")
        return 0 if status.value == "SUCCEEDED" else 1
    return sdk.tail_logs(args.cluster, args.job_id, follow=not args.no_follow)


def _cancel(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    cancelled = sdk.cancel(args.cluster, args.job_ids or None, all=args.all)
    print(
        f"Cancelled job(s) {', '.join(map(str, cancelled))} on {args.cluster}."
        if cancelled
        else "No unfinished job to cancel."
    )
    return 0


def _ssh(args: argparse.Namespace) -> int:
    """Replace this process with OpenSSH, using the cluster's key and pinned host keys."""
    from airflow_sky.client import ssh_config
    from airflow_sky.client.cli import ssh_pool
    from airflow_sky.client.sdk import cluster_of

    if args.cluster in ssh_pool.ACTIONS:
        return ssh_pool.run(args.cluster, args.command)
    rank, command = 0, list(args.command)
    if command and command[0].isdigit():
        rank, command = int(command[0]), command[1:]
    cluster = cluster_of(args.cluster)
    nodes = {n.rank: n for n in cluster.nodes()}
    if not nodes:
        raise ClusterError(f"cluster {args.cluster!r} not found on {cluster.infra}")
    node = nodes.get(rank)
    if node is None:
        raise ClusterError(f"cluster {args.cluster!r} has no node of rank {rank} (ranks: {sorted(nodes)})")
    if shutil.which("ssh") is None:
        raise ClusterError("the OpenSSH client (ssh) is not installed")
    config = ssh_config.write_entries(args.cluster, list(nodes.values()), cluster.key_files(nodes.values()))
    argv = [
        "ssh",
        "-F",
        str(config),
        *([] if command else ["-t"]),
        ssh_config.host_alias(args.cluster, node.rank),
    ]
    sys.stdout.flush()
    os.execvp("ssh", argv + command)
    return 0  # not reached
