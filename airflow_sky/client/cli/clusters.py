"""`airflow-sky status | down | stop | start | autostop`: the clusters themselves, like `sky` does."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from airflow_sky.errors import SpecError


class _ClustersThenPort(argparse.Action):
    """`CLUSTER... [PORT]`: a trailing number is the port of `status --endpoints CLUSTER PORT` (a cluster
    name starts with a letter), kept apart so that it is never checked as a cluster name."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        names = list(values)
        port = names.pop() if names and names[-1].isdigit() else None
        setattr(namespace, self.dest, names)
        namespace.endpoint_port = None if port is None else int(port)


def register(subparsers: Any) -> None:
    status = subparsers.add_parser("status", help="show clusters and their nodes")
    status.add_argument(
        "clusters",
        nargs="*",
        action=_ClustersThenPort,
        help="only these clusters (with --endpoints: CLUSTER [PORT])",
    )
    status.add_argument(
        "--infra",
        help="infra to query (default: local; named clusters: where they were launched, else every infra "
        "configured here)",
    )
    shown = status.add_mutually_exclusive_group()
    shown.add_argument(
        "--endpoints",
        action="store_true",
        help="print `PORT: host:port` for each port the cluster opened (resources.ports), as sky's",
    )
    shown.add_argument(
        "--endpoint", type=int, metavar="PORT", help="print the `host:port` of one opened port, as sky's"
    )
    status.set_defaults(handler=_status, endpoint_port=None)

    down_cmd = subparsers.add_parser(
        "down", help="tear clusters down (asks first on a terminal, as sky does)"
    )
    down_cmd.add_argument("clusters", nargs="+", help="cluster names")
    down_cmd.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    down_cmd.set_defaults(handler=_down)

    stop = subparsers.add_parser(
        "stop",
        help="stop a cluster's nodes, keeping their disks (local, aws, gcp); `start` or a launch restarts",
    )
    stop.add_argument("clusters", nargs="+", help="cluster names")
    stop.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    stop.set_defaults(handler=_stop)

    start = subparsers.add_parser("start", help="start a stopped cluster again (same disks)")
    start.add_argument("clusters", nargs="+", help="cluster names")
    start.add_argument("-y", "--yes", action="store_true", help="accepted, as sky's; start never asks")
    start.set_defaults(handler=_start)

    autostop = subparsers.add_parser(
        "autostop", help="stop (or, with --down, end) a cluster's nodes once idle for N minutes"
    )
    autostop.add_argument("clusters", nargs="+", help="cluster names")
    when = autostop.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "-i", "--idle-minutes", type=int, metavar="N", help="idle minutes before the nodes stop themselves"
    )
    when.add_argument("--cancel", action="store_true", help="cancel the cluster's autostop")
    autostop.add_argument("--down", action="store_true", help="end the nodes (autodown) instead of stopping")
    autostop.add_argument("-y", "--yes", action="store_true", help="accepted, as sky's; autostop never asks")
    autostop.set_defaults(handler=_autostop)


def _status(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk
    from airflow_sky.client.cli.cluster_jobs import terminal_console

    if args.endpoints or args.endpoint is not None:
        return _endpoints(args)
    if args.endpoint_port is not None:
        raise SpecError(f"status: {args.endpoint_port} is no cluster name (a port goes with --endpoints)")
    clusters = sdk.status(args.clusters or None, infra=args.infra)
    console = terminal_console()
    if not clusters:
        console.print(f"No clusters on {args.infra or 'local'}.")
        return 0
    infras = sorted({c["infra"] for c in clusters if c.get("infra")})
    by_infra = len(infras) > 1  # named clusters on several infras: a column says which
    table = Table(title=f"Clusters ({escape(infras[0])})" if len(infras) == 1 else "Clusters")
    for column in ("NAME", *(["INFRA"] if by_infra else []), "NODES", "HEAD IP", "STATUS"):
        table.add_column(column, overflow="fold")
    for cluster in clusters:
        nodes = cluster["nodes"]
        table.add_row(
            cluster["name"],
            *([escape(cluster.get("infra") or "-")] if by_infra else []),
            str(len(nodes)),
            nodes[0]["internal_ip"] if nodes else "-",
            cluster["status"],
        )
    console.print(table)
    for cluster in clusters:
        if cluster.get("note"):
            print(f"{cluster['name']}: {cluster['note']}")
    return 0


def _endpoints(args: argparse.Namespace) -> int:
    """`status --endpoints CLUSTER [PORT]` / `status CLUSTER --endpoint PORT`: sky's output shape (one
    `PORT: host:port` line each; a single port prints its `host:port` alone)."""
    from airflow_sky.client import sdk

    names = list(args.clusters)
    port = args.endpoint if args.endpoint is not None else args.endpoint_port
    if len(names) != 1:
        raise SpecError(
            "status --endpoints/--endpoint: name exactly one cluster (status --endpoints CLUSTER [PORT])"
        )
    found = sdk.endpoints(names[0], port)
    if port is not None:
        print(found[port])
        return 0
    if not found:
        print(
            f"No endpoint found for cluster {names[0]!r} (the task set no resources.ports).", file=sys.stderr
        )
        return 1
    for number, address in found.items():
        print(f"{number}: {address}")
    return 0


def _confirm(args: argparse.Namespace, question: str) -> bool:
    """Ask on a terminal unless -y, as sky does; without a terminal (a script, CI) never ask."""
    if args.yes or not sys.stdin.isatty():
        return True
    answer = input(f"{question} Proceed? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _down(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    question = f"Terminating cluster(s) {', '.join(args.clusters)}: their nodes and disks are deleted."
    return _each_once_confirmed(args, question, sdk.down, "Cluster {name} terminated.")


def _stop(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    question = f"Stopping cluster(s) {', '.join(args.clusters)} (disks are kept)."
    done = "Cluster {name} stopped. Start it again with: airflow-sky start {name}"
    return _each_once_confirmed(args, question, sdk.stop, done)


def _each_once_confirmed(
    args: argparse.Namespace, question: str, act: Callable[[str], None], done: str
) -> int:
    """`act` on each named cluster, saying `done` of each, once the user said yes (or was not asked)."""
    if not _confirm(args, question):
        print("Aborted.")
        return 1
    for name in args.clusters:
        act(name)
        print(done.format(name=name))
    return 0


def _start(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    for name in args.clusters:
        sdk.start(name)
        print(f"Cluster {name} started.")
    return 0


def _autostop(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    for name in args.clusters:
        if args.cancel:
            sdk.autostop(name, None)
            print(f"Autostop of cluster {name} cancelled.")
            continue
        sdk.autostop(name, args.idle_minutes, down=args.down)
        print(f"Cluster {name}: {idle_limit(args.idle_minutes, args.down)}.")
    return 0


def idle_limit(asked_minutes: int, down: bool) -> str:
    """The idle limit the nodes' watchers apply (the one this process arms them with), in words."""
    from airflow_sky.client.cli.idle import idle_limit_text
    from airflow_sky.infra.cluster import autostop_check_s

    return idle_limit_text(asked_minutes, autostop_check_s(), down)
