"""How a job's progress reads in a table cell (`queue`, `jobs queue`, `progress`): pure, no rich."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


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
