"""The progress line: its format, a pure writer and a pure, bounded parser. Standard library only.

A rank reports progress by writing one line to its stdout or stderr (the log the follow tasks read):

    @@airflow-sky-progress/1 {"step":120,"total":3000,"metrics":{"loss":2.31,"tokens/s":18400}}

The marker names the format's version; the rest of the line is one JSON object:
    step     required, an integer >= 0 (the last step done)
    total    optional, an integer >= 1 (the steps of the whole run), or null
    metrics  optional, {name: finite number}; a name is 1-64 of letters, digits, `_ . / -`, starting with
             a letter or `_`; at most 32 metrics (the first 32 count)
    rank     optional, an integer >= 0 (the process's global rank, e.g. torchrun's RANK)
    time     optional, the report's Unix time in seconds
Other keys are ignored (later v1 writers may add some). Text before the marker on the same line is ignored
(a logger's timestamp, torchrun's `[default0]:`, a progress bar's `\\r` fragment); the report runs from
the marker to the end of its line or to a `\\r`, at most MAX_REPORT_BYTES. A line whose step is missing or invalid
is no report; an invalid metric, total, rank or time is dropped alone (a NaN loss must not hide the step).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

VERSION = 1
MARKER = f"@@airflow-sky-progress/{VERSION} "
MAX_REPORT_BYTES = 4096  # the marker and the JSON object together
MAX_METRICS = 32
MAX_STEP = 2**63 - 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
_ANY_MARKER = b"@@airflow-sky-progress/"
_LINE_END = re.compile(rb"[\r\n]")


@dataclasses.dataclass(frozen=True)
class Report:
    """One progress report of one process."""

    step: int
    total: int | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    rank: int | None = None
    time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the line (the keys that are set)."""
        data: dict[str, Any] = {"step": self.step}
        if self.total is not None:
            data["total"] = self.total
        if self.metrics:
            data["metrics"] = dict(self.metrics)
        if self.rank is not None:
            data["rank"] = self.rank
        if self.time is not None:
            data["time"] = self.time
        return data


def valid_name(name: object) -> bool:
    """Whether `name` may name a metric."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def metric_value(value: object) -> float | None:
    """`value` as a finite float, or None: numbers (Python, NumPy, a one-element tensor), never a bool/str."""
    if isinstance(value, bool | str | bytes) or not hasattr(value, "__float__"):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _count(value: object, minimum: int) -> int | None:
    """An integer >= `minimum` (an integral float counts: not every language writes 10 as 10), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and minimum <= value <= MAX_STEP:
        return value
    return None


def format_line(report: Report) -> str:
    """The line (without its newline) for `report`, whose fields the caller has checked."""
    body = json.dumps(report.to_dict(), separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return MARKER + body


def _not_a_number(name: str) -> None:
    """NaN and Infinity (which JSON lacks, and Python writes): a value every check refuses."""
    return None


def parse_line(line: str | bytes) -> Report | None:
    """The report on `line` (one log line, its end of line or not), or None when there is none."""
    raw = line if isinstance(line, bytes) else line.encode("utf-8", errors="replace")
    at = raw.rfind(_ANY_MARKER)
    if at < 0:
        return None
    # The report ends its line; a `\r` ends it too (a progress bar may redraw after it on the same line).
    chunk = _LINE_END.split(raw[at:], maxsplit=1)[0].rstrip(b" \t")
    if len(chunk) > MAX_REPORT_BYTES:
        return None
    text = chunk.decode("utf-8", errors="replace")
    if not text.startswith(MARKER):
        return None  # another version of the format
    try:
        data = json.loads(text[len(MARKER) :], parse_constant=_not_a_number)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    step = _count(data.get("step"), 0)
    if step is None:
        return None
    when = data.get("time")
    seconds = metric_value(when) if isinstance(when, int | float) else None
    return Report(
        step=step,
        total=_count(data.get("total"), 1),
        metrics=clean_metrics(data.get("metrics")),
        rank=_count(data.get("rank"), 0),
        time=seconds if seconds is not None and seconds > 0 else None,
    )


def clean_metrics(metrics: object) -> dict[str, float]:
    """The valid metrics of a parsed `metrics` object (JSON numbers only), the first MAX_METRICS."""
    if not isinstance(metrics, dict):
        return {}
    kept: dict[str, float] = {}
    for name, value in metrics.items():
        if len(kept) == MAX_METRICS:
            break
        number = metric_value(value) if isinstance(value, int | float) else None
        if valid_name(name) and number is not None:
            kept[name] = number
    return kept


class ReportReader:
    """Reports from a byte stream read in arbitrary chunks (a log read by offset).

    Lines end at `\\n` or `\\r` (CRLF, and a progress bar's carriage returns). Only a line's last
    MAX_REPORT_BYTES count (a report is the end of its line), so memory stays bounded whatever the stream
    holds. Start it with `at_line_start=False` when reading from the middle of a line (a resumed offset):
    everything up to the first line end is skipped.
    """

    def __init__(self, at_line_start: bool = True) -> None:
        self._partial = b""
        self._skipping = not at_line_start

    def feed(self, data: bytes) -> list[Report]:
        """The reports completed by `data`."""
        lines = _LINE_END.split(self._partial + data)
        self._partial = lines.pop()[-(MAX_REPORT_BYTES + 1) :]
        if self._skipping and lines:
            lines, self._skipping = lines[1:], False
        return _reports(lines)

    def flush(self) -> list[Report]:
        """The report on an unfinished last line (the stream ended without a line end)."""
        partial, self._partial = self._partial, b""
        skipping, self._skipping = self._skipping, False
        return [] if skipping else _reports([partial])


def _reports(lines: Iterable[bytes]) -> list[Report]:
    return [r for r in (parse_line(line) for line in lines if _ANY_MARKER in line) if r is not None]
