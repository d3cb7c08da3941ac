"""A job's progress records and summary (gang.job_progress): pure rules as tables, the records on a real
local state store, and the collector's throttled writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airflow_sky.gang import job_progress as jp
from airflow_sky.gang import progress_store as ps
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.state_record import JobState
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.progress import Report


def _fed(
    rank: int, reports: list[tuple[float, int]], generation: int = 0, total: int | None = 100
) -> jp.RankProgress:
    progress = None
    for when, step in reports:
        progress = jp.with_report(
            progress, rank, generation, Report(step, total, {"loss": 1.0 / (step + 1)}, rank, when), when
        )
    assert progress is not None
    return progress


def _state(generation: int = 0, history: tuple[dict[str, object], ...] = ()) -> JobState:
    return JobState(
        job_id=3, status=JobStatus.RUNNING, info={"num_nodes": 2}, generation=generation, history=history
    )


def test_a_history_stays_bounded_and_keeps_its_first_and_newest_points() -> None:
    progress = _fed(0, [(1000.0 + i, i) for i in range(5000)])
    assert len(progress.history) <= jp.HISTORY_POINTS + 1
    assert progress.history[0].step == 0
    assert [p.step for p in progress.history[-jp.HISTORY_POINTS // 2 :]] == list(
        range(5000 - jp.HISTORY_POINTS // 2, 5000)
    )
    assert len(jp.RankProgress.from_dict(progress.to_dict()).history) == len(progress.history)


def test_a_second_process_on_a_node_and_an_older_generation_do_not_count() -> None:
    first = jp.with_report(None, 1, 2, Report(10, 100, {}, 2, 5.0), 5.0)
    assert first is not None and first.process == 2
    assert jp.with_report(first, 1, 2, Report(11, 100, {}, 3, 6.0), 6.0) is None  # RANK 3 on the same node
    assert jp.with_report(first, 1, 1, Report(11, 100, {}, 2, 6.0), 6.0) is None  # an older generation
    newer = jp.with_report(first, 1, 3, Report(0, 100, {}, 3, 7.0), 7.0)
    assert newer is not None and (newer.generation, newer.process, newer.step) == (3, 3, 0)
    assert [p.generation for p in newer.history] == [2, 3]


def test_the_same_step_reported_again_replaces_its_point() -> None:
    progress = _fed(0, [(1.0, 5), (2.0, 5)])
    assert [(p.time, p.step) for p in progress.history] == [(2.0, 5)]


def test_the_job_step_rate_and_eta_are_the_slowest_ranks() -> None:
    fast = _fed(0, [(100.0 + t, 2 * t) for t in range(11)])  # 2 steps/s, at step 20
    slow = _fed(1, [(100.0 + t, t) for t in range(11)])  # 1 step/s, at step 10
    doc = jp.summarize({0: fast, 1: slow}, _state(), now=111.0)
    assert (doc["step"], doc["total"], doc["slowest_rank"]) == (10, 100, 1)
    assert doc["rate"] == pytest.approx(1.0) and doc["eta_s"] == pytest.approx(90.0)
    assert doc["percent"] == pytest.approx(10.0)
    assert [r["rate"] for r in doc["ranks"]] == [pytest.approx(2.0), pytest.approx(1.0)]
    assert "history" not in jp.summarize({0: fast}, _state(), now=111.0, with_history=False)["ranks"][0]


def test_a_rank_silent_for_long_is_stale_while_the_job_runs() -> None:
    quiet = _fed(0, [(0.0, 1), (1.0, 2)])
    assert jp.summarize({0: quiet}, _state(), now=1.0 + jp.STALE_AFTER_S + 1)["ranks"][0]["stale"] is True
    ended = dataclasses.replace(_state(), status=JobStatus.SUCCEEDED)
    doc = jp.summarize({0: quiet}, ended, now=1e6)
    assert doc["ranks"][0]["stale"] is False and doc["eta_s"] is None


def test_a_recovery_costs_the_time_until_every_rank_is_back_at_the_step_reached() -> None:
    # Generation 0 reached step 50 at t=150; the fault was seen at t=160, generation 1 started at t=200
    # from the snapshot at step 40 and every rank was back at 50 by t=215.
    ranks = {r: _fed(r, [(100.0 + t, t) for t in range(51)], generation=0) for r in (0, 1)}
    for r, late in ((0, 0.0), (1, 3.0)):
        progress = ranks[r]
        for step in range(40, 56):
            when = 200.0 + (step - 40) + late
            progress = jp.with_report(progress, r, 1, Report(step, 100, {}, r, when), when) or progress
        ranks[r] = progress
    entry = {
        "generation": 1,
        "action": "RECOVER",
        "reason": "rank 1 lost",
        "replaced_ranks": [1],
        "claimed_at": 160.0,
        "at": 200.0,
    }
    (recovery,) = jp.summarize(ranks, _state(1, (entry,)), now=300.0)["recoveries"]
    assert recovery["resumed_at"] == pytest.approx(213.0)
    assert recovery["lost_s"] == pytest.approx(53.0)
    assert (recovery["steps_redone"], recovery["ranks"], recovery["action"]) == (10, [1], "RECOVER")


def test_a_recovery_not_caught_up_yet_is_still_counting() -> None:
    ranks = {0: _fed(0, [(100.0 + t, t) for t in range(51)])}
    ranks[0] = jp.with_report(ranks[0], 0, 1, Report(40, 100, {}, 0, 210.0), 210.0) or ranks[0]
    entry = {
        "generation": 1,
        "action": "RECOVER",
        "reason": "x",
        "replaced_ranks": [0],
        "claimed_at": 160.0,
        "at": 200.0,
    }
    (recovery,) = jp.summarize(ranks, _state(1, (entry,)), now=260.0)["recoveries"]
    assert recovery["resumed_at"] is None and recovery["lost_s"] == pytest.approx(100.0)


def test_the_collector_writes_at_most_once_per_interval_and_goes_on_with_the_stored_record(
    tmp_path: Path,
) -> None:
    records = ps.ProgressRecords(LocalStateStore(tmp_path / "state"))
    now = [1000.0]
    collector = ps.ProgressCollector(records, 7, 1, 0, clock=lambda: now[0], interval_s=3.0)
    assert collector.flush() is False  # nothing reported
    collector.add(Report(1, 10, {"loss": 2.0}, 1, 1000.0))
    assert collector.flush() is True
    collector.add(Report(2, 10, {"loss": 1.5}, 1, 1001.0))
    now[0] = 1001.0
    assert collector.flush() is False and records.read(7, 1).step == 1  # type: ignore[union-attr]
    assert collector.flush(force=True) is True and records.read(7, 1).step == 2  # type: ignore[union-attr]
    # A relaunched generation's follower goes on with the record.
    again = ps.ProgressCollector(records, 7, 1, 1, clock=lambda: now[0])
    again.add(Report(0, 10, {}, 1, 1010.0))
    assert again.flush() is True
    stored = records.read(7, 1)
    assert stored is not None and [(p.generation, p.step) for p in stored.history] == [(0, 1), (0, 2), (1, 0)]
    assert sorted(records.read_all(7)) == [1]


def test_a_ranks_rate_holds_over_real_unix_times() -> None:
    progress = None
    for step in (1, 2, 3, 4):  # one step a second, at today's Unix time
        progress = jp.with_report(progress, 0, 0, Report(step, time=1_764_826_000.25 + step), 0.0) or progress
    assert progress is not None and [p.time for p in progress.history][:2] == [
        1_764_826_001.25,
        1_764_826_002.25,
    ]
    assert jp.rank_rate(progress) == pytest.approx(1.0)


def test_a_follower_that_reads_the_log_again_from_its_start_counts_no_step_twice(tmp_path: Path) -> None:
    records = ps.ProgressRecords(LocalStateStore(tmp_path / "state"))
    first = ps.ProgressCollector(records, 3, 0, 0)
    for step in (1, 2, 3):
        first.add(Report(step, 5, {"loss": float(step)}, None, 100.0 + step))
    assert first.flush(force=True) is True
    retried = ps.ProgressCollector(records, 3, 0, 0)  # a retried follow task: offset 0, same generation
    for step in (1, 2, 3, 4):
        retried.add(Report(step, 5, {"loss": float(step)}, None, 200.0 + step))
    assert retried.flush(force=True) is True
    stored = records.read(3, 0)
    assert stored is not None and [p.step for p in stored.history] == [1, 2, 3, 4]
    assert stored.history[2].time == 103.0  # step 3 kept as first read


def test_a_store_error_never_reaches_the_follower(tmp_path: Path) -> None:
    class Broken(LocalStateStore):
        def put(self, key, data, expected_version):  # type: ignore[no-untyped-def]
            raise OSError("disk full")

    collector = ps.ProgressCollector(ps.ProgressRecords(Broken(tmp_path)), 1, 0, 0)
    collector.add(Report(1))
    assert collector.flush() is False


def test_final_metrics_keep_no_history() -> None:
    doc = jp.summarize({0: _fed(0, [(1.0, 1), (2.0, 2)])}, _state(), now=3.0)
    final = jp.final_metrics(doc)
    assert final["ranks"] == [{"rank": 0, "step": 2, "metrics": {"loss": pytest.approx(1 / 3, rel=1e-5)}}]
    assert "history" not in str(final)


def test_a_metric_reported_every_25_steps_keeps_its_latest_value_between_reports() -> None:
    """minGPT's pattern: the step every step, the loss every 25 steps; the record's metrics keep the loss
    (and the summary shows it) until a newer one comes, while each history point keeps what it reported."""
    progress = None
    for step in range(1, 61):
        metrics = {"loss": 3.0 - step / 25, "lr": 0.1} if step % 25 == 0 else {"tokens/s": float(step)}
        progress = jp.with_report(progress, 0, 0, Report(step, 100, metrics, 0, 1000.0 + step), 0.0)
    assert progress is not None
    assert progress.metrics == {"loss": 1.0, "lr": 0.1, "tokens/s": 60.0}, progress.metrics
    assert progress.history[-1].metrics == {"tokens/s": 60.0}
    assert progress.history[49].metrics == {"loss": 1.0, "lr": 0.1}
    summary = jp.summarize({0: progress}, _state(), 1100.0)
    assert summary["metrics"]["loss"] == 1.0 and summary["ranks"][0]["metrics"]["loss"] == 1.0
    # A newer value replaces it; a relaunched generation goes on with the latest values.
    newer = jp.with_report(progress, 0, 1, Report(0, 100, {"loss": 0.5}, 0, 1200.0), 0.0)
    assert newer is not None and newer.metrics == {"loss": 0.5, "lr": 0.1, "tokens/s": 60.0}
