"""`airflow-sky launch | exec | status | down`: run jobs and manage clusters, like `sky` does."""

from __future__ import annotations

import argparse
import getpass
import os
import secrets
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from airflow_sky.cli.common import add_env_arguments, load_task
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.spec import Task


def register(subparsers: Any) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="launch a cluster (or reuse it) and run a task on it, as an Airflow DAG run in this process",
    )
    launch.add_argument("file", metavar="FILE.yaml", help="the task YAML")
    launch.add_argument("-c", "--cluster", help="cluster name (default: sky-<random>-<user>)")
    _add_task_overrides(launch)
    down = launch.add_mutually_exclusive_group()
    down.add_argument(
        "--down", dest="down", action="store_true", help="tear the cluster down when the job ends"
    )
    down.add_argument("--no-down", dest="down", action="store_false", help="keep the cluster (the default)")
    launch.set_defaults(down=False)
    launch.add_argument("--no-setup", action="store_true", help="skip the setup section")
    launch.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    launch.set_defaults(handler=_launch)

    exec_ = subparsers.add_parser(
        "exec", help="sync the workdir to a running cluster and run the task (no setup)"
    )
    exec_.add_argument("cluster", help="an existing cluster")
    exec_.add_argument("file", metavar="FILE.yaml", help="the task YAML")
    _add_task_overrides(exec_)
    exec_.set_defaults(handler=_exec)

    status = subparsers.add_parser("status", help="show clusters and their nodes")
    status.add_argument("clusters", nargs="*", help="only these clusters")
    status.add_argument("--infra", default="local", help="infra to query (default: local)")
    status.set_defaults(handler=_status)

    down_cmd = subparsers.add_parser("down", help="tear a cluster down")
    down_cmd.add_argument("clusters", nargs="+", help="cluster names")
    down_cmd.add_argument("--infra", default="local", help="the clusters' infra (default: local)")
    down_cmd.set_defaults(handler=_down)


def _add_task_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--infra", help="local (default), ssh/<pool>, aws[/region], gcp[/region]")
    parser.add_argument("--num-nodes", type=int, help="override num_nodes")
    parser.add_argument("--gpus", help="override resources.accelerators, e.g. L4:4")
    parser.add_argument("--cpus", help="override resources.cpus, e.g. 8 or 4+")
    add_env_arguments(parser)


def _task_with_overrides(args: argparse.Namespace) -> Task:
    task = load_task(args)
    if args.num_nodes is not None:
        if args.num_nodes < 1:
            raise SpecError(f"--num-nodes: must be an integer >= 1, got {args.num_nodes}")
        task.num_nodes = args.num_nodes
    overrides = {k: v for k, v in (("accelerators", args.gpus), ("cpus", args.cpus)) if v is not None}
    if overrides:
        task.set_resources(task.resources.copy(**overrides))
    return task


def _infra(args: argparse.Namespace, task: Task) -> str:
    return str(args.infra or task.resources.infra or "local")


def _run(
    args: argparse.Namespace, task: Task, cluster: str, infra: str, down: bool, setup: bool, must_exist: bool
) -> int:
    from airflow_sky.cli.progress import ProgressPrinter, print_summary
    from airflow_sky.engine import LaunchOptions, prepare_airflow

    # A handle on the real stdout: while the DAG runs, fd 1 goes to the launch's Airflow log file.
    console = Console(
        file=os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1), highlight=False, soft_wrap=True
    )
    prepare_airflow()  # before anything imports Airflow
    from airflow_sky.engine import run_job

    started_at = time.time()
    printer = ProgressPrinter(console)
    try:
        outcome = run_job(
            task,
            LaunchOptions(cluster_name=cluster, infra=infra, down=down, setup=setup, must_exist=must_exist),
            listener=printer,
        )
    finally:
        printer.close()
    print_summary(console, outcome, started_at)
    if not down and outcome.job_id is not None:
        console.print(
            f"Cluster {outcome.cluster_name} is kept. Stop it with: airflow-sky down {outcome.cluster_name}"
        )
    return 0 if outcome.succeeded else 1


def _launch(args: argparse.Namespace) -> int:
    task = _task_with_overrides(args)
    infra = _infra(args, task)
    cluster = args.cluster or f"sky-{secrets.token_hex(2)}-{getpass.getuser()}"
    if not args.yes and sys.stdin.isatty():
        answer = input(
            f"Launching {task.name or 'a task'} on cluster {cluster} ({infra}, {task.num_nodes} nodes). Proceed? [Y/n] "
        )
        if answer.strip().lower() not in ("", "y", "yes"):
            print("Aborted.")
            return 1
    return _run(args, task, cluster, infra, down=args.down, setup=not args.no_setup, must_exist=False)


def _exec(args: argparse.Namespace) -> int:
    task = _task_with_overrides(args)
    return _run(args, task, args.cluster, _infra(args, task), down=False, setup=False, must_exist=True)


def _status(args: argparse.Namespace) -> int:
    from airflow_sky.clouds.registry import get_cloud

    cloud = get_cloud(args.infra)
    names = args.clusters or list(cloud.clusters())
    console = Console(highlight=False)
    if not names:
        console.print(f"No clusters on {args.infra}.")
        return 0
    table = Table(title=f"Clusters ({args.infra})")
    for column in ("cluster", "nodes", "head ip", "status"):
        table.add_column(column)
    for name in names:
        nodes = cloud.nodes(name)
        if not nodes:
            table.add_row(name, "0", "-", "NOT FOUND")
            continue
        states = sorted({n.status.value for n in nodes})
        table.add_row(
            name, str(len(nodes)), nodes[0].internal_ip, "UP" if states == ["RUNNING"] else ",".join(states)
        )
    console.print(table)
    return 0


def _down(args: argparse.Namespace) -> int:
    from airflow_sky.clouds.registry import get_cloud

    cloud = get_cloud(args.infra)
    known = set(cloud.clusters())
    missing = [name for name in args.clusters if name not in known]
    if missing:
        raise ClusterError(f"cluster(s) not found on {args.infra}: {', '.join(missing)}")
    for name in args.clusters:
        cloud.terminate(name)
        print(f"Cluster {name} terminated.")
    return 0
