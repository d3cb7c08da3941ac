"""`airflow-sky progress CLUSTER [JOB_ID] [--watch]`: a job's progress in the terminal, as its ranks report
it (`@@airflow-sky-progress/1` lines): the job's line (step/total, percent, rate, ETA, slowest rank), a row
per rank (step, rate, metrics, when it last reported, stale) and the recoveries with what each cost."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from airflow_sky.client.cli.progress_cells import (
    eta_cell,
    metric_cell,
    progress_cell,
    rate_cell,
    short_duration,
)
from airflow_sky.errors import SpecError
from airflow_sky.gang.queue_progress import queue_progress

METRIC_COLUMNS = 6  # a table shows the first metrics the ranks reported; --json has them all
_TERMINAL = ("SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED")


def register(subparsers: Any) -> None:
    view = subparsers.add_parser(
        "progress",
        help="a job's progress: step, rate, ETA and metrics of every rank, and its recoveries",
        description="A job's progress as its ranks report it with @@airflow-sky-progress/1 lines "
        "(airflow_sky.progress.report, or its Hugging Face / Lightning callbacks).",
    )
    view.add_argument("cluster")
    view.add_argument("job_id", nargs="?", type=int, help="default: the latest job")
    view.add_argument("-w", "--watch", action="store_true", help="refresh until the job ends (Ctrl-C stops)")
    view.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="S",
        help="with --watch: seconds between reads (default 2)",
    )
    view.add_argument(
        "--json", action="store_true", help="print the progress document as JSON (with every rank's history)"
    )
    view.set_defaults(handler=_progress)


def _progress(args: argparse.Namespace) -> int:
    from airflow_sky.client.cli.cluster_jobs import check_job_ids, terminal_console

    check_job_ids(args.cluster, [args.job_id])
    if args.interval <= 0:
        raise SpecError(f"--interval: must be > 0 seconds, got {args.interval}")
    if args.json and args.watch:
        raise SpecError("--json and --watch cannot be combined; give one of them")
    from airflow_sky.client import sdk

    if args.json:
        print(json.dumps(sdk.job_progress(args.cluster, args.job_id), indent=2))
        return 0
    console = terminal_console()
    doc = sdk.job_progress(args.cluster, args.job_id, with_history=False)
    if not args.watch:
        console.print(progress_view(doc, args.cluster, time.time()))
        return 0
    from rich.live import Live

    job_id = doc["job_id"]  # the latest job when none was given: the same one on every refresh
    with Live(progress_view(doc, args.cluster, time.time()), console=console, auto_refresh=False) as live:
        try:
            while doc.get("status") not in _TERMINAL:
                time.sleep(args.interval)
                doc = sdk.job_progress(args.cluster, job_id, with_history=False)
                live.update(progress_view(doc, args.cluster, time.time()), refresh=True)
        except KeyboardInterrupt:
            pass  # stop watching; the job goes on
    if not console.is_terminal:
        sys.stdout.flush()
    return 0


def progress_view(doc: Mapping[str, Any], cluster: str, now: float) -> RenderableType:
    """The job's line, its ranks' table and its recoveries (or why there is nothing to show)."""
    head = Text(job_line(doc, cluster))
    if not doc.get("reported_ranks"):
        return Group(
            head,
            Text(
                "No progress reported: the job's ranks print no @@airflow-sky-progress/1 lines "
                "(airflow_sky.progress.report(step, total=..., loss=...) writes them)."
            ),
        )
    parts: list[RenderableType] = [head, ranks_table(doc, now)]
    recoveries = [recovery_line(r) for r in doc.get("recoveries") or ()]
    if recoveries:
        parts.append(Text("Recoveries:\n" + "\n".join(f"  {line}" for line in recoveries)))
    if doc.get("goodput"):
        parts.append(Text(goodput_line(doc["goodput"])))
    return Group(*parts)


def goodput_line(good: Mapping[str, Any]) -> str:
    """'Goodput: 87% of 5m12s (first step after 42s, 12s lost, 0 steps redone)'."""
    ratio = good.get("ratio")
    head = f"Goodput: {100 * ratio:.0f}% of " if ratio is not None else "Goodput: - of "
    details = []
    if good.get("to_first_step_s") is not None:
        details.append(f"first step after {short_duration(good['to_first_step_s'])}")
    details.append(f"{short_duration(good.get('lost_s') or 0)} lost")
    if good.get("steps_redone") is not None:
        details.append(f"{good['steps_redone']} steps redone")
    return f"{head}{short_duration(good.get('wall_s') or 0)} ({', '.join(details)})"


def job_line(doc: Mapping[str, Any], cluster: str) -> str:
    """'Job 3 on dev: RUNNING, step 1200/3000 40%, 2.5/s, ETA 12m00s, slowest rank 1, generation 0'."""
    parts = [f"Job {doc.get('job_id')} on {cluster}: {doc.get('status') or '-'}"]
    if doc.get("step") is not None:
        parts.append(f"step {progress_cell(doc)}")
        parts.append(rate_cell(doc.get("rate")))
        parts.append(f"ETA {eta_cell(doc)}")
        if doc.get("slowest_rank") is not None:
            parts.append(f"slowest rank {doc['slowest_rank']}")
    parts.append(f"generation {doc.get('generation') or 0}")
    parts.append(f"{doc.get('reported_ranks') or 0}/{doc.get('num_nodes') or 0} ranks reporting")
    return ", ".join(parts)


def ranks_table(doc: Mapping[str, Any], now: float) -> Table:
    """A row per rank: step, rate, its first METRIC_COLUMNS metrics, when it last reported, stale."""
    rows = list(doc.get("ranks") or ())
    metrics: list[str] = []
    for row in rows:
        metrics += [name for name in row.get("metrics") or {} if name not in metrics]
    metrics = metrics[:METRIC_COLUMNS]
    table = Table()
    for column in ("RANK", "STEP", "RATE", *(m.upper() for m in metrics), "UPDATED", "STALE"):
        # A metric's name is the job's text: a header string would be parsed as rich markup.
        table.add_column(Text(column), no_wrap=True, overflow="fold")
    for row in rows:
        values = row.get("metrics") or {}
        updated = row.get("updated_at")
        table.add_row(
            *(
                Text(cell)
                for cell in (
                    str(row.get("rank")),
                    progress_cell(queue_progress(row)),
                    rate_cell(row.get("rate")),
                    *(metric_cell(values.get(m)) for m in metrics),
                    f"{short_duration(now - updated)} ago" if updated is not None else "-",
                    "stale" if row.get("stale") else "",
                )
            )
        )
    return table


def recovery_line(recovery: Mapping[str, Any]) -> str:
    """'generation 1: RECOVER ranks 1,2 (node lost), 42s lost, 30 steps redone'."""
    ranks = [str(r) for r in recovery.get("ranks") or ()]
    who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(ranks)}" if ranks else "every rank"
    action = recovery.get("action") or "RELAUNCH"  # gang.recovery's words: RECOVER (nodes replaced), RESTART
    reason = f" ({recovery['reason']})" if recovery.get("reason") else ""
    lost = f"{short_duration(recovery.get('lost_s') or 0)} lost"
    if recovery.get("resumed_at") is None:
        lost += " so far"
    redone = recovery.get("steps_redone")
    steps = f", {redone} steps redone" if redone is not None else ""
    return f"generation {recovery.get('generation')}: {action} {who}{reason}, {lost}{steps}"
