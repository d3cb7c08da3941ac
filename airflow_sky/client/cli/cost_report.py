"""`airflow-sky cost-report`: what each cluster cost, as `sky cost-report` shows it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from airflow_sky.client.cli.tables import Column, fitted_table, terminal_console
from airflow_sky.errors import SpecError

_COLUMNS = (
    Column("NAME", name=True),
    Column("INFRA", drop=3),
    Column("LAUNCHED", drop=2),
    Column("DURATION", drop=4),
    Column("RESOURCES", drop=1),
    Column("STATUS"),
    Column("COST/HR"),
    Column("COST (EST.)"),
)


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "cost-report",
        help="what each cluster cost (up, stopped, or torn down in the last --days), with the total",
        description="Costs are the packaged catalog's hourly prices (its date is shown) times the node-hours "
        "the fleet ledger recorded; local nodes and ssh pool hosts are not billed by the hour.",
    )
    report.add_argument("--days", type=float, default=30.0, help="torn-down clusters of the last N days (30)")
    report.add_argument("--infra", help="only this infra (default: every infra configured here)")
    report.add_argument("--json", action="store_true", help="the rows as JSON (with the total)")
    report.set_defaults(handler=_cost_report)


def _duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _resources(row: dict[str, Any]) -> str:
    billing = row.get("billing")
    count = max(row.get("nodes") or 0, 1) if row.get("ended_at") is None else None
    kind = f"{billing['instance_type']}{'[spot]' if billing.get('use_spot') else ''}" if billing else "-"
    return f"{count}x {kind}" if count else kind


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Send file descriptor 1 to stderr meanwhile (a logger that kept the stdout stream writes there too)."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _cost_report(args: argparse.Namespace) -> int:
    from airflow_sky.client.cost_report import cost_rows
    from airflow_sky.infra import catalog
    from airflow_sky.infra.ledger import money

    if args.days < 0:
        raise SpecError(f"cost-report: --days must be >= 0, got {args.days:g}")
    with _stdout_to_stderr(args.json):  # Airflow's hooks log to stdout: --json keeps stdout for the JSON
        rows, problems = cost_rows(args.days, args.infra)
    for infra, why in problems:
        print(f"airflow-sky: note: cost-report: {infra} could not be asked: {why}", file=sys.stderr)
    known = [float(r["cost"]) for r in rows if r.get("cost") is not None]
    total = sum(known)
    as_of = catalog.meta().get("as_of")
    if args.json:
        print(json.dumps({"clusters": rows, "total": total, "catalog_as_of": as_of}, indent=2, default=str))
        return 0
    console = terminal_console()
    if not rows:
        console.print(f"No clusters (up, or torn down in the last {args.days:g} days).", markup=False)
        return 0
    now = time.time()
    cells = []
    for row in rows:
        launched = row.get("launched_at")
        end = row.get("ended_at") or now
        live = row.get("ended_at") is None
        cells.append(
            [
                str(row.get("cluster")),
                str(row.get("infra")),
                datetime.fromtimestamp(float(launched), UTC).strftime("%Y-%m-%d %H:%M") if launched else "-",
                _duration(float(end) - float(launched)) if launched else "-",
                _resources(row),
                str(row.get("status")),
                money(row.get("cost_per_hour")) if live else "-",
                money(row.get("cost")),
            ]
        )
    console.print(fitted_table(list(_COLUMNS), cells, console.width, title="Clusters"))
    unknown = len(rows) - len(known)
    more = f" ({unknown} cluster(s) without a catalog price left out)" if unknown else ""
    print(f"Total: {money(total)}{more}")
    print(f"Prices: the packaged catalog as of {as_of or '?'} (on-demand or spot, per node-hour).")
    return 0
