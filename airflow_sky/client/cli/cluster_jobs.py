"""`airflow-sky queue | logs | cancel | ssh`: the jobs and nodes of a cluster, like `sky queue/logs/cancel/ssh`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO, cast

from airflow_sky.client.cli.hook_logs import print_hook_runs
from airflow_sky.client.cli.job_table import failure_of, queue_table
from airflow_sky.client.cli.tables import terminal_console
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.gang.job import JobStatus

__all__ = ["check_job_ids", "end_line", "failure_of", "register", "terminal_console"]


def register(subparsers: Any) -> None:
    queue = subparsers.add_parser("queue", help="list clusters' jobs (no cluster: every cluster known here)")
    queue.add_argument("clusters", nargs="*", metavar="CLUSTER", help="default: every cluster known here")
    queue.add_argument(
        "-s", "--skip-finished", action="store_true", help="only the jobs that have not finished (as sky's)"
    )
    queue.set_defaults(handler=_queue)

    logs = subparsers.add_parser("logs", help="print (and follow) a job's node logs")
    logs.add_argument("cluster")
    logs.add_argument("job_id", nargs="?", type=int, help="default: the latest job")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and return")
    logs.add_argument(
        "--tail",
        type=int,
        default=0,
        metavar="N",
        help="start with the last N lines of each node's log, or of the provision log (default 0: all of it)",
    )
    logs.add_argument(
        "-s",
        "--sync-down",
        action="store_true",
        help="download the job's logs, one file per node, into ~/sky_logs/CLUSTER/JOB-NAME/ (as sky does)",
    )
    logs.add_argument(
        "--status", action="store_true", help="print the job's status only; exit 0 only if it SUCCEEDED"
    )
    logs.add_argument(
        "--raw",
        action="store_true",
        help="print the node logs as written, @@airflow-sky-progress/1 lines included (by default they are "
        "left out and the job's progress is one 'progress:' line)",
    )
    logs.add_argument(
        "--hook",
        action="store_true",
        help="print what the cluster's lifecycle hooks (config.hooks) printed on their stop and preemption "
        "runs, and how each ended; no job id (as sky logs --hook)",
    )
    logs.add_argument(
        "--provision",
        action="store_true",
        help="print the cluster's provision log (what its latest provisioning did: the infra's lines, then "
        "one line per node), following it while that provisioning runs; no job id (as sky logs --provision)",
    )
    logs.add_argument(
        "-w",
        "--worker",
        type=int,
        metavar="N",
        help="with --provision: only worker N's lines (N >= 1; without it, the whole log, head included)",
    )
    logs.set_defaults(handler=_logs)

    cancel = subparsers.add_parser("cancel", help="kill a job's processes on every node (CANCELLED)")
    cancel.add_argument("cluster")
    cancel.add_argument("job_ids", nargs="*", type=int, help="default: the latest unfinished job")
    cancel.add_argument("-a", "--all", action="store_true", help="cancel every unfinished job of the cluster")
    cancel.add_argument(
        "-y", "--yes", action="store_true", help="do not ask (a terminal is asked first, as sky does)"
    )
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


def _queue(args: argparse.Namespace) -> int:
    """`queue [CLUSTER...] [-s]`: each cluster's jobs, newest first, one table per cluster (as sky's); no
    cluster named: every cluster known here. A cluster whose queue cannot be read is one line on stderr."""
    from airflow_sky.client import sdk
    from airflow_sky.client.cli.cluster_select import known_clusters
    from airflow_sky.client.cluster_search import ClusterNotFound

    named = bool(args.clusters)
    clusters = args.clusters or known_clusters()
    console = terminal_console()
    if not clusters:
        console.print("No clusters.")
        return 0
    failed = False
    for cluster in clusters:
        try:
            records = sdk.queue(cluster)
        except ClusterNotFound as e:
            if named:  # one the index still names but that is gone everywhere: nothing to list
                print(f"airflow-sky: error: {e}", file=sys.stderr)
                failed = True
            continue
        except ClusterError as e:
            print(f"airflow-sky: error: cannot read the job queue of cluster {cluster}: {e}", file=sys.stderr)
            failed = True
            continue
        if args.skip_finished:
            records = [r for r in records if not JobStatus(str(r.get("status"))).is_terminal]
        if not records:
            console.print(
                f"Job queue of {cluster}: no {'unfinished ' if args.skip_finished else ''}jobs.", markup=False
            )
            continue
        console.print(queue_table(records, cluster, time.time(), console.width))
    return 1 if failed else 0


def _logs(args: argparse.Namespace) -> int:
    check_job_ids(args.cluster, [args.job_id])
    from airflow_sky.client import sdk
    from airflow_sky.client.cli import PipeSafeOutput

    if args.tail < 0:
        raise SpecError(f"--tail: must be >= 0, got {args.tail}")
    if args.sync_down and args.status:
        raise SpecError("--sync-down and --status cannot be combined (ambiguous); give one of them")
    if args.worker is not None and not args.provision:
        raise SpecError("--worker can only be used with --provision (as in sky logs)")
    if args.raw and (args.provision or args.sync_down or args.status):
        raise SpecError(
            "--raw: only for a job's node logs; it cannot be combined with --provision, --sync-down or --status"
        )
    if args.hook:
        if args.job_id is not None or args.provision or args.sync_down or args.status:
            raise SpecError("--hook cannot be combined with a job id, --provision, --sync-down or --status")
        return print_hook_runs(sdk.hook_logs(args.cluster), args.cluster)
    if args.provision:
        if args.job_id is not None or args.sync_down or args.status:
            raise SpecError("--provision cannot be combined with a job id, --sync-down or --status")
        if args.worker is not None and args.worker < 1:
            raise SpecError(
                f"--worker: must be a positive integer (the head's lines are in --provision alone), got {args.worker}"
            )
        return sdk.tail_provision_logs(
            args.cluster,
            args.worker,
            follow=not args.no_follow,
            tail=args.tail,
            output=cast(TextIO, PipeSafeOutput(sys.stdout)),
        )
    if args.status:
        statuses = sdk.job_status(args.cluster, [args.job_id] if args.job_id is not None else None)
        job_id, status = next(iter(statuses.items()))
        if status is None:
            raise ClusterError(f"cluster {args.cluster!r} has no job {job_id}")
        print(f"Job {job_id}: {status.value}")
        return 0 if status.value == "SUCCEEDED" else 1
    if args.sync_down:
        job_id, folder, files = sdk.download_logs(args.cluster, args.job_id)
        print(f"Job {job_id} logs ({len(files)} files): {folder}")
        return 0
    output = cast(TextIO, PipeSafeOutput(sys.stdout))
    from airflow_sky.client.cli.live_progress import LogsProgress

    progress = None if args.raw else LogsProgress(args.cluster, args.job_id, output)
    if progress is not None and not args.no_follow:
        progress.start()

    def ended(record: dict[str, Any]) -> None:
        if progress is not None:
            progress.finish()  # the job's last progress line, after its logs
        if not args.no_follow:
            print(end_line(record, args.cluster), file=output, flush=True)

    return sdk.tail_logs(
        args.cluster,
        args.job_id,
        follow=not args.no_follow,
        output=output,
        tail=args.tail,
        on_end=ended,
        raw=args.raw,
    )


def check_job_ids(cluster: str, job_ids: Sequence[int | None]) -> None:
    """Job ids are positive (`queue` lists them): anything else is one line, not a lookup."""
    bad = next((j for j in job_ids if j is not None and j < 1), None)
    if bad is not None:
        raise SpecError(f"job id: must be a positive integer (see `airflow-sky queue {cluster}`), got {bad}")


def end_line(record: dict[str, Any], cluster: str) -> str:
    """The last line of a followed `logs`, as `launch` ends: the job's status, and what failed."""
    job, status = record.get("job_id"), str(record.get("status"))
    if status == "SUCCEEDED":
        return f"✓ Job {job} on {cluster} SUCCEEDED"
    if status in ("FAILED", "FAILED_SETUP"):
        rank, code = record.get("failed_rank"), record.get("failed_exit_code")
        cause = f": rank {rank} failed with exit code {code}" if rank is not None and rank >= 0 else ""
        return f"✗ Job {job} on {cluster} {status}{cause}"
    if status == "CANCELLED":
        return f"✗ Job {job} on {cluster} CANCELLED"
    return f"Job {job} on {cluster} is still {status} (its logs ended); see `airflow-sky queue {cluster}`"


def _cancel(args: argparse.Namespace) -> int:
    check_job_ids(args.cluster, args.job_ids)
    from airflow_sky.client import sdk

    if args.all:
        which = "every unfinished job"
    elif args.job_ids:
        which = f"job(s) {' '.join(map(str, args.job_ids))}"
    else:
        which = "the latest unfinished job"
    # As sky's: a terminal is asked (yes by default), a script never.
    if not args.yes and sys.stdin.isatty():
        answer = input(f"Cancelling {which} on cluster {args.cluster}. Proceed? [Y/n] ")
        if answer.strip().lower() not in ("", "y", "yes"):
            print("Aborted.")
            return 1
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
    from airflow_sky.client.container_ssh import remote_command
    from airflow_sky.client.sdk import cluster_of
    from airflow_sky.node.container import container_name

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
    # In the node's container when the cluster's jobs run in one (image_id: docker:), as SkyPilot's does.
    os.execvp("ssh", [*argv, remote_command(container_name(node), command)])
    return 0  # not reached
