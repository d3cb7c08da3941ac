"""`airflow-sky status`'s table: the clusters, as `sky status` lists them, fitted to the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_sky.client.cli.tables import Column, fitted_table, terminal_console

# On a narrow terminal the name is cut first, then HEAD IP, NODES, INFRA and AUTOSTOP go in that order.
_COLUMNS = (
    Column("NAME", name=True),
    Column("INFRA", drop=3),
    Column("NODES", drop=2),
    Column("HEAD IP", drop=1),
    Column("AUTOSTOP", drop=4),
    Column("STATUS"),
)


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
    for cluster in clusters:
        nodes = cluster["nodes"]
        cells = {
            "NAME": cluster["name"],
            "INFRA": cluster.get("infra") or "-",
            "NODES": str(len(nodes)),
            "HEAD IP": nodes[0]["internal_ip"] if nodes else "-",
            "AUTOSTOP": autostop_cell(cluster.get("autostop")),
            "STATUS": cluster["status"],
        }
        rows.append([cells[c.header] for c in columns])
    title = f"Clusters ({infras[0]})" if len(infras) == 1 else "Clusters"
    console.print(fitted_table(columns, rows, console.width, title=title))
    for cluster in clusters:
        if cluster.get("note"):
            print(f"{cluster['name']}: {cluster['note']}")
