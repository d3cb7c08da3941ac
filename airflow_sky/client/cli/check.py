"""`airflow-sky check FILE.yaml [--env K=V]... [--env-file F]`: validate a task and print it normalized.

A template (envs/secrets declared null, to be given at launch) is a valid file: `check` prints it with those
values null and says on stderr which values `launch` will need and how to pass them.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from airflow_sky.client.cli.arguments import add_env_arguments

if TYPE_CHECKING:  # the task layer loads when a file is checked (every CLI call registers `check`)
    from airflow_sky.task import Task


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate a task YAML and print it normalized",
        description="Validate a SkyPilot-style task YAML; print the normalized task as YAML on stdout. "
        "An invalid task prints one error line on stderr and exits with status 2. Envs/secrets left null "
        "(a template) are allowed: a note on stderr lists the values `launch` will need.",
    )
    parser.add_argument("file", metavar="FILE.yaml", help="the task YAML")
    parser.add_argument(
        "--infra",
        help="the infra to check the task for, as launch's (default: the task's resources.infra, else local): "
        "fields that have no effect there are named",
    )
    add_env_arguments(parser)
    parser.add_argument(
        "--show-secrets", action="store_true", help="print secret values instead of <redacted>"
    )
    parser.set_defaults(handler=run)


def launch_needs(task: Task, source: str) -> str | None:
    """One line naming the values a template still needs at launch and how to pass each; None if none."""
    from airflow_sky.task.env_values import launch_hint

    if not task.unset:
        return None
    fields = ", ".join(f"{field}.{key}" for key, field in task.unset.items())
    hints = "; ".join(launch_hint(key, field) for key, field in task.unset.items())
    return f"{source}: valid as a template; launch needs values for {fields}: pass {hints}"


def run(args: argparse.Namespace) -> int:
    """Load the task (SpecError propagates to the CLI's one-line error, exit 2) and print it."""
    from airflow_sky.client.cli.common import check_buckets, load_task
    from airflow_sky.task.pipeline import is_pipeline_file

    if is_pipeline_file(args.file):
        return _check_pipeline(args)
    task = load_task(args, allow_unset=True)
    sys.stdout.write(task.to_yaml(redact_secrets=not args.show_secrets))
    infra = str(args.infra or task.resources.infra or "local")
    print_infra_effects(task, infra, args.file)
    print_container_note(task, infra, args.file)
    print_gpu_note(task, infra)
    if task.pool is not None:  # a pool file: say how it is used (a launch would run only its setup)
        print(
            f"airflow-sky: note: a pool file ({task.pool.workers} worker(s) of {task.num_nodes} node(s)): create "
            f"it with `airflow-sky jobs pool apply -p <name> {args.file}`",
            file=sys.stderr,
        )
    needs = launch_needs(task, args.file)
    if needs is not None:
        print(f"airflow-sky: note: {needs}", file=sys.stderr)
    if needs is None:  # a template's buckets are checked once their names are given
        check_buckets(task, infra, fatal=False)
    return 0


def print_infra_effects(task: Task, infra: str, source: str) -> None:
    """On stderr: a warning naming the resource fields that have no effect on `infra`, a note on ports
    an ssh pool does not open (check and launch)."""
    from airflow_sky.task.resources_effects import no_effect_warning, ports_note

    warning = no_effect_warning(source, task.resources, infra)
    if warning is not None:
        print(f"airflow-sky: warning: {warning}", file=sys.stderr)
    note = ports_note(source, task.resources, infra)
    if note is not None:
        print(f"airflow-sky: note: {note}", file=sys.stderr)


def print_gpu_note(task: Task, infra: str) -> None:
    """On stderr: a local launch this machine can never serve (GPUs it lacks), said before any launch."""
    if infra.split("/", 1)[0] != "local":
        return
    from airflow_sky.infra.local.gpus import gpu_refusal

    refusal = gpu_refusal(task.resources, task.num_nodes)
    if refusal is not None:
        print(f"airflow-sky: note: launching on {infra} would fail: {refusal}", file=sys.stderr)


def container_runtimes(infra: str) -> str:
    """Which container runtime the nodes of `infra` use (`image_id: docker:`); local's is probed here."""
    kind, _, pool = infra.partition("/")
    if kind == "local":
        from airflow_sky.node.container import describe_runtimes

        return f"this machine has {describe_runtimes(_local_probe)}"
    if kind == "ssh":
        return (
            f"each host's Docker or Podman, found at launch (`airflow-sky ssh check {pool or '<pool>'}` "
            "lists each host's)"
        )
    return (
        "Docker on each node (the default VM image has it; a custom VM image without it gets it at provision)"
    )


def print_container_note(task: Task, infra: str, source: str) -> None:
    """On stderr, for a task with `image_id: docker:`: where setup and run execute, with which runtime."""
    spec = task.container
    if spec is None:
        return
    print(
        f"airflow-sky: note: {source}: resources.image_id: setup and run execute inside {spec.image}, one "
        f"container per node; on {infra}: {container_runtimes(infra)}",
        file=sys.stderr,
    )


def _local_probe(command: str) -> bool:
    import subprocess

    try:
        return subprocess.run(["bash", "-c", command], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _check_pipeline(args: argparse.Namespace) -> int:
    """A pipeline file: every task validated; the normalized documents printed; one line on how it runs."""
    from airflow_sky.client.cli.pipeline_launch import load_pipeline_args
    from airflow_sky.task.yaml_io import dump_yaml

    pipeline = load_pipeline_args(args, allow_unset=True)
    documents = pipeline.to_documents()
    if args.show_secrets is False:
        documents = [documents[0], *(t.to_dict(redact_secrets=True) for t in pipeline.tasks)]
    sys.stdout.write("---\n".join(dump_yaml(document) for document in documents))
    order = "side by side" if pipeline.execution == "parallel" else "in order"
    names = ", ".join(str(task.name) for task in pipeline.tasks)
    print(
        f"airflow-sky: note: {args.file}: pipeline {pipeline.name!r}, {len(pipeline.tasks)} task(s) run {order}: "
        f"{names}",
        file=sys.stderr,
    )
    for task in pipeline.tasks:
        infra = str(args.infra or task.resources.infra or "local")
        print_infra_effects(task, infra, f"{args.file} ({task.name})")
        print_container_note(task, infra, f"{args.file} ({task.name})")
        needs = launch_needs(task, f"{args.file} ({task.name})")
        if needs is not None:
            print(f"airflow-sky: note: {needs}", file=sys.stderr)
    return 0
