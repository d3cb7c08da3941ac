"""The progress gauges' names and values (pure), and no sink at all when the deployment's metrics are off.
The gauges reaching a real StatsD socket: tests/dags/test_progress_dag.py."""

from __future__ import annotations

import pytest

from airflow_sky.hooks import progress_metrics as pm


def test_gauges_name_every_value_the_document_has_and_leave_out_the_unknown() -> None:
    doc = {
        "status": "RUNNING",
        "step": 120,
        "percent": 4.0,
        "eta_s": None,
        "rate": 2.5,
        "recoveries": [{"generation": 1}],
        "metrics": {"loss": 2.31, "tokens/s": 18400.0},
    }
    assert pm.gauges(doc) == [
        ("airflow_sky.job.step", 120),
        ("airflow_sky.job.percent", 4.0),
        ("airflow_sky.job.steps_per_second", 2.5),
        ("airflow_sky.job.recoveries", 1),
        ("airflow_sky.job.metric.loss", 2.31),
        ("airflow_sky.job.metric.tokens_s", 18400.0),
    ]
    ended = dict(doc, status="SUCCEEDED", eta_s=12.0)
    assert ("airflow_sky.job.eta_seconds", 0.0) in pm.gauges(ended)  # no stale ETA once the job ended


def test_a_legacy_name_carries_the_tags_with_dots_escaped() -> None:
    tags = {"dag_id": "team.train", "cluster": "c-1", "sky_job": "7"}
    assert pm.legacy_name("airflow_sky.job.step", tags) == "airflow_sky.job.step.team__train.c-1.7"


def test_no_sink_when_metrics_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("STATSD_ON", "STATSD_DATADOG_ENABLED", "OTEL_ON"):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", "False")
    assert pm.progress_gauges("d", "c", 1) is None
