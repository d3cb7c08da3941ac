"""`airflow-sky launch | exec`: run jobs on a cluster (launched or reused), like `sky launch` and `sky exec`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from rich.console import Console

from airflow_sky.client.cli.arguments import add_entrypoint, add_task_overrides
from airflow_sky.errors import SpecError

# Loaded by the handlers that run a task: `status`, `down` and the others answer without the task layer.
if TYPE_CHECKING:
    from airflow_sky.task import Task


def register(subparsers: Any) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="launch a cluster (or reuse it) and run a task (a YAML or a command) on it, as an Airflow DAG "
        "run in this process",
    )
    add_entrypoint(launch, required=False)
    launch.add_argument("-c", "--cluster", help="cluster name (default: sky-<random>-<user>)")
    add_task_overrides(launch)
    down = launch.add_mutually_exclusive_group()
    down.add_argument(
        "--down", dest="down", action="store_true", help="tear the cluster down when the job ends"
    )
    down.add_argument(
        "--no-down",
        dest="down",
        action="store_false",
        help="keep the cluster (the default for one task; a pipeline's clusters go down unless given)",
    )
    launch.set_defaults(down=None)  # a task's cluster is kept; a pipeline's clusters go down (see --no-down)
    launch.add_argument("--no-setup", action="store_true", help="skip the setup section")
    launch.add_argument(
        "-i",
        "--idle-minutes-to-autostop",
        dest="idle_minutes",
        type=int,
        metavar="N",
        help="each node stops itself after N idle minutes (no job, no Airflow task touching it); with "
        "--down it ends itself instead (autodown), and the cluster stays up until then",
    )
    launch.add_argument(
        "-r",
        "--retry-until-up",
        action="store_true",
        help="on a cloud without capacity anywhere: keep trying (with backoff) instead of failing",
    )
    launch.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    launch.add_argument("-d", "--detach-run", action="store_true", help="return as soon as the job started")
    launch.add_argument(
        "--dryrun", action="store_true", help="print the chosen resources and their cost; launch nothing"
    )
    launch.set_defaults(handler=_launch)

    exec_ = subparsers.add_parser(
        "exec", help="sync the workdir to a running cluster and run the task, a YAML or a command (no setup)"
    )
    exec_.add_argument("cluster", help="an existing cluster")
    add_entrypoint(exec_, required=True)
    add_task_overrides(exec_)
    exec_.add_argument("-d", "--detach-run", action="store_true", help="return as soon as the job started")
    exec_.set_defaults(handler=_exec)


def task_with_overrides(args: argparse.Namespace, *, worker_is_here: bool = True) -> Task:
    """The task of `args.file` (or of `launch`/`exec`'s command) with every override flag applied.
    `worker_is_here`: this process runs the job's Airflow tasks (launch, exec), so a git SSH key path of
    this machine's environment applies."""
    from airflow_sky.client.cli.common import git_credentials_from_environment, load_task

    entrypoint_flags = getattr(args, "entrypoint", None) is not None  # launch, exec: -n, --workdir, --ports
    if entrypoint_flags and not hasattr(args, "file"):
        from airflow_sky.client.cli.launch_entry import resolve_entrypoint

        resolve_entrypoint(args)  # (the handlers resolved it already)
    task = load_task(args)
    if entrypoint_flags:
        from airflow_sky.client.cli.launch_entry import apply_entrypoint_flags

        apply_entrypoint_flags(args, task)
    task.update_workdir(git_url=args.git_url, git_ref=args.git_ref)
    git_credentials_from_environment(task, os.environ, key_path=worker_is_here)
    if args.num_nodes is not None:
        if args.num_nodes < 1:
            raise SpecError(f"--num-nodes: must be an integer >= 1, got {args.num_nodes}")
        task.num_nodes = args.num_nodes
    pairs = (
        ("accelerators", args.gpus),
        ("cpus", args.cpus),
        ("memory", args.memory),
        ("instance_type", args.instance_type),
        ("use_spot", args.use_spot),
        ("disk_size", args.disk_size),
        ("image_id", args.image_id),
    )
    overrides: dict[str, object] = {k: v for k, v in pairs if v is not None}
    if args.region is not None or args.zone is not None:
        # `sky launch --region R`: the placement is the cloud of --infra or of the task, in that region/zone.
        cloud = (args.infra or "").split("/", 1)[0] or task.resources.cloud
        overrides.update(cloud=cloud, region=args.region or task.resources.region, zone=args.zone)
        args.infra = None
    if overrides:
        task.set_resources(task.resources.copy(**overrides))
    return task


def _infra(args: argparse.Namespace, task: Task) -> str:
    return str(args.infra or task.resources.infra or "local")


def _run(
    task: Task,
    options: Any,
    task_file: str,
    outcomes: list[Any] | None = None,
    *,
    launch_command: str | None = None,
    provision_only: bool = False,
) -> int:
    """Run the launch in this process, printing progress; Ctrl-C detaches (the job keeps running).

    `outcomes` receives the launch's JobOutcome (a pipeline's next job reads its result); `launch_command`:
    the launch an exec's error suggests; `provision_only`: `launch -c C` with no YAML or command.
    """
    from airflow_sky.client import sdk
    from airflow_sky.client.cli import PipeSafeOutput
    from airflow_sky.client.cli.progress import ProgressPrinter, print_summary

    # A handle on the real stdout: while the DAG runs, fd 1 goes to the launch's Airflow log file.
    # `launch ... | head`: once the reader is gone, the output is dropped and the job still runs to its end.
    terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    console = Console(
        file=cast(TextIO, PipeSafeOutput(terminal, exit=False)), highlight=False, soft_wrap=True
    )
    started_at = time.time()
    printer = ProgressPrinter(
        console,
        down=options.down,
        new_nodes=not options.must_exist,
        setup=bool(options.setup and task.setup is not None),
        runs_nothing=provision_only,
    )
    job: dict[str, Any] = {}
    queued: dict[str, Any] = {}  # the job while it waits in the cluster's queue (before the `job` event)
    main_pid = os.getpid()

    def detach(signum: int, frame: Any) -> None:
        # Detach hard: unwinding through Airflow's task runner would fail the task and run teardown, which
        # is exactly what Ctrl-C must not do. The job is handed to a background driver that takes it to its
        # end, whatever phase it was in. The handler may interrupt a console write, so it writes to the raw
        # fd and always ends in os._exit.
        try:
            if os.getpid() == main_pid:
                _stop_helpers()
                from airflow_sky.client.detach import hand_over
                from airflow_sky.client.engine import abandon_launch
                from airflow_sky.task.launch import Launch

                log_file = abandon_launch()
                driver = None
                if job.get("job_id") is not None and log_file is not None:
                    driver = hand_over(Launch(task, options), dict(job), log_file)
                show_cursor = "\x1b[?25h" if console.is_terminal else ""  # the live status hid it
                message = (
                    _cancel_queued(int(queued["job_id"]), options.cluster_name)
                    if job.get("job_id") is None and queued.get("job_id") is not None
                    else _detach_message(job, options.cluster_name, options.down, driver, log_file)
                )
                os.write(console.file.fileno(), (show_cursor + message).encode())
        finally:
            os._exit(130)

    def listener(event: Any) -> None:
        if event.kind == "job":
            job.update(event.data)
        if event.kind == "queued":
            queued.update(event.data)
        printer(event)

    previous = signal.signal(signal.SIGINT, detach)
    try:
        outcome = sdk.run(task, options, listener, task_file, launch_command)
        if outcomes is not None:
            outcomes.append(outcome)
    finally:
        signal.signal(signal.SIGINT, previous)
        printer.close()
    if not options.follow and outcome.job_id is not None:
        verb = (
            "queued (PENDING; it starts once the nodes it needs are free)"
            if outcome.state == "queued"
            else "started"
        )
        console.print(
            f"Job {outcome.job_id} {verb} on {outcome.cluster_name}. Follow it: airflow-sky logs "
            f"{outcome.cluster_name} {outcome.job_id}; status: airflow-sky logs --status {outcome.cluster_name} {outcome.job_id}"
        )
        return 0 if outcome.state in ("success", "queued") else 1
    if provision_only and outcome.succeeded:
        from airflow_sky.client.cli.launch_entry import print_provisioned

        print_provisioned(console, outcome, options.infra)
        return 0
    print_summary(console, outcome, started_at, _queue_status(outcome, options))
    if not options.down and outcome.job_id is not None:
        autostop = task.resources.autostop
        when = ""
        if isinstance(autostop, dict):
            from airflow_sky.client.cli.clusters import idle_limit

            when = "; " + idle_limit(autostop["idle_minutes"], bool(autostop["down"]))
        console.print(
            f"Cluster {outcome.cluster_name} is kept{when}. Down now with: airflow-sky down {outcome.cluster_name}"
        )
    return 0 if outcome.succeeded else 1


def _queue_status(outcome: Any, options: Any) -> str | None:
    """The job's status as `queue` shows it (FAILED_SETUP, CANCELLED, ...): read from the kept cluster."""
    if options.down or outcome.job_id is None:
        return None
    from airflow_sky.client import sdk
    from airflow_sky.errors import SkyError

    try:
        status = sdk.job_status(outcome.cluster_name, [outcome.job_id]).get(outcome.job_id)
    except SkyError:
        return None
    return status.value if status is not None else None


def _cancel_queued(job_id: int, cluster: str) -> str:
    """Ctrl-C while the job waits in the queue: nothing would start it once this process is gone."""
    from airflow_sky.client import sdk
    from airflow_sky.errors import SkyError

    try:
        sdk.cancel(cluster, [job_id])
    except SkyError as e:
        return f"\nInterrupted while job {job_id} waited in the queue; cancelling it failed: {e}\n"
    return (
        f"\nInterrupted while job {job_id} waited in the queue (PENDING): cancelled it, it never started. "
        f"`airflow-sky exec -d` queues a job and returns.\n"
    )


def _detach_message(
    job: dict[str, Any], default_cluster: str, down: bool, driver: int | None, log_file: Path | None
) -> str:
    cluster = job.get("cluster_name", default_cluster)
    job_id = job.get("job_id")
    if job_id is None:
        return f"\nInterrupted before the job started on {cluster}.\n"
    end = "then the cluster goes down (--down)" if down else "the cluster is kept"
    return (
        f"\nDetached from the logs; job {job_id} keeps running on {cluster} to its end; {end}.\n"
        f"  Reattach: airflow-sky logs {cluster} {job_id}\n"
        f"  Stop it:  airflow-sky cancel {cluster} {job_id}\n"
        f"  Status:   airflow-sky queue {cluster}\n"
        + (f"  (driven by background process {driver}; its log: {log_file})\n" if driver else "")
    )


def _stop_helpers() -> None:
    """Kill the processes this launch forked (Airflow helpers, ssh, rsync), sparing local nodes and jobs."""
    import psutil

    from airflow_sky.infra.local.layout import NODE_MARKER_ENV

    for child in psutil.Process().children(recursive=True):
        try:
            if NODE_MARKER_ENV not in child.environ():
                child.kill()
        except psutil.Error:
            continue


def _launch(args: argparse.Namespace) -> int:
    from airflow_sky.client.cli.check import print_infra_effects
    from airflow_sky.client.cli.common import check_buckets, check_git_workdir
    from airflow_sky.client.cli.launch_entry import check_provision_only, resolve_entrypoint
    from airflow_sky.client.cluster_names import generated_cluster_name
    from airflow_sky.client.engine import LaunchOptions
    from airflow_sky.task.pipeline import is_pipeline_file

    entry = resolve_entrypoint(args)
    if args.file is not None and is_pipeline_file(args.file):
        from airflow_sky.client.cli.launch_entry import warn_ignored_for_pipeline
        from airflow_sky.client.cli.pipeline_launch import launch_pipeline

        warn_ignored_for_pipeline(args)
        return launch_pipeline(args, _run)
    provision_only = entry.yaml_path is None and entry.command is None
    if provision_only:
        check_provision_only(args)
    task = task_with_overrides(args)
    infra = _infra(args, task)
    print_infra_effects(task, infra, entry.label)
    if args.dryrun:
        from airflow_sky.client.cli.dryrun import print_plan

        print_plan(task, infra, Console(highlight=False, soft_wrap=True))
        return 0
    check_git_workdir(task)
    check_buckets(task, infra)
    cluster = args.cluster or generated_cluster_name()
    if entry.command is not None:
        print(f"Command to run: {entry.command}")  # as sky says what it took the words for
    if not args.yes and sys.stdin.isatty():
        what = "Provisioning" if provision_only else f"Launching {task.name or 'a task'} on"
        answer = input(f"{what} cluster {cluster} ({infra}, {task.num_nodes} nodes). Proceed? [Y/n] ")
        if answer.strip().lower() not in ("", "y", "yes"):
            print("Aborted.")
            return 1
    down = bool(args.down)
    if args.idle_minutes is not None:
        if args.idle_minutes < 0:
            raise SpecError(f"--idle-minutes-to-autostop: must be >= 0, got {args.idle_minutes}")
        # As `sky launch -i N [--down]`: the nodes stop (or, with --down, end) themselves once idle.
        task.set_resources(task.resources.copy(autostop={"idle_minutes": args.idle_minutes, "down": down}))
        down = False
    if args.detach_run and down:
        raise SpecError(
            "--down cannot be combined with --detach-run: the cluster would go down under the running job "
            "(add -i N for the nodes to end themselves once idle)"
        )
    return _run(
        task,
        LaunchOptions(
            cluster_name=cluster,
            infra=infra,
            down=down,
            setup=not args.no_setup,
            follow=provision_only or not args.detach_run,  # nothing to detach from without a job
            retry_until_up=args.retry_until_up,
        ),
        entry.label,
        provision_only=provision_only,
    )


def _exec(args: argparse.Namespace) -> int:
    from airflow_sky.client.cli.common import check_buckets
    from airflow_sky.client.cli.hints import launch_command
    from airflow_sky.client.cli.launch_entry import ignore_ports_on_exec, resolve_entrypoint
    from airflow_sky.client.engine import LaunchOptions
    from airflow_sky.client.sdk import infra_of

    entry = resolve_entrypoint(args)
    suggested = launch_command(args.cluster, args)  # before the overrides are applied to `args`
    ignore_ports_on_exec(args)
    task = task_with_overrides(args)
    if entry.command is not None:
        print(f"Command to run: {entry.command}")

    infra = args.infra or infra_of(args.cluster, task.resources.infra)
    check_buckets(task, infra)
    return _run(
        task,
        LaunchOptions(
            cluster_name=args.cluster,
            infra=infra,
            down=False,
            setup=False,
            must_exist=True,
            follow=not args.detach_run,
        ),
        entry.label,
        launch_command=suggested,
    )
