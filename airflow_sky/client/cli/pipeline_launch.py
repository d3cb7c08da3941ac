"""`airflow-sky launch pipeline.yaml`: a pipeline's tasks one after another, each a launch of its own.

Each task runs on a cluster of its own (`<cluster>-<index>-<task>`), torn down when it ends unless
`--no-down`, with the same live view as a one-task launch. A failed task stops the pipeline: the tasks after
it never start. A task's `{{ sky_result('earlier') }}` expressions are rendered from the results of the
tasks before it, and every task sees SKYPILOT_TASK_IDS, as in SkyPilot's managed pipelines.

`execution: parallel` pipelines need tasks running side by side, which is a scheduler's work: they run as a
DAG (dags_from_folder, dag_from_yaml).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from airflow_sky.client.cli.common import env_values
from airflow_sky.client.cli.common import secret_values as launch_secrets
from airflow_sky.client.cluster_names import generated_cluster_name, pipeline_cluster_name
from airflow_sky.client.engine import LaunchOptions
from airflow_sky.errors import SpecError
from airflow_sky.task import SpecWarning, Task
from airflow_sky.task.envs import pipeline_task_ids
from airflow_sky.task.pipeline import PARALLEL, Pipeline
from airflow_sky.task.templating import render_results

# Flags that change one task's resources or workdir: a pipeline's tasks each say their own.
_RESOURCE_FLAGS = {
    "git_url": "--git-url",
    "git_ref": "--git-ref",
    "num_nodes": "--num-nodes",
    "gpus": "--gpus",
    "cpus": "--cpus",
    "memory": "--memory",
    "instance_type": "--instance-type",
    "use_spot": "--use-spot/--no-use-spot",
    "region": "--region",
    "zone": "--zone",
    "disk_size": "--disk-size",
    "image_id": "--image-id",
}

Runner = Callable[..., int]


def load_pipeline_args(args: argparse.Namespace, *, allow_unset: bool = False) -> Pipeline:
    """The pipeline of `args.file` with --env/--env-file/--secret/--secret-file applied to every task."""
    overrides = env_values("--env", args.env)
    secret_values = launch_secrets(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        pipeline = Pipeline.from_yaml(
            args.file,
            env_overrides={**overrides, **secret_values},
            env_file=args.env_file,
            allow_unset=allow_unset,
        )
    for task in pipeline.tasks:
        if secret_values:
            for key in secret_values:
                task.envs.pop(key, None)
            task.update_secrets(secret_values)
    for warning in caught:
        print(f"airflow-sky: warning: {warning.message}", file=sys.stderr)
    return pipeline


def check_pipeline_args(args: argparse.Namespace, pipeline: Pipeline) -> None:
    """Refuse the launch flags a pipeline cannot take, naming the flag and why; resource overrides are
    ignored with a warning, as SkyPilot does for a multi-task file."""
    if pipeline.execution == PARALLEL:
        raise SpecError(
            f"{args.file}: execution: parallel runs its {len(pipeline.tasks)} tasks side by side, which needs "
            "an Airflow scheduler; put the file in a dags_from_folder folder (or use dag_from_yaml) and trigger "
            "the DAG, or drop `execution: parallel` to run them one after another here"
        )
    given = [flag for name, flag in _RESOURCE_FLAGS.items() if getattr(args, name, None) is not None]
    if given:  # as `sky jobs launch` says of a pipeline: which override to apply to which task is unclear
        print(
            f"airflow-sky: warning: override params {', '.join(given)} are ignored, since {args.file} contains "
            "multiple tasks (each names its own resources; --infra, --env/--secret and their files apply)",
            file=sys.stderr,
        )
    if args.detach_run:
        raise SpecError("--detach-run: a pipeline's next task starts when this one ends; run it attached")
    if args.idle_minutes is not None:
        raise SpecError(
            "--idle-minutes-to-autostop: a pipeline's clusters go down as each task ends; set `autostop` in "
            "a task's resources to keep its cluster (with --no-down) until idle"
        )


def launch_pipeline(args: argparse.Namespace, run: Runner) -> int:
    """Run every task of the pipeline in order with `run` (the one-task launch); returns the exit code."""
    pipeline = load_pipeline_args(args)
    check_pipeline_args(args, pipeline)
    console = Console(highlight=False, soft_wrap=True)
    infras = [str(args.infra or task.resources.infra or "local") for task in pipeline.tasks]
    if args.dryrun:
        from airflow_sky.client.cli.dryrun import print_plan

        for number, (task, infra) in enumerate(zip(pipeline.tasks, infras, strict=True), start=1):
            console.print(f"[bold]Task {number}/{len(pipeline.tasks)}: {task.name}[/]")
            print_plan(task, infra, console)
        return 0
    base = args.cluster or generated_cluster_name()
    clusters = [pipeline_cluster_name(base, index, job_id) for index, job_id in enumerate(pipeline.job_ids)]
    down = True if args.down is None else bool(args.down)
    if not args.yes and sys.stdin.isatty():
        plan = ", ".join(f"{t.name} ({t.num_nodes} nodes)" for t in pipeline.tasks)
        answer = input(f"Launching pipeline {pipeline.name}: {plan}, in this order. Proceed? [Y/n] ")
        if answer.strip().lower() not in ("", "y", "yes"):
            print("Aborted.")
            return 1
    names = tuple(task.name or job_id for task, job_id in zip(pipeline.tasks, pipeline.job_ids, strict=True))
    task_ids = tuple(pipeline_task_ids(pipeline.name, names, datetime.now(UTC), secrets.token_hex(3)))
    results: dict[str, Any] = {}
    total = len(pipeline.tasks)
    for index, task in enumerate(pipeline.tasks):
        job_id = pipeline.job_ids[index]
        console.print(f"[bold]━━ Task {index + 1}/{total}: {task.name} on {clusters[index]}[/]")
        options = LaunchOptions(
            cluster_name=clusters[index],
            infra=infras[index],
            down=down,
            setup=not args.no_setup,
            retry_until_up=args.retry_until_up,
            pipeline_name=pipeline.name,
            pipeline_index=index,
            pipeline_task_names=names,
            pipeline_task_ids=task_ids,
        )
        outcomes: list[Any] = []
        code = run(_rendered(task, results), options, args.file, outcomes)
        if code != 0:
            rest = ", ".join(str(t.name) for t in pipeline.tasks[index + 1 :])
            skipped = f"; not started: {rest}" if rest else ""
            console.print(
                f"[bold red]✗ Pipeline {pipeline.name} FAILED at task {index + 1}/{total} ({task.name}){skipped}[/]"
            )
            return code
        results[job_id] = outcomes[-1].result if outcomes else None
    console.print(f"[bold green]✓ Pipeline {pipeline.name} SUCCEEDED: {total} tasks[/]")
    return 0


def _rendered(task: Task, results: dict[str, Any]) -> Task:
    return render_results(task, results) if results else task
