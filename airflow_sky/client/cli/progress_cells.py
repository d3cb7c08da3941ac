"""How a job's progress reads in a table cell (`queue`, `jobs queue`, `progress`): pure, no rich (the
duration, rate and metric forms are the compact progress line's, gang.progress_line)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from airflow_sky.gang.progress_line import metric_cell, rate_cell, short_duration

__all__ = ["eta_cell", "metric_cell", "progress_cell", "rate_cell", "short_duration"]


def progress_cell(progress: Mapping[str, Any] | None) -> str:
    """'1200/3000 40%' (the job's step, its slowest rank's), '1200' without a total, '-' when it reports none."""
    if not progress or progress.get("step") is None:
        return "-"
    step, total, percent = progress["step"], progress.get("total"), progress.get("percent")
    if not total:
        return str(step)
    # Floored: a job shows 100% only once its last step is done.
    shown = f" {math.floor(percent)}%" if percent is not None else ""
    return f"{step}/{total}{shown}"


def eta_cell(progress: Mapping[str, Any] | None) -> str:
    """'1h02m', or '-' when unknown (no total, no rate yet, or the job ended)."""
    eta = progress.get("eta_s") if progress else None
    return "-" if eta is None else short_duration(eta)
