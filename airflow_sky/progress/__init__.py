"""Progress reports from a running job: `report(step=, total=, **metrics)` writes one line to the rank's log.

Standard library only, and no import of Airflow or of the rest of airflow-sky: every node gets this package
on its PYTHONPATH (`airflow_sky.node.python_lib`), so `from airflow_sky.progress import report` works in a
job's Python whether or not airflow-sky is installed there. The line format is in `protocol`; any language
can write it (`echo`). `hf` and `lightning` hold callbacks for those trainers (imported on use).
"""

from __future__ import annotations

from airflow_sky.progress.protocol import (
    MARKER,
    MAX_METRICS,
    MAX_REPORT_BYTES,
    VERSION,
    Report,
    ReportReader,
    format_line,
    parse_line,
)
from airflow_sky.progress.reporter import Reporter, configure, flush, report

__all__ = [
    "MARKER",
    "MAX_METRICS",
    "MAX_REPORT_BYTES",
    "VERSION",
    "Report",
    "ReportReader",
    "Reporter",
    "configure",
    "flush",
    "format_line",
    "parse_line",
    "report",
]
