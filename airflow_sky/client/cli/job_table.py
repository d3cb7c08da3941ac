"""`airflow-sky queue`'s table: a cluster's jobs, newest first, as `sky queue` shows them, fitted to the
terminal (client/cli/tables.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from airflow_sky.client.cli.progress_cells import eta_cell, progress_cell
from airflow_sky.client.cli.tables import Column, fitted_table

# Left to right; on a narrow terminal the name is cut first, then NODES, DURATION, SUBMITTED, ETA, FAILED
# and PROGRESS go in that order. ID and STATUS always show, whole.
_COLUMNS = (
    Column("ID"),
    Column("NAME", name=True),
    Column("SUBMITTED", drop=3),
    Column("DURATION", drop=2),
    Column("NODES", drop=1),
    Column("PROGRESS", drop=6),
    Column("ETA", drop=4),
    Column("STATUS"),
    Column("FAILED", drop=5),
)


def queue_table(records: Sequence[dict[str, Any]], cluster: str, now: float, width: int) -> Table:
    """The table of `records` (oldest first, as sdk.queue gives them) for a terminal `width` wide.

    PROGRESS and ETA only when a job listed reports progress: a queue of jobs that never do keeps the room
    (a job that reports nothing shows `-` beside one that does)."""
    reporting = any(record.get("progress") for record in records)
    columns = [c for c in _COLUMNS if reporting or c.header not in ("PROGRESS", "ETA")]
    rows = []
    for record in reversed(records):
        cells = {
            "ID": str(record["job_id"]),
            "NAME": str(record.get("name") or "-"),
            "SUBMITTED": ago(record.get("submitted_at"), now),
            "DURATION": duration(record.get("started_at"), record.get("ended_at"), now),
            "NODES": str(record.get("num_nodes") or "-"),
            "PROGRESS": progress_cell(record.get("progress")),
            "ETA": eta_cell(record.get("progress")),
            "STATUS": str(record.get("status")),
            "FAILED": failure_of(record),
        }
        rows.append([cells[c.header] for c in columns])
    return fitted_table(columns, rows, width, title=f"Job queue of {cluster}")


def ago(timestamp: Any, now: float) -> str:
    """`sky queue`'s relative time: '5 mins ago'."""
    when = _epoch(timestamp)
    if when is None:
        return "-"
    seconds = max(0, int(now - when))
    for size, unit in ((86400, "day"), (3600, "hr"), (60, "min")):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return f"{seconds} secs ago" if seconds != 1 else "1 sec ago"


def duration(started: Any, ended: Any, now: float) -> str:
    start = _epoch(started)
    if start is None:
        return "-"
    end = _epoch(ended) or now
    seconds = max(0, int(end - start))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h {rest // 60}m" if hours else f"{rest // 60}m {rest % 60}s"


def _epoch(timestamp: Any) -> float | None:
    if not timestamp:
        return None
    if isinstance(timestamp, str):
        try:
            parsed = datetime.fromisoformat(timestamp)
        except ValueError:
            return None
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    return float(timestamp)


def failure_of(record: dict[str, Any]) -> str:
    """'rank 1: exit 4' for a failed job (the rank that failed first and its exit code), 'cancelled' for a
    cancelled one (recorded as rank -1, exit 143: no rank failed), else '-'."""
    rank = record.get("failed_rank")
    if record.get("status") == "CANCELLED" or rank == -1:
        return "cancelled"
    if rank is None:
        return "-"
    code = record.get("failed_exit_code")
    return f"rank {rank}: exit {'?' if code is None else code}"
