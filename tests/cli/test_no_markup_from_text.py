"""The launch/exec live view, its summary and `airflow-sky progress` print text from nodes, errors and job
records as written: `[/]` (rich raised MarkupError on it), `[bold` or `[red]...[/red]` in a failure
message, a relaunch reason, a cluster name or a metric's name neither fails the print nor styles it."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from airflow_sky.client.cli.progress import ProgressPrinter, print_summary
from airflow_sky.client.cli.progress_view import progress_view
from airflow_sky.client.engine import JobOutcome
from airflow_sky.client.events import Event

CRAFTED = ["[/]", "[bold", "[red]red[/red] and [link=http://x]click[/link]", "trailing \\"]


def _console() -> Console:
    # A terminal, so styles would show as escape codes; color_system so that they are emitted.
    return Console(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")


def _events(text: str) -> list[Event]:
    node = {"rank": 0, "internal_ip": "10.0.0.1"}
    return [
        Event(
            "job",
            "provision",
            data={"job_id": 3, "cluster_name": f"c{text}", "infra": "local", "nodes": [node]},
        ),
        Event("queued", "provision", text=f"waiting for {text}"),
        Event("relaunch", "run_follow", text=f"RECOVER: {text}; relaunching the job as generation 1"),
        Event("task_failed", "sync", text=f"RemoteError: {text}\nsecond line"),
        Event("exit", "run_follow", 0, text=f"rank 0 failed: {text}", exit_code=3),
        Event("log", "run_follow", 0, text=f"(head, rank=0, pid=1) {text}"),
    ]


@pytest.mark.parametrize("text", CRAFTED)
def test_the_live_view_prints_crafted_event_text_as_written(text: str) -> None:
    console = _console()
    printer = ProgressPrinter(console)
    try:
        for event in _events(text):
            printer(event)
    finally:
        printer.close()
    out = _console_text(console)
    for expected in (
        f"c{text}",
        f"waiting for {text}",
        f"RECOVER: {text}",
        f"sync failed: RemoteError: {text}",
        f"rank 0 failed: {text}",
    ):
        assert expected in out, f"{expected!r} not shown as written in:\n{out}"


@pytest.mark.parametrize("text", CRAFTED)
def test_the_summary_prints_a_crafted_failure_and_cluster_name_as_written(text: str) -> None:
    console = _console()
    outcome = JobOutcome(
        succeeded=False,
        state="failed",
        cluster_name=f"c{text}",
        job_id=1,
        log_file=Path("launch.log"),
        step_times={"provision": (0.0, 1.0)},
        exit_codes={"run": {0: 3}},
        failures=[f"rank 0 failed with exit code 3: {text}"],
    )
    print_summary(console, outcome, 0.0, status="FAILED")
    out = _console_text(console)
    assert f"Job 1 on c{text} FAILED: rank 0 failed with exit code 3: {text}" in out


@pytest.mark.parametrize("text", CRAFTED)
def test_the_progress_view_prints_a_crafted_metric_name_and_reason_as_written(text: str) -> None:
    rank = {"rank": 0, "step": 4, "total": 10, "rate": 1.0, "updated_at": 95.0, "metrics": {text: 1.5}}
    doc = {
        "job_id": 1,
        "status": "RUNNING",
        "reported_ranks": 1,
        "num_nodes": 1,
        "ranks": [rank],
        "recoveries": [{"generation": 1, "action": "RECOVER", "reason": text, "ranks": [0], "lost_s": 3}],
    }
    console = Console(file=io.StringIO(), width=200)
    console.print(progress_view(doc, f"c{text}", 100.0))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert text.upper() in out and f"({text})" in out and f"on c{text}:" in out


def _console_text(console: Console) -> str:
    """What the terminal shows, without its escape codes: styles applied by crafted text would still show
    as missing brackets, which the assertions catch."""
    raw = console.file.getvalue()  # type: ignore[attr-defined]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b\]8;[^\x1b]*\x1b\\\\", "", raw)
