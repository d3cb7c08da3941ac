"""What `airflow-sky progress` prints of a progress document (the pure rendering; tests/cli/test_progress_cli.py
runs the command on a real cluster): the recoveries with what each cost, stale ranks, metric columns, and a
job's values as text, never as rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from airflow_sky.client.cli.progress_view import job_line, progress_view, recovery_line

NOW = 1_800_000_000.0


def _render(doc: dict) -> str:
    console = Console(width=160, file=io.StringIO(), highlight=False)
    console.print(progress_view(doc, "dev", NOW))
    return console.file.getvalue()  # type: ignore[attr-defined]


def _doc(**fields: object) -> dict:
    rank = {
        "rank": 0,
        "generation": 1,
        "step": 40,
        "total": 100,
        "rate": 2.0,
        "updated_at": NOW - 5,
        "stale": False,
    }
    doc = {
        "job_id": 7,
        "status": "RUNNING",
        "generation": 1,
        "num_nodes": 2,
        "reported_ranks": 2,
        "step": 30,
        "total": 100,
        "percent": 30.0,
        "rate": 0.5,
        "eta_s": 140.0,
        "slowest_rank": 1,
        "ranks": [
            {**rank, "metrics": {"loss": 1.25, "[bold]x": 3.0}},
            {
                **rank,
                "rank": 1,
                "step": 30,
                "rate": 0.5,
                "updated_at": NOW - 300,
                "stale": True,
                "metrics": {},
            },
        ],
        "recoveries": [
            {
                "generation": 1,
                "action": "RECOVER",
                "reason": "node 1 lost [red]",
                "ranks": [1],
                "lost_s": 75.0,
                "resumed_at": NOW - 30,
                "steps_redone": 12,
            }
        ],
    }
    return {**doc, **fields}


def test_the_job_line_names_the_slowest_rank_and_the_ranks_reporting():
    assert job_line(_doc(), "dev") == (
        "Job 7 on dev: RUNNING, step 30/100 30%, 0.5/s, ETA 2m20s, slowest rank 1, generation 1, 2/2 ranks reporting"
    )


def test_each_rank_shows_its_metrics_and_a_silent_rank_is_stale():
    out = _render(_doc())
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "LOSS" in out and "[BOLD]X" in out  # a metric's name as text, not markup
    assert "40/100 40%" in rows["0"] and "1.25" in rows["0"] and "2/s" in rows["0"] and "5s ago" in rows["0"]
    assert "stale" in rows["1"] and "5m00s ago" in rows["1"] and rows["1"].count(" - ") == 2  # no metrics


def test_a_recovery_says_what_it_cost_and_one_still_under_way_says_so():
    out = _render(_doc())
    assert "generation 1: RECOVER rank 1 (node 1 lost [red]), 1m15s lost, 12 steps redone" in out
    ongoing = {"generation": 2, "action": "RESTART", "ranks": [], "lost_s": 20.0, "resumed_at": None}
    assert recovery_line(ongoing) == "generation 2: RESTART every rank, 20s lost so far"


def test_a_job_that_reports_nothing_says_how_to_report():
    out = _render(_doc(reported_ranks=0, step=None, ranks=[], recoveries=[]))
    assert out.startswith("Job 7 on dev: RUNNING, generation 1, 0/2 ranks reporting")
    assert "No progress reported" in out and "airflow_sky.progress.report(" in out
