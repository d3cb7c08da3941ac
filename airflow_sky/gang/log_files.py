"""A job's log on its node as a file: where its last lines begin, and a copy of the whole of it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
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


@dataclasses.dataclass(frozen=True)
class LogCopy:
    """One log to download: job `job` (one phase's remote id) of `generation` on `node`, into `name`."""

    node: Node
    job: str
    generation: int
    name: str


def copy_logs(cluster: Cluster, wanted: list[LogCopy], target: Path) -> list[Path]:
    """Every wanted log into the folder `target`; the files written (a log never started there has none).

    All or nothing: the logs go to a hidden folder beside `target` first, and only once every node
    answered do they move into it. A node that does not answer fails at once (one connection attempt, no
    retries) with a ClusterError naming it; nothing is left behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        staged: list[Path] = []
        for copy in wanted:
            path = staging / copy.name
            client = cluster.client(copy.node, conn_retry_attempts=1)
            try:
                if copy_log(client, copy.job, copy.generation, path):
                    staged.append(path)
            except RemoteError as error:
                who = f"rank {copy.node.rank} ({copy.node.internal_ip})"
                raise ClusterError(
                    f"logs --sync-down: the node of {who} does not answer ({error}); its log cannot be "
                    "downloaded, so nothing was written (its node is gone? see `airflow-sky status`)"
                ) from None
            finally:
                client.close()
        target.mkdir(exist_ok=True)
        written = []
        for path in staged:
            os.replace(path, target / path.name)
            written.append(target / path.name)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)
