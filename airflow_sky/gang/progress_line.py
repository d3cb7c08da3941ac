"""The one compact progress line shown where a job's log is shown (the CLI's live view, `logs`, the follow
tasks' Airflow logs) instead of the `@@airflow-sky-progress/1` lines themselves:

    step 1200/3000 40% · 2.41/s · ETA 12m27s · loss=2.31 · tokens/s=18400

Pure: it reads a progress document (gang.job_progress.summarize) or one rank's record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from airflow_sky.gang.job_progress import RankProgress, rank_rate

LINE_METRICS = 4  # the line shows the first metrics reported; `airflow-sky progress` shows them all


def short_duration(seconds: float) -> str:
    """'45s', '12m05s', '1h02m', '2d03h': the two largest units (the seconds rounded up)."""
    total = max(0, math.ceil(seconds))
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def rate_cell(rate: float | None) -> str:
    """Steps per second: '2.41/s', '0.05/s', '-' when not known yet."""
    if rate is None:
        return "-"
    return f"{rate:.3g}/s"


def metric_cell(value: float | None) -> str:
    """A metric as the chart shows it: 6 significant digits at most ('2.3417', '1.2e-05')."""
    return "-" if value is None else f"{value:.6g}"


def compact_line(doc: Mapping[str, Any] | None) -> str | None:
    """The line for a document with `step`, `total`, `rate`, `eta_s` and `metrics` (a job's progress
    document, or rank_doc's); None when it has no step (nothing reported)."""
    if not doc or doc.get("step") is None:
        return None
    step, total = doc["step"], doc.get("total")
    parts = [
        f"step {step}/{total} {math.floor(min(100.0, 100.0 * step / total))}%" if total else f"step {step}"
    ]
    if doc.get("rate") is not None:
        parts.append(rate_cell(doc["rate"]))
    if doc.get("eta_s") is not None and not (total and step >= total):  # done: no "ETA 0s"
        parts.append(f"ETA {short_duration(doc['eta_s'])}")
    metrics = list((doc.get("metrics") or {}).items())
    parts += [f"{name}={metric_cell(value)}" for name, value in metrics[:LINE_METRICS]]
    return " · ".join(parts)


def rank_doc(progress: RankProgress) -> dict[str, Any]:
    """One rank's record in the form compact_line reads (its rate over its last minute, its ETA)."""
    rate = rank_rate(progress)
    eta = (progress.total - progress.step) / rate if progress.total and rate else None
    return {
        "step": progress.step,
        "total": progress.total,
        "rate": rate,
        "eta_s": max(0.0, eta) if eta is not None else None,
        "metrics": dict(progress.metrics),
    }


class LineThrottle:
    """When a progress line is worth printing as a line of its own (a log, not a terminal): when it
    changed and `interval_s` passed since the last one printed, or at the end of a phase (`final`)."""

    def __init__(self, interval_s: float, clock: Any = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._printed: str | None = None
        self._next = 0.0
        self.pending: str | None = None  # the newest line not printed yet

    def offer(self, line: str | None, final: bool = False) -> str | None:
        """The line to print now, or None."""
        if line is not None:
            self.pending = line if line != self._printed else None
        now = self.clock()
        if self.pending is None or (not final and now < self._next):
            return None
        line, self.pending, self._printed = self.pending, None, self.pending
        self._next = now + self.interval_s
        return line
