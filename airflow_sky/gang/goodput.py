"""A run's goodput: how much of its wall time went into new training steps (pure).

    {"wall_s":          trigger (the job's submit) to its end, or to now while it runs,
     "to_start_s":      trigger to the first start of a setup or run (provision, the cluster's queue, sync),
     "to_first_step_s": trigger to the first progress report (the above, setup and the job's own start-up),
     "productive_s":    first report to the last, less the time recoveries lost,
     "lost_s":          what the recoveries cost (each from its fault until every rank was back),
     "steps_redone":    steps done a second time after recoveries,
     "ratio":           productive_s / wall_s}

Without progress reports there are no steps to count: the document says so with None (not 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow_sky.gang.job_progress import RankProgress
from airflow_sky.gang.state_record import JobState


def goodput(
    state: JobState, ranks: Mapping[int, RankProgress], recoveries: Sequence[Mapping[str, Any]], now: float
) -> dict[str, Any] | None:
    """The job's goodput (module doc); None when the job record has no submit time."""
    submitted = _epoch(state.info.get("submitted_at"))
    if submitted is None:
        return None
    end = float(state.info.get("ended_at") or now)
    wall = max(0.0, end - submitted)
    started = state.info.get("started_at")
    times = [p.time for r in ranks.values() for p in r.history] + [r.time for r in ranks.values()]
    lost = sum(float(r.get("lost_s") or 0.0) for r in recoveries)
    redone = [int(r["steps_redone"]) for r in recoveries if r.get("steps_redone") is not None]
    doc: dict[str, Any] = {
        "wall_s": wall,
        "to_start_s": max(0.0, float(started) - submitted) if started is not None else None,
        "to_first_step_s": None,
        "productive_s": None,
        "lost_s": lost,
        "steps_redone": sum(redone) if redone else (0 if ranks and not recoveries else None),
        "ratio": None,
    }
    if times:
        first, last = min(times), max(times)
        productive = max(0.0, last - first - lost)
        doc.update(to_first_step_s=max(0.0, first - submitted), productive_s=productive)
        doc["ratio"] = min(1.0, productive / wall) if wall > 0 else None
    return doc


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value)).timestamp() if value else None
    except ValueError:
        return None
