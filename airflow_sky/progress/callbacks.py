"""What the trainer callbacks share: which of a framework's logged values a report can carry."""

from __future__ import annotations

import math
from collections.abc import Mapping

from airflow_sky.progress.protocol import MAX_METRICS, metric_value, valid_name


def loggable_metrics(values: Mapping[str, object] | None) -> dict[str, float]:
    """The values a framework logged that are metrics (a valid name, one finite number), silently: a
    framework logs strings and non-scalar tensors too, which are no error of the user's."""
    kept: dict[str, float] = {}
    for name, value in (values or {}).items():
        if len(kept) == MAX_METRICS:
            break
        number = metric_value(value) if valid_name(name) else None
        if number is not None:
            kept[name] = number
    return kept


def step_total(value: object) -> int | None:
    """A framework's planned step count as a report's total: None when unknown (-1, 0, inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if value >= 1 else None


def install_hint(extra: str, package: str) -> str:
    return (
        f"airflow_sky.progress.{extra} needs {package}: pip install 'airflow-sky[{extra}]' "
        f"(or {package} alone on a node: airflow_sky.progress itself is shipped there)"
    )
