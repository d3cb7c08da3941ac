"""`airflow-sky local up|ls|preempt|down`: manage clusters of the embedded local infra by hand."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console

from airflow_sky.client.cli.tables import Column, fitted_table, terminal_console
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.task.diagnostics import did_you_mean


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "local", help="manage clusters of the embedded local infra (node processes on this machine)"
    )
    commands = parser.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    up = commands.add_parser("up", help="start (or grow) a local cluster")
    up.add_argument("cluster", metavar="name")
    up.add_argument(
        "--nodes",
        type=int,
        help="number of nodes (default: 1 for a new cluster, an existing one's own count)",
    )
    up.set_defaults(handler=_up)

    ls = commands.add_parser("ls", help="list local clusters and their nodes")
    ls.add_argument("cluster", metavar="name", nargs="?")
    ls.set_defaults(handler=_ls)

    preempt = commands.add_parser(
        "preempt", help="kill one node like a spot preemption: without warning, or after a notice (--notice)"
    )
    preempt.add_argument("cluster", metavar="name")
    preempt.add_argument("rank", type=int)
    preempt.add_argument(
        "--notice",
        type=float,
        metavar="SECONDS",
        help="give the node a preemption notice first, as AWS (120 s) or GCP (30 s) do, and kill it once the "
        "window is over: its job runs its preemption hooks and gets SIGTERM to checkpoint",
    )
    preempt.set_defaults(handler=_preempt)

    down = commands.add_parser("down", help="stop every node of a cluster and delete its state")
    down.add_argument("cluster", metavar="name")
    down.set_defaults(handler=_down)


def _up(args: argparse.Namespace) -> int:
    if args.nodes is not None and args.nodes < 1:
        raise SpecError(f"--nodes: must be an integer >= 1, got {args.nodes}")
    cloud = LocalCloud()
    have = max((n.rank for n in cloud.nodes(args.cluster)), default=-1) + 1
    refusal = shrink_refusal(args.cluster, have, args.nodes)
    if refusal is not None:
        raise SpecError(refusal)
    num_nodes = args.nodes or have or 1
    nodes = cloud.provision(ProvisionRequest(cluster_name=args.cluster, num_nodes=num_nodes))
    _print_nodes(args.cluster, nodes)
    if daemon.isolation() is None:
        Console().print(
            "note: nodes are plain processes here (no PID/mount namespaces: they need root or user "
            "namespaces), so `ps` on a node shows the others' processes; each still has its own $TMPDIR"
        )
    return 0


def shrink_refusal(name: str, have: int, asked: int | None) -> str | None:
    """Why `local up NAME --nodes ASKED` is refused on a cluster of HAVE nodes: a local cluster grows in
    place, but never drops nodes (a running job may be on them)."""
    if asked is None or asked >= have:
        return None
    return (
        f"--nodes: local cluster {name} has {have} nodes, more than {asked}; to resize it run "
        f"`airflow-sky local down {name}` then `airflow-sky local up {name} --nodes {asked}`, "
        f"or keep it with --nodes {have}"
    )


def _ls(args: argparse.Namespace) -> int:
    cloud = LocalCloud()
    names = [args.cluster] if args.cluster else cloud.clusters()
    if not names:
        Console().print(f"no local clusters (state dir: {layout.root()})")
        return 0
    if args.cluster:
        _require_cluster(cloud, args.cluster)
    for name in names:
        _print_nodes(name, cloud.nodes(name))
    return 0


def _require_cluster(cloud: LocalCloud, name: str) -> None:
    """A name no local cluster has is an error naming the local clusters' closest name, not an empty one."""
    if not cloud.nodes(name):
        known = cloud.clusters()
        where = f"local clusters: {', '.join(known)}" if known else "there are no local clusters"
        raise ClusterError(f"local cluster {name!r} not found ({where}){did_you_mean(name, known)}")


def _preempt(args: argparse.Namespace) -> int:
    cloud = LocalCloud()
    _require_cluster(cloud, args.cluster)
    if args.notice is not None:
        return _preempt_after_notice(cloud, args.cluster, args.rank, args.notice)
    node = cloud.preempt(args.cluster, args.rank)
    Console().print(f"preempted rank {node.rank} of {args.cluster} ({node.internal_ip}): {node.status.value}")
    return 0


def _preempt_after_notice(cloud: LocalCloud, cluster: str, rank: int, window_s: float) -> int:
    """The clouds' way: a notice, the window, then the kill (of that instance: a replacement that took its
    rank meanwhile is left alone)."""
    if window_s < 1:
        raise SpecError(f"--notice: at least 1 second, got {window_s:g}")
    console = Console()
    node = cloud.notify_preemption(cluster, rank, window_s)
    console.print(f"notice given to rank {rank} of {cluster} ({node.internal_ip}): it goes in {window_s:g} s")
    deadline = time.monotonic() + window_s
    try:
        with console.status("") as status:
            while (left := deadline - time.monotonic()) > 0:
                status.update(f"rank {rank} of {cluster} goes in {left:.0f} s")
                time.sleep(min(0.5, left))
    finally:  # interrupted too: a notice is a promise the node goes
        try:
            gone = cloud.preempt_instance(cluster, node.instance_id)
        except ClusterError:
            console.print(
                f"rank {rank}'s node {node.instance_id} was already replaced or ended: nothing to kill"
            )
        else:
            console.print(f"preempted rank {rank} of {cluster} ({gone.internal_ip}): {gone.status.value}")
    return 0


def _down(args: argparse.Namespace) -> int:
    LocalCloud().terminate(args.cluster)
    from airflow_sky.client.sdk import forget

    forget(args.cluster)
    Console().print(f"cluster {args.cluster} is down")
    return 0


# On a narrow terminal the instance id is cut first, then `ssh port` and `ip` go.
_NODE_COLUMNS = (
    Column("rank"),
    Column("ip", drop=2),
    Column("ssh port", drop=1),
    Column("instance", name=True),
    Column("status"),
)


def _print_nodes(name: str, nodes: list[Any]) -> None:
    console = terminal_console()
    rows = [
        [str(node.rank), node.internal_ip, str(node.ssh_port), node.instance_id, node.status.value]
        for node in nodes
    ]
    console.print(fitted_table(_NODE_COLUMNS, rows, console.width, title=f"local cluster {name}"))
