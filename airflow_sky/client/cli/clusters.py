"""`airflow-sky status | down | stop | start | autostop`: the clusters themselves, like `sky` does."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import ClusterError, SkyError, SpecError


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
    status.add_argument(
        "-r",
        "--refresh",
        action="store_true",
        help="ask every infra configured here for its clusters (and bring this machine's record of them "
        "up to date), as sky's --refresh asks the clouds",
    )
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--ip", action="store_true", help="print the head node's IP address only, as sky's")
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
    _selection(down_cmd, "tear down")
    down_cmd.set_defaults(handler=_down)

    stop = subparsers.add_parser(
        "stop",
        help="stop a cluster's nodes, keeping their disks (local, aws, gcp); `start` or a launch restarts",
    )
    _selection(stop, "stop")
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


def _selection(parser: Any, verb: str) -> None:
    """CLUSTER... (names or glob patterns, as sky's) or -a/--all. (`names`, not `clusters`: a pattern is no
    cluster name, so client/cli/cluster_select.py checks the names.)"""
    parser.add_argument(
        "names", nargs="*", metavar="CLUSTER", help="cluster names or glob patterns ('dev*', quoted)"
    )
    parser.add_argument("-a", "--all", action="store_true", help=f"{verb} every cluster known here")
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _status(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk
    from airflow_sky.client.cli.status_table import print_status

    if args.refresh and (args.ip or args.endpoints or args.endpoint is not None):
        raise SpecError("status: --refresh cannot be combined with --ip or --endpoint(s) (as in sky)")
    if args.endpoints or args.endpoint is not None:
        return _endpoints(args)
    if args.endpoint_port is not None:
        raise SpecError(f"status: {args.endpoint_port} is no cluster name (a port goes with --endpoints)")
    if args.ip:
        return _head_ip(args.clusters)
    refresh = {"refresh": True} if args.refresh else {}
    clusters = sdk.status(args.clusters or None, infra=args.infra, **refresh)
    print_status(clusters, args.infra)
    return 0


def _head_ip(names: list[str]) -> int:
    """`status --ip CLUSTER`: the head node's address alone (the one ssh reaches), as sky's."""
    from airflow_sky.client import sdk

    if len(names) != 1:
        raise SpecError("status --ip: name exactly one cluster (status --ip CLUSTER)")
    (row,) = sdk.status(names)
    if not row["nodes"]:
        raise ClusterError(row.get("note") or f"cluster {names[0]!r} not found")
    head = row["nodes"][0]
    if head["status"] != "RUNNING":
        raise ClusterError(f"cluster {names[0]!r} is not up (its head is {head['status']})")
    print(head["ssh_host"])
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

    return _each_once_confirmed(
        args,
        "down",
        "Terminating cluster(s) {clusters}: their nodes and disks are deleted.",
        lambda name: sdk.down(name, log=_say),
        "terminated",
    )


def _stop(args: argparse.Namespace) -> int:
    from airflow_sky.client import sdk

    return _each_once_confirmed(
        args,
        "stop",
        "Stopping cluster(s) {clusters} (disks are kept).",
        lambda name: sdk.stop(name, log=_say),
        "stopped",
        start_hint=True,
    )


def _say(line: str) -> None:
    """A lifecycle hook's line (its output, its verdict), as it comes."""
    print(line, flush=True)


def _each_once_confirmed(
    args: argparse.Namespace,
    command: str,
    question: str,
    act: Callable[[str], bool | None],
    done: str,
    start_hint: bool = False,
) -> int:
    """`act` on each cluster the arguments mean (names, patterns, --all), once the user said yes (or was
    not asked); `act` returns False for a cluster that was `done` already. One cluster named: its error is
    the command's. Several: each one's error is a line, the others go on, and the exit status says whether
    any failed; one a pattern or --all found in this machine's record that no infra has any more is said to
    be gone."""
    from airflow_sky.client.cli.cluster_select import select
    from airflow_sky.client.cluster_search import ClusterNotFound

    clusters, expanded = select(command, args.names, args.all)
    if not clusters:
        print("No clusters (see `airflow-sky status`).")
        return 0
    if not _confirm(args, question.format(clusters=", ".join(clusters))):
        print("Aborted.")
        return 1
    failed = False
    for name in clusters:
        try:
            acted = act(name)
        except SkyError as e:
            if isinstance(e, ClusterNotFound) and name in expanded:
                print(f"Cluster {name} is gone (no infra has it any more).")
                continue
            if len(clusters) == 1:
                raise
            print(f"airflow-sky: error: cluster {name}: {e}", file=sys.stderr)
            failed = True
            continue
        hint = f" Start it again with: airflow-sky start {name}" if start_hint else ""
        if acted is False:  # as sky says of a cluster stopped already, and goes on with the others
            print(f"Cluster {name} is already {done}.")
            continue
        print(f"Cluster {name} {done}.{hint}")
    return 1 if failed else 0


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
