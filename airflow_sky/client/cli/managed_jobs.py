"""`airflow-sky jobs launch | queue | logs | cancel`: managed jobs on a deployed Airflow, like `sky jobs`."""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from airflow_sky.client.cli.pool import pool_lines
from airflow_sky.client.cli.progress_cells import eta_cell, progress_cell
from airflow_sky.errors import SpecError

if TYPE_CHECKING:  # (not at run time: it imports the DAG module, hence Airflow)
    from airflow_sky.client.managed_jobs import ManagedJob


def register(subparsers: Any) -> None:
    jobs = subparsers.add_parser(
        "jobs",
        help="managed jobs: run on a deployed Airflow, which recovers them (airflow-sky jobs --help)",
        description="Managed jobs run by a deployed Airflow (the airflow_sky_jobs DAG) through its REST API: "
        "AIRFLOW_SKY_API_URL and AIRFLOW_SKY_API_TOKEN (or _USERNAME/_PASSWORD), or the api: section of "
        "~/.airflow_sky/config.yaml, or airflowctl's configuration (docs/deploy.md).",
    )
    commands = jobs.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)

    from airflow_sky.client.cli.arguments import add_entrypoint
    from airflow_sky.client.cli.launch import add_task_overrides

    launch = commands.add_parser(
        "launch", help="submit a task YAML (or a command) as a managed job and follow its logs"
    )
    add_entrypoint(launch, required=True)  # a YAML or `'python train.py'`, with -n/--workdir/--ports
    launch.add_argument(
        "-c",
        "--cluster",
        help="cluster name: <your user>--<name>, or one the deployment shares (default: one per job)",
    )
    launch.add_argument("--keep", action="store_true", help="keep the cluster after the job (default: down)")
    from airflow_sky.client.cli.pool import add_pool_launch_arguments
    from airflow_sky.client.cli.pool import register as register_pool

    add_pool_launch_arguments(launch)  # -p/--pool, --num-jobs
    launch.add_argument("-d", "--detach", action="store_true", help="print the job id and return")
    launch.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    add_task_overrides(launch)  # (with --env/--secret and their files)
    launch.set_defaults(handler=_launch)

    queue = commands.add_parser("queue", help="list managed jobs with their status and recoveries")
    queue.add_argument("-l", "--limit", type=int, default=50, help="newest N jobs (default 50)")
    queue.add_argument(
        "-s", "--skip-finished", action="store_true", help="only the jobs not ended (pending, running)"
    )
    queue.set_defaults(handler=_queue)

    logs = commands.add_parser("logs", help="print (and follow) a managed job's logs, every rank")
    logs.add_argument(
        "job_id",
        nargs="?",
        metavar="JOB_ID",
        help="the job's id or run id (jobs queue; default: the latest job)",
    )
    logs.add_argument("--no-follow", action="store_true", help="print what is there and return")
    logs.set_defaults(handler=_logs)

    cancel = commands.add_parser("cancel", help="stop managed jobs and their nodes")
    cancel.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="the jobs' ids or run ids (jobs queue)")
    cancel.add_argument("-n", "--name", help="cancel the managed jobs of this name that have not ended")
    cancel.add_argument("-a", "--all", action="store_true", help="cancel every managed job not ended")
    cancel.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (-a asks)")
    cancel.set_defaults(handler=_cancel)
    register_pool(commands)  # jobs pool apply | status | down


def _launch(args: argparse.Namespace) -> int:
    from airflow_sky.client import managed_jobs
    from airflow_sky.client.cli.launch import task_with_overrides
    from airflow_sky.client.cli.launch_entry import resolve_entrypoint, warn_ignored_for_pipeline
    from airflow_sky.client.cli.pipeline_launch import load_pipeline_args
    from airflow_sky.task.pipeline import is_pipeline_file

    def confirm(name: str) -> bool:
        return _confirm_launch(args, name)

    progress = UploadProgressBar(Console(stderr=True, highlight=False))
    # Checked here: a bad task never reaches Airflow.
    try:
        entry = resolve_entrypoint(args)
        if entry.command is not None:
            print(f"Command to run: {entry.command}")  # as sky says what it took the words for
        if args.file is not None and is_pipeline_file(args.file):
            warn_ignored_for_pipeline(args)
            if args.cluster or args.num_nodes is not None:
                raise SpecError(
                    "-c/--num-nodes: a pipeline's tasks each get a cluster of their own and name their node counts"
                )
            pipeline = load_pipeline_args(args)
            job_id = managed_jobs.launch(
                pipeline, infra=args.infra, down=not args.keep, confirm=confirm, upload_progress=progress
            )
            what = f"pipeline {pipeline.name}, {len(pipeline.tasks)} tasks in order"
        elif args.pool is not None:
            from airflow_sky.client.cli.pool import launch_on_pool

            task = task_with_overrides(args, worker_is_here=False)
            return launch_on_pool(args, task, confirm, _follow)
        else:
            if args.num_jobs is not None:
                raise SpecError("--num-jobs: only with --pool (each job runs on a free worker of the pool)")
            # The deployed Airflow's workers run it: a key path of this machine means nothing there.
            task = task_with_overrides(args, worker_is_here=False)  # with -n/--workdir/--ports
            job_id = managed_jobs.launch(
                task,
                infra=args.infra or task.resources.infra,
                cluster_name=args.cluster,
                down=not args.keep,
                confirm=confirm,
                upload_progress=progress,
            )
            what = f"{task.name or 'unnamed'}, {task.num_nodes} node(s)"
    except managed_jobs.LaunchAborted:
        print("Aborted.")
        return 1
    finally:
        progress.close()
    print(f"Managed job {job_id} submitted ({what})", flush=True)
    if args.detach:
        print(f"Follow it with: airflow-sky jobs logs {job_id}")
        return 0
    return _follow(job_id, detach_hint=True)


def _confirm_launch(args: argparse.Namespace, name: str) -> bool:
    """`sky jobs launch`'s question, asked only on a terminal and without -y (a script is never stopped)."""
    if args.yes or not sys.stdin.isatty():
        return True
    answer = input(f"Launching a managed job {name!r}. Proceed? [Y/n] ")
    return answer.strip().lower() in ("", "y", "yes")


class UploadProgressBar:
    """The upload of a managed job's local files: a live bar (files and bytes) on a terminal, and one summary
    line when it is done."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.uri = ""
        self.files = self.size = self.files_done = 0

    def started(self, uri: str, files: int, size: int) -> None:
        self.uri, self.files, self.size = uri, files, size
        if self.console.is_terminal:
            self.bar = Progress(
                TextColumn("Uploading local files to {task.fields[uri]}"),
                BarColumn(),
                TextColumn("{task.fields[done]}/{task.fields[files]} files"),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=self.console,
                transient=True,
            )
            self.task = self.bar.add_task("upload", total=size, uri=uri, done=0, files=files)
            self.bar.start()

    def advanced(self, files: int, size: int) -> None:
        self.files_done += files
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=size, done=self.files_done)

    def finished(self, seconds: float) -> None:
        self.close()
        self.console.print(
            f"Uploaded {self.files} local file(s) ({decimal(self.size)}) to {self.uri} in {seconds:.1f}s "
            "(removed when the job ends)",
            soft_wrap=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _follow(job_id: int | str, detach_hint: bool) -> int:
    from airflow_sky.client import managed_jobs

    def detach(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, detach)
    if detach_hint:
        print("(Ctrl-C stops following; the job goes on)", flush=True)
    try:
        job = managed_jobs.logs(job_id, emit=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print(
            f"\nDetached; the job goes on. Follow it again with: airflow-sky jobs logs {job_id}", flush=True
        )
        return 0
    ok = job.status == "SUCCEEDED"
    recoveries = f", {job.recoveries} recoveries" if job.recoveries else ""
    print(f"{'✓' if ok else '✗'} Managed job {job_id} {job.status}{recoveries}", flush=True)
    return 0 if ok else 1


def _queue(args: argparse.Namespace) -> int:
    from airflow_sky.client import managed_jobs

    if args.limit < 1:
        raise SpecError(f"-l/--limit: must be a positive integer, got {args.limit}")
    jobs = managed_jobs.queue(limit=args.limit, skip_finished=args.skip_finished)
    console = Console(highlight=False)
    if not jobs:
        console.print("No unfinished managed jobs." if args.skip_finished else "No managed jobs.")
        return 0
    console.print(queue_table(jobs, datetime.now(UTC), console.width))
    for line in pool_lines(jobs):  # each pool submission's totals
        console.print(line)
    return 0


# `jobs queue`'s columns, left to right: (key, header, header when narrow). ID, NAME, #RECOVERIES and STATUS
# always show; the others go, in DROP_ORDER, when the table would not fit the terminal (RUN ID only when
# every job listed has an integer id: a run made another way is named by its run id alone). PROGRESS and ETA
# come from the deployment's airflow-sky plugin (`-` without it, or for a job that reports nothing).
QUEUE_COLUMNS = (
    ("id", "ID", "ID"),
    ("name", "NAME", "NAME"),
    ("run_id", "RUN ID", "RUN ID"),
    ("nodes", "NODES", "NODES"),
    ("infra", "INFRA", "INFRA"),
    ("submitted", "SUBMITTED", "SUBMITTED"),
    ("duration", "DURATION", "DURATION"),
    ("progress", "PROGRESS", "PROGRESS"),
    ("eta", "ETA", "ETA"),
    ("recoveries", "#RECOVERIES", "#REC"),
    ("status", "STATUS", "STATUS"),
)
DROP_ORDER = ("infra", "nodes", "duration", "eta", "run_id", "submitted", "progress")
NAME_MIN = 10  # a longer name is cut to this (with an ellipsis) before a column is dropped
GAP = 2  # rich's cell padding between two columns (none at the table's edges)


def queue_table(jobs: list[ManagedJob], now: datetime, width: int) -> Table:
    """`jobs queue`'s table for a terminal `width` columns wide: whole ids, statuses and short times on one
    line each; a long name is cut with an ellipsis, and less needed columns go when it would not fit."""
    rows = [_queue_cells(job, now) for job in jobs]
    # PROGRESS and ETA only when a job listed reports progress (as `airflow-sky queue`): a queue of jobs
    # that never do keeps the room for the others.
    hidden = () if any(job.progress for job in jobs) else ("progress", "eta")
    keep = () if all(job.job_id is not None for job in jobs) else ("run_id",)
    keys, headers = fit_queue_columns(rows, width, hidden, keep)
    natural = _widths(rows, keys, headers)
    others = sum(natural[key] for key in keys if key != "name") + GAP * (len(keys) - 1)
    table = Table(box=None, pad_edge=False)
    for key in keys:
        if key == "name":  # the one free text: given what is left, cut with an ellipsis
            name_width = max(min(natural["name"], width - others), min(natural["name"], NAME_MIN))
            table.add_column(headers[key], width=name_width, no_wrap=True, overflow="ellipsis")
        else:
            table.add_column(headers[key], no_wrap=True)
    for row in rows:
        # Text, not markup: a run conf is anyone's who may trigger the DAG (`[/x]` in it is no style).
        table.add_row(*(Text(row[key]) for key in keys))
    return table


def fit_queue_columns(
    rows: list[dict[str, str]], width: int, hidden: tuple[str, ...] = (), keep: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str]]:
    """The columns (keys, headers) that fit `width`, but those `hidden`: every one with its full header
    when it fits, else the short headers and the fewest columns dropped (DROP_ORDER)."""
    keys = [key for key, _, _ in QUEUE_COLUMNS if key not in hidden]
    full = {key: header for key, header, _ in QUEUE_COLUMNS}
    short = {key: header for key, _, header in QUEUE_COLUMNS}

    def needed(keys: list[str], headers: dict[str, str]) -> int:
        cells = _widths(rows, keys, headers)
        cells["name"] = min(cells["name"], NAME_MIN)
        return sum(cells.values()) + GAP * (len(keys) - 1)

    if needed(keys, full) <= width:
        return keys, full
    for drop in (key for key in DROP_ORDER if key in keys and key not in keep):
        if needed(keys, short) <= width:
            break
        keys.remove(drop)
    return keys, short


def _widths(rows: list[dict[str, str]], keys: list[str], headers: dict[str, str]) -> dict[str, int]:
    """Each column's natural width: its widest cell or header (in terminal cells)."""
    return {key: max([cell_len(headers[key]), *(cell_len(row[key]) for row in rows)]) for key in keys}


def _queue_cells(job: ManagedJob, now: datetime) -> dict[str, str]:
    return {
        "id": str(job.job_id) if job.job_id is not None else "-",
        "name": job.name,
        "run_id": job.run_id,
        "nodes": str(job.num_nodes or "-"),
        "infra": job.infra,
        "submitted": _ago(job.submitted, now),
        "duration": _duration(job.duration_s),
        "progress": progress_cell(job.progress),
        "eta": eta_cell(job.progress),
        "recoveries": str(job.recoveries),
        "status": job.status,
    }


def _logs(args: argparse.Namespace) -> int:
    from airflow_sky.client import managed_jobs

    job_id = args.job_id
    if job_id is None:  # as sky's: the latest job
        job_id = _handle(managed_jobs.latest())
    if args.no_follow:
        job = managed_jobs.logs(job_id, follow=False, emit=lambda line: print(line, flush=True))
        print(f"Managed job {job_id}: {job.status}", file=sys.stderr)
        return 0
    return _follow(job_id, detach_hint=False)


def _handle(job: ManagedJob) -> int | str:
    """How a job is named to the user and the API: its integer id, else its run id."""
    return job.job_id if job.job_id is not None else job.run_id


def _cancel(args: argparse.Namespace) -> int:
    from airflow_sky.client import managed_jobs
    from airflow_sky.client.managed_ids import parse_job_id

    if sum((bool(args.job_ids), args.all, args.name is not None)) != 1:
        raise SpecError("jobs cancel: give the job ids (JOB_ID ...), -n/--name NAME or -a/--all, one of them")
    job_ids: list[int | str] = [parse_job_id(given) for given in args.job_ids]
    if args.name is not None:  # as sky: every job of that name not ended yet
        job_ids = [_handle(job) for job in managed_jobs.unfinished() if job.name == args.name]
        if not job_ids:
            print(f"No managed job named {args.name!r} to cancel (see `airflow-sky jobs queue`).")
            return 1
    if args.all:
        job_ids = [_handle(job) for job in managed_jobs.unfinished()]
        if not job_ids:
            print("No managed jobs to cancel.")
            return 0
        listed = ", ".join(map(str, job_ids))
        if not args.yes and not _ask(
            f"Cancelling all managed jobs ({len(job_ids)}: {listed}). Proceed? [Y/n] "
        ):
            print("Aborted.")
            return 1
    for job_id in job_ids:
        managed_jobs.cancel(job_id)
        print(f"Cancelling managed job {job_id}: its ranks stop and its nodes are torn down", flush=True)
    return 0


def _ask(question: str) -> bool:
    """A yes/no question on stdin (Enter: yes); no answer (stdin closed) is no, as sky's."""
    try:
        answer = input(question)
    except EOFError:
        print()
        return False
    return answer.strip().lower() in ("", "y", "yes")


def _ago(when: datetime | None, now: datetime) -> str:
    """How long ago, in its largest unit: '12s ago', '5m ago', '3h ago', '2d ago'."""
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _duration(seconds: float | None) -> str:
    """'45s', '5m 2s', '1h 5m', '2d 3h'."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s" if minutes else f"{secs}s"
