"""The job's one compact progress line in the CLI's live output (launch, exec, logs), instead of the ranks'
`@@airflow-sky-progress/1` lines: on a terminal it is the live status line (rich), redrawn as reports come;
elsewhere (a pipe, a file, CI) a plain line at most every PLAIN_INTERVAL_S while it changes, and the last one
at the end of the run phase.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from airflow_sky.gang.progress_line import LineThrottle, compact_line

PLAIN_INTERVAL_S = 30.0


class ProgressLine:
    """The latest progress line of one job; `update` takes its progress document."""

    def __init__(
        self, console: Console, interval_s: float = PLAIN_INTERVAL_S, label: str = "progress"
    ) -> None:
        self.console = console
        self.label = label
        self.line: str | None = None  # the newest line: a terminal's status shows it
        self._throttle = LineThrottle(interval_s)

    def update(self, doc: Mapping[str, Any]) -> None:
        line = compact_line(doc)
        if line is None:
            return
        self.line = line
        if not self.console.is_terminal:
            self._print(self._throttle.offer(line))

    def end(self) -> None:
        """The run phase ended: its last line, unless a plain output showed it already (once)."""
        self._print(self._throttle.offer(self.line if self.console.is_terminal else None, final=True))

    def _print(self, line: str | None) -> None:
        if line is not None:
            self.console.print(Text(f"{self.label}: {line}", style="dim"), highlight=False, soft_wrap=True)


class LogsProgress(threading.Thread):
    """`airflow-sky logs`: the job's compact progress line (from the records its followers write) while the
    logs are followed, at most every `interval_s` while it changes, and once when they ended (`finish`)."""

    def __init__(
        self, cluster: str, job_id: int | None, output: TextIO, interval_s: float = PLAIN_INTERVAL_S
    ) -> None:
        super().__init__(name="airflow-sky-logs-progress", daemon=True)
        self.cluster = cluster
        self.job_id = job_id
        self.output = output
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._printed: str | None = None

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self._tell()

    def finish(self) -> None:
        """Stop, then print the latest line unless it was printed already."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=30)
        self._tell()

    def _tell(self) -> None:
        from airflow_sky.client import sdk

        try:
            doc = sdk.job_progress(self.cluster, self.job_id, with_history=False)
        except Exception:  # the logs are worth showing without their progress line
            return
        self.job_id = doc.get("job_id", self.job_id)  # the latest job when none was given: the same one after
        line = compact_line(doc)
        with self._lock:
            if line is None or line == self._printed:
                return
            self._printed = line
            with contextlib.suppress(OSError, ValueError):
                self.output.write(f"progress: {line}\n")  # one write: never split by a node's line
                self.output.flush()
