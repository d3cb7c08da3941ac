"""`launch`/`exec`'s ENTRYPOINT as sky reads it (a YAML, a command, or nothing), and what the CLI says of it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from airflow_sky.errors import SpecError

if TYPE_CHECKING:
    from rich.console import Console

    from airflow_sky.task import Task
    from airflow_sky.task.entrypoint import Entrypoint

_ENTRYPOINT_FLAGS = (("name", "-n/--name"), ("workdir", "--workdir"), ("ports", "--ports"))


def resolve_entrypoint(args: argparse.Namespace) -> Entrypoint:
    """Reads `args.entrypoint` (a YAML path, a command, or nothing) into `args.file` (the YAML, or None)
    and `args.run_command` (the command, or None), which load_task reads."""
    from airflow_sky.task.entrypoint import parse_entrypoint

    entry = parse_entrypoint(args.entrypoint)
    if args.workdir is not None and args.git_url is not None:
        raise SpecError("--workdir and --git-url both set the workdir: give one of them")
    args.file = entry.yaml_path
    args.run_command = entry.command
    return entry


def apply_entrypoint_flags(args: argparse.Namespace, task: Task) -> None:
    """-n/--name, --workdir and --ports (launch and exec only) over the task's own."""
    from airflow_sky.task.entrypoint import apply_entrypoint_overrides

    apply_entrypoint_overrides(task, name=args.name, workdir=args.workdir, ports=args.ports)


def warn_ignored_for_pipeline(args: argparse.Namespace) -> None:
    """A pipeline's tasks each keep their own name, workdir and ports (as sky ignores overrides for a DAG)."""
    given = [flag for dest, flag in _ENTRYPOINT_FLAGS if getattr(args, dest, None)]
    if given:
        print(
            f"airflow-sky: warning: {', '.join(given)} ignored, since {args.file} contains multiple tasks "
            "(each names its own)",
            file=sys.stderr,
        )


def ignore_ports_on_exec(args: argparse.Namespace) -> None:
    """As `sky exec`: the ports of a cluster are opened at launch; exec ignores --ports, and says so."""
    if args.ports:
        print(
            f"airflow-sky: note: --ports {' '.join(args.ports)} is ignored by exec (ports are opened when the "
            f"cluster is launched: airflow-sky launch -c {args.cluster} ... --ports PORT)",
            file=sys.stderr,
        )
        args.ports = []


def check_provision_only(args: argparse.Namespace) -> None:
    """`launch -c C` with no YAML or command provisions the cluster only: --down would take it down at once."""
    if args.down and args.idle_minutes is None:
        raise SpecError(
            "--down: with no YAML or command there is no job to wait for, so the cluster would go down at "
            "once; add -i N for it to go down once idle N minutes, or drop --down"
        )


def print_provisioned(console: Console, outcome: Any, infra: str) -> None:
    """The one-line summary of a launch that only provisioned (or reused) the cluster."""
    from rich.text import Text

    nodes = outcome.handle.nodes if outcome.handle is not None else ()
    ips = ", ".join(n.internal_ip for n in nodes)
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}" + (f" ({ips})" if ips else "")
    name = outcome.cluster_name
    console.print(
        Text(
            f"✓ Cluster {name} is up: {count} on {infra}; nothing run (no YAML or command given)",
            style="bold green",
        )
    )
    console.print(
        f"Run on it: airflow-sky exec {name} 'CMD' (or a task YAML); down: airflow-sky down {name}",
        highlight=False,
        markup=False,
    )
