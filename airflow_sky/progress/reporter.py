"""Writing progress lines from a training loop: thread-safe, rate-limited, and never raising into the loop.

Standard library only: this file (with protocol.py) is what a node without airflow-sky gets on its
PYTHONPATH, and importing it must cost a training script nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TextIO

from airflow_sky.progress.protocol import (
    MAX_METRICS,
    MAX_REPORT_BYTES,
    MAX_STEP,
    Report,
    format_line,
    metric_value,
    valid_name,
)

INTERVAL_ENV = "AIRFLOW_SKY_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 1.0  # the follow tasks read a log about once a second: more lines only grow the log
_MAX_WARNINGS = 16  # distinct problems warned about per reporter; a loop repeating one warns once

_reporters: weakref.WeakSet[Reporter] = weakref.WeakSet()


def rank_from_env(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's global rank: torchrun's RANK, else the node's SKYPILOT_NODE_RANK, else None."""
    for name in ("RANK", "SKYPILOT_NODE_RANK"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _integer(value: object) -> int | None:
    """`value` as an int (Python and NumPy integers, an integral float, a 0-d tensor), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


class Reporter:
    """Writes reports as progress lines to `stream` (sys.stdout at each write when None).

    At most one line per `min_interval_s`: a report that comes sooner is held and written when the
    interval has passed, by `flush()`, or at exit; the first report and one that reaches `total` are
    written at once. A held report is replaced by the next one that has metrics (keeping the held
    metrics it does not report itself); a report of a step alone never replaces held metrics (they would
    lose their step), so the step shown may lag by one interval. Invalid values are dropped with one
    warning per kind of problem.
    """

    def __init__(
        self,
        min_interval_s: float = DEFAULT_INTERVAL_S,
        stream: TextIO | None = None,
        rank: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_interval_s = max(0.0, float(min_interval_s))
        self.rank = rank if rank is not None else rank_from_env()
        self._stream = stream
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._held: Report | None = None
        self._at_exit = False
        self._warned: set[str] = set()
        _reporters.add(self)

    def report(self, step: int, total: int | None = None, **metrics: float) -> bool:
        """Report `step` of `total` with `metrics`; True when a line was written now. Never raises."""
        try:
            checked = self._check(step, total, metrics)
            if checked is None:
                return False
            with self._lock:
                return self._report(checked)
        except Exception as e:  # the training loop comes first
            self._warn("internal", f"airflow_sky.progress: a report failed and was dropped: {e!r}")
            return False

    def _report(self, report: Report) -> bool:
        now, held = self._clock(), self._held
        finished = report.total is not None and report.step >= report.total
        if held is not None and held.metrics and not report.metrics:
            # A step alone never replaces metrics waiting to be written: they keep the step they had.
            if not finished and not self._due(now):
                return False
            self._held, self._last = None, now
            self._write(held)
            return self._write(report) if finished else False
        if held is not None:
            report = _with_earlier_metrics(report, held)
        if not finished and not self._due(now):
            self._held = report
            self._flush_at_exit()
            return False
        self._held, self._last = None, now
        return self._write(report)

    def due(self) -> bool:
        """Whether a report now would be written at once (a caller can skip costly metrics otherwise)."""
        with self._lock:
            return self._due(self._clock())

    def _due(self, now: float) -> bool:
        return self._last is None or now - self._last >= self.min_interval_s

    def flush(self) -> bool:
        """Write the report the rate limit holds, if any; True when a line was written."""
        try:
            with self._lock:
                held, self._held = self._held, None
                if held is None:
                    return False
                self._last = self._clock()
                return self._write(held)
        except Exception:
            return False

    def _check(self, step: object, total: object, metrics: Mapping[str, object]) -> Report | None:
        good_step = _integer(step)
        if good_step is None or not 0 <= good_step <= MAX_STEP:
            self._warn("step", f"airflow_sky.progress: step must be an integer >= 0, not {step!r}: dropped")
            return None
        good_total = None if total is None else _integer(total)
        if total is not None and (good_total is None or not 1 <= good_total <= MAX_STEP):
            self._warn(
                "total", f"airflow_sky.progress: total must be an integer >= 1, not {total!r}: ignored"
            )
            good_total = None
        kept: dict[str, float] = {}
        for name, value in metrics.items():
            number = metric_value(value)
            if not valid_name(name):
                self._warn(
                    f"name:{name[:64]}",
                    f"airflow_sky.progress: metric name {name[:64]!r} is not allowed (1-64 letters, digits, "
                    "'_', '.', '/', '-', starting with a letter or '_'): dropped",
                )
            elif number is None:
                self._warn(
                    f"value:{name}",
                    f"airflow_sky.progress: metric {name!r} must be a finite number, not {value!r:.80}: dropped",
                )
            elif len(kept) == MAX_METRICS:
                self._warn("count", f"airflow_sky.progress: at most {MAX_METRICS} metrics a report: dropped")
            else:
                kept[name] = number
        return Report(good_step, good_total, kept, self.rank, round(time.time(), 3))

    def _write(self, report: Report) -> bool:
        line = format_line(report)
        if (
            len(line) > MAX_REPORT_BYTES
        ):  # cannot happen with the limits above; never write a line no one reads
            self._warn("size", "airflow_sky.progress: a report over the line limit was dropped")
            return False
        stream = self._stream if self._stream is not None else sys.stdout
        if stream is None:  # no stdout at all (pythonw, a daemon)
            return False
        try:
            stream.write(line + "\n")  # one write: threads and processes sharing the log never split a line
            stream.flush()
        except (OSError, ValueError) as e:  # a closed or broken stream
            self._warn("stream", f"airflow_sky.progress: cannot write a progress line: {e}")
            return False
        return True

    def _flush_at_exit(self) -> None:
        if not self._at_exit:
            self._at_exit = True
            atexit.register(self.flush)

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned or len(self._warned) >= _MAX_WARNINGS:
            return
        self._warned.add(key)
        # Warnings turned into errors (-W error) must not stop training either.
        with contextlib.suppress(Exception):
            warnings.warn(message, RuntimeWarning, stacklevel=_caller_level())

    def _after_fork(self) -> None:
        # A lock held by another thread at fork() stays held forever in the child (a DataLoader worker).
        self._lock = threading.Lock()


def _with_earlier_metrics(report: Report, held: Report) -> Report:
    """`report` with the metrics only the held report it replaces had: a line carries the latest value of
    every metric reported since the last line (a loss logged between two lines is not lost)."""
    if held.metrics.keys() <= report.metrics.keys():  # the common case, in a hot loop: nothing to add
        return report
    merged = dict(report.metrics)
    for name, value in held.metrics.items():
        if name not in merged and len(merged) < MAX_METRICS:
            merged[name] = value
    return Report(report.step, report.total, merged, report.rank, report.time)


def _caller_level() -> int:
    """The stack level of the first frame outside this package: a warning names the user's line."""
    here = os.path.dirname(__file__)
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def _reset_after_fork() -> None:
    for reporter in list(_reporters):
        reporter._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def interval_from_env(env: Mapping[str, str] = os.environ) -> float:
    """The default reporter's interval: $AIRFLOW_SKY_PROGRESS_INTERVAL_S seconds (>= 0), else 1 s."""
    raw = env.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value >= 0 and value != float("inf"):
        return value
    warnings.warn(
        f"{INTERVAL_ENV}={raw!r} is not a number of seconds >= 0; using {DEFAULT_INTERVAL_S}",
        RuntimeWarning,
        stacklevel=3,
    )
    return DEFAULT_INTERVAL_S


_default: Reporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> Reporter:
    """The process's reporter behind `report()`, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            try:
                interval = interval_from_env()
            except Exception:
                interval = DEFAULT_INTERVAL_S
            _default = Reporter(min_interval_s=interval)
        return _default


def configure(
    min_interval_s: float | None = None, stream: TextIO | None = None, rank: int | None = None
) -> Reporter:
    """Replace the reporter behind `report()` (what is left unset keeps its default); returns it."""
    global _default
    fresh = Reporter(
        min_interval_s=interval_from_env() if min_interval_s is None else min_interval_s,
        stream=stream,
        rank=rank,
    )
    with _default_lock:
        old, _default = _default, fresh
    if old is not None:
        old.flush()
    return fresh


def report(step: int, total: int | None = None, **metrics: float) -> bool:
    """Report progress: `step` done of `total`, with named metrics (loss=..., **{"tokens/s": ...}).

    Writes one progress line to stdout (see airflow_sky.progress.protocol), at most one a second by
    default; True when a line was written now. Never raises: invalid values are dropped with a warning.
    """
    try:
        return default_reporter().report(step, total, **metrics)
    except Exception:
        return False


def flush() -> bool:
    """Write the report the default reporter holds back, if any (it is also written at exit)."""
    return default_reporter().flush()
