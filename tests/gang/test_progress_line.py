"""The compact progress line shown instead of the report lines (gang.progress_line): its form, and when a
plain output prints it."""

from __future__ import annotations

from airflow_sky.gang import job_progress as jp
from airflow_sky.gang.progress_line import LineThrottle, compact_line, rank_doc
from airflow_sky.progress import Report


def test_the_line_shows_step_total_rate_eta_and_the_first_metrics() -> None:
    doc = {
        "step": 1200,
        "total": 3000,
        "rate": 2.4142,
        "eta_s": 745.6,
        "metrics": {"loss": 2.314159, "tokens/s": 18400.0, "a": 1, "b": 2, "c": 3},
    }
    assert (
        compact_line(doc)
        == "step 1200/3000 40% · 2.41/s · ETA 12m26s · loss=2.31416 · tokens/s=18400 · a=1 · b=2"
    )
    assert compact_line({"step": 7, "total": None, "rate": None, "eta_s": None, "metrics": {}}) == "step 7"
    assert compact_line({"step": 10, "total": 10, "rate": 2.0, "eta_s": 0.0}) == "step 10/10 100% · 2/s"
    assert compact_line({"step": None}) is None and compact_line(None) is None


def test_a_ranks_line_has_its_rate_and_eta_from_its_own_reports() -> None:
    progress = None
    for step in range(1, 11):
        progress = jp.with_report(progress, 1, 0, Report(step, 20, {"loss": 1.0}, 1, 100.0 + step), 0.0)
    assert progress is not None
    assert compact_line(rank_doc(progress)) == "step 10/20 50% · 1/s · ETA 10s · loss=1"


def test_a_plain_output_gets_a_changed_line_at_most_every_interval_and_the_last_one_at_the_end() -> None:
    now = [0.0]
    throttle = LineThrottle(30.0, clock=lambda: now[0])
    assert throttle.offer("step 1") == "step 1"
    now[0] = 10.0
    assert throttle.offer("step 2") is None and throttle.offer("step 3") is None
    now[0] = 31.0
    assert throttle.offer(None) == "step 3"
    now[0] = 40.0
    assert throttle.offer("step 4") is None
    assert throttle.offer(None, final=True) == "step 4"
    assert throttle.offer(None, final=True) is None  # shown already: never twice
    assert throttle.offer("step 4", final=True) is None
