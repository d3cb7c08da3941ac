"""A job's log on its node as a file: where its last lines begin, and a copy of the whole of it."""

from __future__ import annotations

from pathlib import Path

from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient


def last_lines_offset(client: NodeClient, job: str, generation: int, lines: int) -> int:
    """Where the last `lines` lines of a job's log begin (0: the whole log, also for lines <= 0)."""
    if lines <= 0:
        return 0
    size = jobs.read_job(client, job, generation, 0, max_bytes=0, want_pid=False).log_size
    window = 64 * 1024
    while True:
        start = max(0, size - window)
        data = jobs.read_job(client, job, generation, start, max_bytes=size - start, want_pid=False).data
        body = data[:-1] if data.endswith(b"\n") else data  # a last line without its newline yet counts
        breaks = [i for i, byte in enumerate(body) if byte == 0x0A]
        if len(breaks) >= lines:
            return start + breaks[-lines] + 1
        if start == 0:
            return 0
        window *= 4


def copy_log(client: NodeClient, job: str, generation: int, path: Path) -> bool:
    """A node's whole log of one job phase into `path`; False when it never started there."""
    offset = 0
    with path.open("wb") as out:
        while True:
            poll = jobs.read_job(client, job, generation, offset, want_pid=False)
            if poll.missing:
                break
            out.write(poll.data)
            offset = poll.next_offset
            if not poll.data or offset >= poll.log_size:
                return True
    path.unlink()
    return False
