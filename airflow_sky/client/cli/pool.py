"""`airflow-sky jobs pool apply | status | down`: pools of warm workers, like `sky jobs pool ...`.

    airflow-sky jobs pool apply -p gpu-pool pool.yaml [--workers N]
    airflow-sky jobs pool status [gpu-pool]
    airflow-sky jobs pool down gpu-pool [-y]

Jobs go to a pool with `airflow-sky jobs launch --pool gpu-pool [--num-jobs N] job.yaml`, or from a DAG with
`sky_job(..., pool=...)` / `sky_sweep(..., pool=...)`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from airflow_sky.client.cli.arguments import add_env_arguments
from airflow_sky.client.cli.tables import Column, fitted_table
from airflow_sky.errors import SpecError

if TYPE_CHECKING:  # (not at run time: it imports the DAG module, hence Airflow)
    from airflow_sky.client.managed_jobs import ManagedJob


def register(commands: Any) -> None:
    pool = commands.add_parser("pool", help="pools of warm workers: apply, status, down (sky jobs pool)")
    actions = pool.add_subparsers(dest="pool_command", metavar="ACTION", required=True)

    apply = actions.add_parser("apply", help="create or update a pool from a pool file (pool: {workers: N})")
    apply.add_argument("file", metavar="POOL_YAML", help="a task file with a pool: section and no run")
    apply.add_argument("-p", "--pool", required=True, help="the pool's name")
    apply.add_argument("--workers", type=int, help="the number of workers (overrides pool.workers)")
    apply.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    add_env_arguments(apply)
    apply.set_defaults(handler=_apply)

    status = actions.add_parser("status", help="each pool's workers, the job on each, the jobs waiting")
    status.add_argument("pools", nargs="*", metavar="POOL", help="these pools (default: every pool)")
    status.add_argument(
        "--infra", help="where the pools are (default: local and where this machine applied pools)"
    )
    status.set_defaults(handler=_status)

    down = actions.add_parser("down", help="tear down every worker of a pool and forget the pool")
    down.add_argument("pools", nargs="+", metavar="POOL", help="the pools")
    down.add_argument("--infra", help="where the pools are (default: where this machine applied them)")
    down.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    down.set_defaults(handler=_down)


def add_pool_launch_arguments(launch: argparse.ArgumentParser) -> None:
    launch.add_argument(
        "-p", "--pool", help="run on a free worker of this pool (jobs pool apply): no provisioning, no setup"
    )
    launch.add_argument(
        "--num-jobs",
        type=int,
        help="with --pool: submit N jobs, each with SKYPILOT_JOB_RANK (0..N-1) and SKYPILOT_NUM_JOBS",
    )


def _say(line: str) -> None:
    print(line, flush=True)


def _apply(args: argparse.Namespace) -> int:
    from airflow_sky.client import pools
    from airflow_sky.client.cli.common import load_task
    from airflow_sky.task.pool import check_pool_name, pool_task

    check_pool_name(args.pool)
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers: must be a whole number >= 1, got {args.workers}")
    task = load_task(args)
    _, spec = pool_task(task, args.file)  # refused before anything is asked or launched
    count = args.workers or spec.workers
    print(f"YAML to run: {args.file}")
    print(f"Pool spec: fixed size ({count} worker(s) of {task.num_nodes} node(s))")
    if not args.yes and sys.stdin.isatty() and not _ask(f"Applying config to pool {args.pool!r}. Proceed?"):
        print("Aborted.")
        return 1
    pools.apply(args.pool, task, args.file, _say, workers=args.workers)
    print(
        f"Pool {args.pool!r} is ready.\n"
        f"  To submit jobs to the pool: airflow-sky jobs launch --pool {args.pool} job.yaml\n"
        f"  To submit many jobs:        airflow-sky jobs launch --pool {args.pool} --num-jobs 10 job.yaml\n"
        f"  To check the pool status:   airflow-sky jobs pool status {args.pool}\n"
        f"  To terminate the pool:      airflow-sky jobs pool down {args.pool}"
    )
    return 0


_STATUS_COLUMNS = (
    Column("POOL", name=True),
    Column("WORKER", name=True),
    Column("STATUS"),
    Column("NODES"),
    Column("JOB"),
)


def _status(args: argparse.Namespace) -> int:
    from airflow_sky.client import pools

    names = args.pools or pools.pools(args.infra)
    if not names:
        print(f"No pools on {args.infra}." if args.infra else "No pools.")
        return 0
    rows = []
    pending: list[str] = []
    for name in names:
        state = pools.status(name, args.infra)
        for worker in state.workers:
            job = worker.job
            rows.append(
                [
                    name,
                    worker.cluster,
                    worker.status,
                    str(worker.nodes),
                    "idle"
                    if job is None
                    else f"{job['id']} {job.get('name') or ''} ({job['status']})".strip(),
                ]
            )
        busy = f"{state.busy}/{len(state.workers)} busy"
        pending.append(
            f"{name}: {busy}, {len(state.pending)} job(s) pending"
            + (f" ({', '.join(state.pending)})" if state.pending else "")
        )
    console = Console(highlight=False, soft_wrap=True)
    console.print(fitted_table(_STATUS_COLUMNS, rows, console.width))
    for line in pending:
        console.print(line)
    return 0


def _down(args: argparse.Namespace) -> int:
    from airflow_sky.client import pools

    if (
        not args.yes
        and sys.stdin.isatty()
        and not _ask(f"Terminating pool(s) {', '.join(args.pools)}. Proceed?")
    ):
        print("Aborted.")
        return 1
    started = time.monotonic()
    for name in args.pools:
        pools.down(name, _say, args.infra)
    print(f"Done in {time.monotonic() - started:.1f}s")
    return 0


def launch_on_pool(args: argparse.Namespace, task: Any, confirm: Any, follow: Any) -> int:
    """`jobs launch --pool P [--num-jobs N]`: N managed jobs, each waiting for a free worker of P."""
    from airflow_sky.client import managed_jobs
    from airflow_sky.task.pool import check_pool_job, job_rank_envs

    count = 1 if args.num_jobs is None else args.num_jobs
    if count < 1:
        raise SpecError(f"--num-jobs: must be a whole number >= 1, got {count}")
    if args.cluster:
        raise SpecError("-c/--cluster: a pool's jobs run on the pool's workers; give no cluster")
    check_pool_job(task, args.file or "the job")  # before anything is said or submitted
    from airflow_sky.client.pools import pool_infra

    infra = args.infra or task.resources.infra or pool_infra(args.pool)  # where this machine applied it
    print(f"Submitting to pool {args.pool!r} with {count} job(s).")
    ids = []
    for rank in range(count):
        ids.append(
            managed_jobs.launch(
                task.with_envs(job_rank_envs(rank, count)),
                infra=infra,
                pool=args.pool,
                confirm=confirm if rank == 0 else None,
            )
        )
        print(f"Managed job {ids[-1]} submitted ({task.name or 'unnamed'}, rank {rank})", flush=True)
    if count > 1 or args.detach:
        print(f"Jobs submitted with IDs: {','.join(str(i) for i in ids)}.")
        print(
            f"  To stream job logs:  airflow-sky jobs logs <job-id>\n  Pool status:         airflow-sky jobs pool status {args.pool}"
        )
        return 0
    return int(follow(ids[0], detach_hint=True))


def pool_lines(jobs: Sequence[ManagedJob]) -> list[str]:
    """`jobs queue`'s summary of each pool submission it lists (pool, name, --num-jobs): how many jobs are in
    each status, and the share of all their steps done where they report progress (pure)."""
    groups: dict[tuple[str, str, int | None], list[ManagedJob]] = {}
    for job in jobs:
        if job.pool is not None:
            groups.setdefault((job.pool, job.name, job.num_jobs), []).append(job)
    lines = []
    for (pool, name, num_jobs), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        counts: dict[str, int] = {}
        for job in members:
            counts[job.status] = counts.get(job.status, 0) + 1
        states = ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))
        shown = (
            f"{len(members)} of {num_jobs}" if num_jobs and num_jobs != len(members) else str(len(members))
        )
        steps = [(p["step"], p["total"]) for j in members if (p := j.progress) and p.get("total")]
        done = sum(1 for j in members if j.status == "SUCCEEDED")
        total = sum(t for _, t in steps)
        share = f"; {100 * sum(min(s, t) for s, t in steps) / total:.0f}% of their steps" if total else ""
        lines.append(f"Pool {pool}, {name}: {shown} job(s): {states}{share} ({done} done)")
    return lines


def _ask(question: str) -> bool:
    try:
        answer = input(f"{question} [Y/n]: ").strip().lower()
    except EOFError:
        return False
    return answer in ("", "y", "yes")
