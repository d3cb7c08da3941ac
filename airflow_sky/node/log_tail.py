"""Reading one rank's job log from an offset: whole lines, prefixed the way SkyPilot prints them."""

from __future__ import annotations

from collections.abc import Callable

from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.node.logs import LineSplitter, node_prefix
from airflow_sky.progress import MARKER, Report, parse_line


class LogTail:
    """The log of job `job_id` (one generation) on `client`'s node, fed to `emit` line by line.

    Lines carry the node's prefix (`(worker1, rank=1, pid=..., ip=...)`; the pid once the node reports it).
    A line that carries a progress report (`@@airflow-sky-progress/1 {...}`, airflow_sky.progress) goes to
    `on_report` only, never to `emit` (no screen or task log shows the protocol), unless `raw`.
    `poll()` reads what is new and returns the job's state; it raises RemoteError when the node does not
    answer. The last line is flushed when the job has ended and its log is read to the end.
    """

    def __init__(
        self,
        client: NodeClient,
        job_id: str,
        generation: int,
        setup: bool,
        emit: Callable[[str], None],
        offset: int = 0,
        keep: int = 20,
        wait_for_start: bool = False,
        on_report: Callable[[Report], None] | None = None,
        raw: bool = False,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.generation = generation
        self.offset = offset
        self.ended = False
        # A job not started yet is one to wait for (its start task may run after this reader), not an end.
        self.wait_for_start = wait_for_start
        self._setup = setup
        self._emit = emit
        self._on_report = on_report
        self._raw = raw
        self._prefix = self._prefix_for(None)
        self._pid: int | None = None
        self._lines = LineSplitter(self._line, keep=keep)

    def _prefix_for(self, pid: int | None) -> str:
        node = self.client.node
        return node_prefix(node.rank, pid, node.internal_ip, self._setup)

    def _line(self, line: str) -> None:
        report = parse_line(line) if MARKER in line else None  # a substring test: most lines cost no parse
        if report is None or self._raw:
            self._emit(f"{self._prefix} {line}")
        if report is not None and self._on_report is not None:
            self._on_report(report)

    def poll(self) -> jobs.JobPoll:
        poll = jobs.read_job(
            self.client, self.job_id, self.generation, self.offset, want_pid=self._pid is None
        )
        if poll.pid is not None and self._pid is None:
            self._pid = poll.pid
            self._prefix = self._prefix_for(poll.pid)
        self._lines.feed(poll.data)
        self.offset = poll.next_offset
        if poll.missing and self.wait_for_start:
            return poll
        if poll.missing or (not poll.running and poll.caught_up):
            self._lines.flush()
            self.ended = True
        return poll

    def flush(self) -> None:
        """Emit an unfinished last line now (a reader that stops before the job ends)."""
        self._lines.flush()

    @property
    def prefix(self) -> str:
        """The node's prefix of this log's lines: `(worker1, rank=1, pid=..., ip=...)`."""
        return self._prefix

    @property
    def line_offset(self) -> int:
        """The end of the last whole line emitted: where a later reader goes on without repeating a line."""
        return self.offset - self._lines.pending_bytes

    @property
    def tail(self) -> tuple[str, ...]:
        """The last lines read (unprefixed), for error messages."""
        return tuple(self._lines.tail)
