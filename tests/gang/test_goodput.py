"""A run's goodput from its job record and its ranks' progress (pure: gang.goodput), and its line."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from airflow_sky.client.cli.progress_view import goodput_line
from airflow_sky.gang.goodput import goodput
from airflow_sky.gang.job_progress import Point, RankProgress
from airflow_sky.gang.state_record import JobState

T0 = 1_000_000.0


def _state(**info: object) -> JobState:
    return JobState(job_id=1, info={"submitted_at": datetime.fromtimestamp(T0, UTC).isoformat(), **info})


def _rank(rank: int, points: list[tuple[float, int, int]]) -> RankProgress:
    history = tuple(Point(T0 + t, step, gen) for t, step, gen in points)
    return RankProgress(rank, history[-1].generation, history[-1].step, history[-1].time, history=history)


def test_goodput_is_the_time_spent_on_new_steps_over_the_wall_time() -> None:
    # Started 40 s after the trigger, first step at 60 s, last at 300 s, ended at 310 s; one recovery cost 40 s.
    ranks = {0: _rank(0, [(60, 1, 0), (150, 90, 0), (200, 80, 1), (300, 200, 1)])}
    recoveries = [{"lost_s": 40.0, "steps_redone": 10}]
    doc = goodput(_state(started_at=T0 + 40, ended_at=T0 + 310), ranks, recoveries, now=T0 + 999)
    assert doc == {
        "wall_s": 310.0,
        "to_start_s": 40.0,
        "to_first_step_s": 60.0,
        "productive_s": 200.0,
        "lost_s": 40.0,
        "steps_redone": 10,
        "ratio": pytest.approx(200 / 310),
    }
    assert goodput_line(doc) == "Goodput: 65% of 5m10s (first step after 1m00s, 40s lost, 10 steps redone)"


def test_a_running_job_counts_to_now_and_a_job_without_reports_has_no_ratio() -> None:
    running = goodput(_state(), {0: _rank(0, [(10, 1, 0), (20, 5, 0)])}, [], now=T0 + 40)
    assert running is not None and running["wall_s"] == 40.0 and running["steps_redone"] == 0
    silent = goodput(_state(), {}, [], now=T0 + 40)
    assert silent is not None and silent["ratio"] is None and silent["steps_redone"] is None
    assert goodput(JobState(job_id=1), {}, [], now=T0) is None  # no submit time: nothing to say
