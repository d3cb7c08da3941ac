"""Every table of the CLI fits the terminal (client/cli/tables.py): at 80 and 200 columns, with finished
jobs and a long running job's name, no line is wider than the console, no header is cut, no name collapses
to nothing, and ids and statuses stay whole. Rendered with rich consoles of those widths."""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from airflow_sky.client.cli import local, ssh_pool
from airflow_sky.client.cli.dryrun import print_plan
from airflow_sky.client.cli.job_table import queue_table
from airflow_sky.client.cli.progress import print_summary
from airflow_sky.client.cli.status_table import autostop_cell, print_status
from airflow_sky.client.cli.tables import NAME_MIN, Column, fitted_table
from airflow_sky.client.engine import JobOutcome
from airflow_sky.task import Task

NOW = 1_800_000_000.0
LONG = "pretrain-gpt2-medium-on-openwebtext-with-a-long-descriptive-run-name"


def _records() -> list[dict[str, Any]]:
    finished = [
        {"job_id": 1, "name": "setup-data", "submitted_at": NOW - 7200, "started_at": NOW - 7100,
         "ended_at": NOW - 3000, "num_nodes": 16, "status": "SUCCEEDED"},
        {"job_id": 2, "name": "train", "submitted_at": NOW - 900, "started_at": NOW - 890,
         "ended_at": NOW - 20, "num_nodes": 2, "status": "FAILED", "failed_rank": 1, "failed_exit_code": 4},
        {"job_id": 3, "name": "prep", "submitted_at": NOW - 600, "num_nodes": 2, "status": "FAILED_SETUP",
         "failed_rank": 0, "failed_exit_code": 1},
        {"job_id": 4, "name": "eval", "submitted_at": NOW - 500, "num_nodes": 2, "status": "CANCELLED",
         "failed_rank": -1},
    ]  # fmt: skip
    running = {
        "job_id": 5,
        "name": LONG,
        "submitted_at": NOW - 300,
        "started_at": NOW - 290,
        "num_nodes": 2,
        "status": "RUNNING",
        "progress": {"step": 1200, "total": 3000, "percent": 40.0, "rate": 2.0, "eta_s": 3720},
    }
    return [*finished, running]


def _render(renderable: Any, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), highlight=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _cells(out: str) -> list[list[str]]:
    """Each line of a boxed table split into its cells (heavy rules in the header, light ones below)."""
    rows = []
    for line in out.splitlines():
        line = line.replace("┃", "│")
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.split("│")[1:-1]])
    return rows


def _check_fits(out: str, width: int) -> None:
    assert max(len(line) for line in out.splitlines()) <= width, out


@pytest.mark.parametrize("width", [80, 200])
def test_queue_with_finished_jobs_and_a_long_running_name_fits_with_whole_headers_ids_and_statuses(width):
    out = _render(queue_table(_records(), "dev", NOW, width), width)
    _check_fits(out, width)
    rows = _cells(out)
    header = rows[0]
    # Every header shown is whole, and the ones that always show are there.
    assert {"ID", "NAME", "STATUS"} <= set(header), out
    assert set(header) <= {
        "ID",
        "NAME",
        "SUBMITTED",
        "DURATION",
        "NODES",
        "PROGRESS",
        "ETA",
        "STATUS",
        "FAILED",
    }
    by_id = {row[0]: dict(zip(header, row, strict=True)) for row in rows[1:]}
    assert [by_id[i]["STATUS"] for i in "12345"] == [
        "SUCCEEDED",
        "FAILED",
        "FAILED_SETUP",
        "CANCELLED",
        "RUNNING",
    ]
    name = by_id["5"]["NAME"]
    assert len(name) >= NAME_MIN and LONG.startswith(name.rstrip("…")), out
    # Each job on one line: as many body lines as jobs.
    assert len(rows) == 6, out
    if width == 200:
        assert name == LONG and set(header) == {
            "ID", "NAME", "SUBMITTED", "DURATION", "NODES", "PROGRESS", "ETA", "STATUS", "FAILED"
        }  # fmt: skip
        assert by_id["2"]["FAILED"] == "rank 1: exit 4" and by_id["5"]["PROGRESS"] == "1200/3000 40%"
    else:
        assert "NODES" not in header and name.endswith("…"), out  # the first column to go


def test_a_queue_whose_jobs_report_no_progress_keeps_its_columns_at_80():
    records = [r for r in _records() if r["job_id"] != 5]
    out = _render(queue_table(records, "dev", NOW, 80), 80)
    _check_fits(out, 80)
    header = _cells(out)[0]
    assert header == ["ID", "NAME", "SUBMITTED", "DURATION", "STATUS", "FAILED"], out


@pytest.mark.parametrize("width", [15, 26, 40, 80, 200])
def test_the_name_is_cut_first_then_columns_go_in_their_order_and_the_name_keeps_its_minimum(width):
    columns = [Column("ID"), Column("NAME", name=True), Column("LESS", drop=2), Column("LEAST", drop=1)]
    rows = [["1", "x" * 60, "y" * 12, "z" * 12], ["22", "short", "-", "-"]]
    out = _render(fitted_table(columns, rows, width, title="t"), width)
    _check_fits(out, width)
    if width == 15:  # narrower than what always shows: the console crops the right edge, headers whole
        assert "┃ ID ┃ NAME" in out and "│ 1  │ xxxxxxx" in out, out
        return
    header = _cells(out)[0]
    name = _cells(out)[1][1]
    expected = {
        200: ["ID", "NAME", "LESS", "LEAST"],
        80: ["ID", "NAME", "LESS", "LEAST"],  # the name is cut, nothing goes
        40: ["ID", "NAME", "LESS"],  # LEAST goes first
        26: ["ID", "NAME"],
    }[width]
    assert header == expected, out
    assert name == "x" * 60 if width == 200 else name.endswith("…") and len(name) >= NAME_MIN, out
    if width < 200:  # the name takes the room there is
        assert len(out.splitlines()[-2]) == width, out


def test_cells_are_text_never_markup():
    out = _render(fitted_table([Column("NAME", name=True)], [["[bold]x[/bold] [/oops]"]], 80), 80)
    assert "[bold]x[/bold] [/oops]" in out


@pytest.mark.parametrize("width", [80, 200])
def test_status_with_long_names_on_several_infras_fits(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    nodes = [{"internal_ip": "10.128.0.123", "status": "RUNNING"}] * 3
    clusters = [
        {"name": f"cluster-with-a-long-name-for-the-nightly-run-{i}", "infra": infra, "status": "UP",
         "nodes": nodes, "autostop": {"idle_minutes": 10, "down": i == 1},
         "cost_per_hour": 0.384 * (infra.startswith("aws")), "idle_since": None if i else time.time() - 750,
         "owner": {"user": "alice", "dag_id": "nightly"} if i < 2 else None}
        for i, infra in enumerate(["local", "aws/us-east-1", "ssh/lab"])
    ]  # fmt: skip
    console = Console(width=width, file=io.StringIO(), highlight=False)
    monkeypatch.setattr("airflow_sky.client.cli.status_table.terminal_console", lambda: console)
    print_status(clusters, None)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    _check_fits(out, width)
    rows = _cells(out)
    assert rows[0][0] == "NAME" and rows[0][-1] == "STATUS" and all(len(r[0]) >= NAME_MIN for r in rows[1:])
    if width == 200:
        assert rows[0] == [
            "NAME",
            "INFRA",
            "NODES",
            "HEAD IP",
            "COST/HR",
            "IDLE",
            "OWNER",
            "AUTOSTOP",
            "STATUS",
        ]
        assert [r[4:8] for r in rows[1:]] == [
            ["$0.00", "12m", "alice", "10m"],
            ["$0.38", "-", "alice", "10m (down)"],
            ["$0.00", "-", "-", "10m"],
        ]
    assert autostop_cell(None) == "-"


def test_local_nodes_ssh_check_dryrun_and_summary_fit_80(monkeypatch, tmp_path: Path):
    console = Console(width=80, file=io.StringIO(), highlight=False)
    monkeypatch.setattr("airflow_sky.client.cli.local.terminal_console", lambda: console)
    monkeypatch.setattr("airflow_sky.client.cli.ssh_pool.terminal_console", lambda: console)
    node = SimpleNamespace(
        rank=0, internal_ip="127.0.0.2", ssh_port=40022, instance_id="local-" + "ab" * 40,
        status=SimpleNamespace(value="RUNNING"),
    )  # fmt: skip
    local._print_nodes("dev", [node])
    facts = SimpleNamespace(
        bash="5.2.21(1)-release", rsync=True, python="3.12.3", gpus=SimpleNamespace(count=0)
    )
    host = SimpleNamespace(index=0, name="gpu-box-in-the-basement-with-a-long-alias.lab.example", label="h")
    down = SimpleNamespace(index=1, name="other", label="o")
    cloud = SimpleNamespace(
        pool_name="lab",
        pool=SimpleNamespace(source="ssh_node_pools.yaml"),
        check=lambda: [
            SimpleNamespace(host=host, facts=facts, lock=None, containers="podman 4.9"),
            SimpleNamespace(host=down, facts=None, error="connection refused " * 8, lock=None, containers=""),
        ],
    )
    assert ssh_pool._check(cloud) == 1  # type: ignore[arg-type]
    print_plan(Task(name="t", num_nodes=2, run="echo"), "ssh/a-pool-with-a-rather-long-name-here", console)
    outcome = JobOutcome(
        succeeded=True, state="success", cluster_name="dev", job_id=1, log_file=tmp_path / "log",
        step_times={"provision": (0.0, 1.0), "run_follow": (1.0, 2.5)}, exit_codes={}, failures=[],
    )  # fmt: skip
    print_summary(console, outcome, 0.0)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    _check_fits(out, 80)
    assert "local-abab" in out and "gpu-box-in" in out and "✗ other: connection refused" in out
    assert "PYTHON3" in out or "HOST" in out
    assert "run_follow" in out and "SUCCEEDED" in out


def test_a_table_built_here_is_a_rich_table():
    assert isinstance(fitted_table([Column("A")], [["1"]], 80), Table)
