"""`airflow-sky status`'s table: the clusters, as `sky status` lists them, fitted to the terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow_sky.client.cli.tables import Column, fitted_table, terminal_console
from airflow_sky.infra.ledger import money

# On a narrow terminal the name is cut first, then HEAD IP, OWNER, IDLE, NODES, INFRA, COST/HR and
# AUTOSTOP go in that order.
_COLUMNS = (
    Column("NAME", name=True),
    Column("INFRA", drop=5),
    Column("NODES", drop=4),
    Column("HEAD IP", drop=1),
    Column("COST/HR", drop=6),
    Column("IDLE", drop=3),
    Column("OWNER", drop=2),
    Column("AUTOSTOP", drop=7),
    Column("STATUS"),
)


def cost_cell(cost_per_hour: float | None, status: str) -> str:
    """`$0.38`, `$0.00` for nodes not billed by the hour, `-` when not up or unknown."""
    if status != "UP" or cost_per_hour is None:
        return "-"
    return money(cost_per_hour)


def idle_cell(idle_since: float | None, now: float) -> str:
    """How long an UP cluster has had no live job: `12m`, `3h 4m`, `-` while one runs."""
    if idle_since is None:
        return "-"
    seconds = max(0, int(now - idle_since))
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def owner_cell(owner: dict[str, Any] | None) -> str:
    """The user who launched it (the DAG for a run no user triggered), `-` when the ledger has none."""
    if not owner:
        return "-"
    return str(owner.get("user") or owner.get("dag_id") or "-")


def autostop_cell(setting: dict[str, Any] | None) -> str:
    """sky's AUTOSTOP: `10m`, `10m (down)` for autodown, `-` when none is armed."""
    if not setting:
        return "-"
    return f"{setting['idle_minutes']}m" + (" (down)" if setting.get("down") else "")


def print_status(clusters: Sequence[dict[str, Any]], infra: str | None) -> None:
    console = terminal_console()
    if not clusters:
        console.print(f"No clusters on {infra or 'local'}.", markup=False)
        return
    infras = sorted({c["infra"] for c in clusters if c.get("infra")})
    by_infra = len(infras) > 1  # clusters on several infras: a column says which
    columns = [c for c in _COLUMNS if by_infra or c.header != "INFRA"]
    rows = []
    now = time.time()
    for cluster in clusters:
        nodes = cluster["nodes"]
        cells = {
            "NAME": cluster["name"],
            "INFRA": cluster.get("infra") or "-",
            "NODES": str(len(nodes)),
            "HEAD IP": nodes[0]["internal_ip"] if nodes else "-",
            "AUTOSTOP": autostop_cell(cluster.get("autostop")),
            "COST/HR": cost_cell(cluster.get("cost_per_hour"), cluster["status"]),
            "IDLE": idle_cell(cluster.get("idle_since"), now),
            "OWNER": owner_cell(cluster.get("owner")),
            "STATUS": cluster["status"],
        }
        rows.append([cells[c.header] for c in columns])
    title = f"Clusters ({infras[0]})" if len(infras) == 1 else "Clusters"
    console.print(fitted_table(columns, rows, console.width, title=title))
    for cluster in clusters:
        if cluster.get("note"):
            print(f"{cluster['name']}: {cluster['note']}")
