"""A running job's progress as Airflow metrics: per-job gauges through the deployment's own StatsD,
Datadog or OpenTelemetry settings (`[metrics] statsd_on`, `statsd_datadog_enabled`, `otel_on`).

The run follow task and its trigger hand `progress_gauges(...)` to their follower; only the follower that
holds the run phase's watch lease calls it (gang.follow.RankFollower, every PROGRESS_SINK_S), so a job's
gauges come from one process. Metrics off: no sink, nothing imported, nothing read.

Names and tags as Airflow's own: `airflow_sky.job.step` etc. tagged with dag_id, cluster and sky_job
(no `job_id` in it: Airflow's `[metrics] statsd_disabled_tags` drops tags matching that by default), the
StatsD prefix (`airflow` by default) before the name; with `[metrics] legacy_names_on` also the name that
carries the tags in it, `airflow_sky.job.step.<dag_id>.<cluster>.<job id>`, for a StatsD that drops tags.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import conf

from airflow_sky.gang.job import JobStatus

log = logging.getLogger(__name__)

PREFIX = "airflow_sky.job"
_BACKENDS = ("statsd_on", "statsd_datadog_enabled", "otel_on")
_ENDED = frozenset(status.value for status in JobStatus if status.is_terminal)


def metrics_on() -> bool:
    """Whether this deployment sends metrics anywhere."""
    return any(conf.getboolean("metrics", key, fallback=False) for key in _BACKENDS)


def progress_gauges(dag_id: str, cluster: str, job_id: int) -> Callable[[dict[str, Any]], None] | None:
    """The sink a follower hands the job's progress document to, or None when metrics are off."""
    if not metrics_on():
        return None
    try:
        _backend()
    except (ImportError, OSError) as error:  # no statsd package, an unknown host: as Airflow, no metrics
        log.warning("Progress gauges off: the metrics client could not be built: %s", error)
        return None
    tags = {"dag_id": dag_id, "cluster": cluster, "sky_job": str(job_id)}
    legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
    return functools.partial(send_gauges, tags, legacy)


def gauges(doc: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The gauges of a progress document (gang.job_progress.summarize): (name, value), the unknown left out."""
    from airflow.sdk.observability.stats import normalize_name_for_stats

    values: list[tuple[str, Any]] = [
        ("step", doc.get("step")),
        ("percent", doc.get("percent")),
        # An ended job has nothing left to wait for: its last ETA must not linger on a dashboard.
        ("eta_seconds", 0.0 if doc.get("status") in _ENDED else doc.get("eta_s")),
        ("steps_per_second", doc.get("rate")),
        ("recoveries", len(doc.get("recoveries") or ())),
        ("goodput", (doc.get("goodput") or {}).get("ratio")),
        ("lost_seconds", (doc.get("goodput") or {}).get("lost_s")),
    ]
    for name, value in (doc.get("metrics") or {}).items():
        # A metric may be named `tokens/s`: StatsD names allow letters, digits, `_ . -` only.
        values.append((f"metric.{normalize_name_for_stats(str(name), log_warning=False)}", value))
    return [
        (f"{PREFIX}.{name}", value if isinstance(value, int) else float(value))
        for name, value in values
        if value is not None
    ]


def legacy_name(stat: str, tags: Mapping[str, str]) -> str:
    """`stat` with the tags' values in it, as Airflow's legacy names (a `.` in a value becomes `__`)."""
    return ".".join([stat, *(tags[k].replace(".", "__") for k in ("dag_id", "cluster", "sky_job"))])


def send_gauges(tags: Mapping[str, str], legacy: bool, doc: Mapping[str, Any]) -> None:
    backend = _backend()
    for stat, value in gauges(doc):
        backend.gauge(stat, value, tags=dict(tags))
        if legacy:
            backend.gauge(legacy_name(stat, tags), value)


@functools.cache
def _backend() -> Any:
    """This process's metrics client, built from Airflow's settings as its task runner and triggerer do
    (one of our own: `airflow dags test` runs tasks where Airflow's shared one was never initialized)."""
    from airflow.sdk.observability.metrics import stats_utils

    return stats_utils.get_stats_factory()()
