"""The progress a queue line shows of a job (`airflow-sky queue`, `airflow-sky jobs queue`, the SDK's queue
records): its step, total, percent, rate and ETA, taken from its progress document (gang.job_progress) or
from the small form a job's final XCom keeps. Pure: a document read over HTTP is trusted for nothing."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

QUEUE_FIELDS = ("step", "total", "percent", "rate", "eta_s")


def queue_progress(doc: Any) -> dict[str, Any] | None:
    """{"step", "total", "percent", "rate", "eta_s"} of a progress document; None when the job reported
    nothing (no document, or no step in it). A field the document lacks is None (percent is worked out
    from step and total when only those are there: a final XCom's form)."""
    if not isinstance(doc, Mapping):
        return None
    step = _count(doc.get("step"))
    if step is None:
        return None
    total = _count(doc.get("total")) or None
    percent = _number(doc.get("percent"))
    if percent is None and total:
        percent = min(100.0, 100.0 * step / total)
    return {
        "step": step,
        "total": total,
        "percent": percent,
        "rate": _number(doc.get("rate")),
        "eta_s": _number(doc.get("eta_s")),
    }


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
