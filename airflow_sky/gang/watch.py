"""Watching one rank of a running phase until its follow task must act: the blocking half of the trigger.

One `poll()` reads the rank's new log lines and, every few seconds, the state of the other ranks; it
returns why the follow task must wake up (its rank ended, a sibling failed or was lost, a node stopped
answering), or None. Plain Python over a Cluster: the trigger runs each poll in a thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from airflow_sky.errors import RemoteError
from airflow_sky.gang.follow import UNREACHABLE_GRACE_S
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail


class RankWatch:
    """Watches `rank` of phase job `job_id` (one generation) on `nodes`; log lines go to `emit`."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: Sequence[Node],
        rank: int,
        job_id: str,
        generation: int,
        offset: int,
        setup: bool,
        emit: Callable[[str], None],
        sibling_interval_s: float = 5.0,
    ) -> None:
        self.cluster = cluster
        self.nodes = list(nodes)
        self.rank = rank
        self.job_id = job_id
        self.generation = generation
        self.offset = offset
        self.setup = setup
        self.emit = emit
        self.sibling_interval_s = sibling_interval_s
        self._stack = contextlib.ExitStack()
        self._clients: dict[int, NodeClient] | None = None
        self._log: LogTail | None = None  # this rank's log, once connected
        self._next_sibling_check = 0.0
        self._unreachable_since: dict[int, float] = {}
        self.behind = False  # more log to read than one poll returned
        self.own_done = False  # this rank exited 0; waiting for the others

    @property
    def line_offset(self) -> int:
        """The end of the last whole line logged: where the resumed task goes on."""
        return self._log.line_offset if self._log is not None else self.offset

    def clients(self) -> dict[int, NodeClient]:
        if self._clients is None:
            self._clients = self._stack.enter_context(self.cluster.clients(self.nodes, conn_retry_attempts=1))
            self._log = LogTail(
                self._clients[self.rank],
                self.job_id,
                self.generation,
                self.setup,
                self.emit,
                offset=self.offset,
                keep=0,
            )
        return self._clients

    def poll(self) -> str | None:
        """One round: log new lines; return why the task must wake up, or None to keep waiting."""
        try:
            clients = self.clients()
        except RemoteError:
            return self._unreachable(self.rank)
        if not self.own_done:
            reason = self._poll_own()
            if reason is not None or self.behind:
                return reason
        if time.monotonic() < self._next_sibling_check:
            return None
        self._next_sibling_check = time.monotonic() + self.sibling_interval_s
        return self._check_siblings(clients)

    def _poll_own(self) -> str | None:
        assert self._log is not None
        rank = self.rank
        try:
            poll = self._log.poll()
        except RemoteError:
            return self._unreachable(rank)
        self._unreachable_since.pop(rank, None)
        self.behind = not poll.caught_up
        if self._log.ended:
            if poll.missing or poll.exit_code != 0:
                return f"rank {rank} ended"
            # Succeeded: the phase has not, until every rank has (a sibling may still be lost and relaunched).
            self.own_done = True
            self._next_sibling_check = 0.0
        return None

    def _check_siblings(self, clients: dict[int, NodeClient]) -> str | None:
        all_ended = True
        for rank, client in clients.items():
            if rank == self.rank:
                continue
            try:
                state = jobs.poll_job(client, self.job_id, self.generation, 0, max_bytes=0)
            except RemoteError:
                reason = self._unreachable(rank)
                if reason is not None:
                    return reason
                all_ended = False
                continue
            self._unreachable_since.pop(rank, None)
            if state.missing or state.lost or state.exit_code not in (None, 0):
                return f"rank {rank} failed or was lost"
            all_ended = all_ended and state.exit_code is not None
        return "every rank ended" if self.own_done and all_ended else None

    def _unreachable(self, rank: int) -> str | None:
        since = self._unreachable_since.setdefault(rank, time.monotonic())
        if time.monotonic() - since >= UNREACHABLE_GRACE_S:
            return f"rank {rank} unreachable"
        if rank == self.rank and self._clients is not None:
            self._clients[rank].close()  # reconnect on the next poll
        return None

    def close(self) -> None:
        self._stack.close()
