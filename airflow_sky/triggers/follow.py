"""Watching one rank of a running phase from the triggerer, so a deferred follow task holds no worker slot.

The trigger streams its node's log into the task log and watches the other ranks. It fires as soon as
there is something to act on: its own rank ended, a sibling failed or was lost, or a node stopped
answering. The follow task then resumes on a worker, where the same code as in the non-deferrable path
decides (success, fail-fast, recovery) and, while the job runs on, defers again.

SSH goes through the same paramiko clients as everywhere else, each call in a thread so the triggerer's
event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_sky.clouds.base import Node
from airflow_sky.errors import RemoteError
from airflow_sky.gang import UNREACHABLE_GRACE_S
from airflow_sky.log_tail import LogTail
from airflow_sky.logs import redactor
from airflow_sky.remote import jobs
from airflow_sky.remote.client import NodeClient


class SkyFollowTrigger(BaseTrigger):
    """Fires when rank `rank` of phase job `job_id` (generation `generation`) needs the follow task.

    :param nodes: the phase's nodes (Node.to_dict()), this generation's.
    :param offset: where the task log left off in the rank's log (a line boundary).
    :param secrets: values to redact from log lines (trigger kwargs are encrypted at rest and never
        shown by Airflow's API).
    """

    def __init__(
        self,
        *,
        cluster_name: str,
        infra: str,
        conn_id: str | None,
        nodes: list[dict[str, Any]],
        rank: int,
        job_id: str,
        generation: int,
        offset: int = 0,
        setup: bool = False,
        secrets: dict[str, str] | None = None,
        poll_interval_s: float = 2.0,
        sibling_interval_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.cluster_name = cluster_name
        self.infra = infra
        self.conn_id = conn_id
        self.nodes = nodes
        self.rank = rank
        self.job_id = job_id
        self.generation = generation
        self.offset = offset
        self.setup = setup
        self.secrets = secrets or {}
        self.poll_interval_s = poll_interval_s
        self.sibling_interval_s = sibling_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "cluster_name": self.cluster_name,
                "infra": self.infra,
                "conn_id": self.conn_id,
                "nodes": self.nodes,
                "rank": self.rank,
                "job_id": self.job_id,
                "generation": self.generation,
                "offset": self.offset,
                "setup": self.setup,
                "secrets": self.secrets,
                "poll_interval_s": self.poll_interval_s,
                "sibling_interval_s": self.sibling_interval_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = _Watch(self)
        try:
            while True:
                reason = await asyncio.to_thread(watch.poll)
                if reason is not None:
                    yield TriggerEvent(
                        {"reason": reason, "generation": self.generation, "offset": watch.line_offset}
                    )
                    return
                if not watch.behind:
                    await asyncio.sleep(self.poll_interval_s)
        finally:
            await asyncio.to_thread(watch.close)

    async def on_kill(self) -> None:
        """The deferred task was marked failed or cleared: stop this rank's processes, as on_kill does."""
        await asyncio.to_thread(self._kill)

    def _kill(self) -> None:
        node = next(Node.from_dict(n) for n in self.nodes if int(n["rank"]) == self.rank)
        with _hook(self).client(node) as client:
            jobs.kill_job(client, self.job_id, self.generation, sig=signal.SIGTERM, grace_s=5.0)


def _hook(trigger: SkyFollowTrigger) -> Any:
    from airflow_sky.hooks.cluster import SkyClusterHook

    return SkyClusterHook(trigger.cluster_name, trigger.infra, trigger.conn_id)


class _Watch:
    """The blocking part of the trigger (paramiko), run one poll at a time in a thread."""

    def __init__(self, trigger: SkyFollowTrigger) -> None:
        self.trigger = trigger
        self._stack = contextlib.ExitStack()
        self._clients: dict[int, NodeClient] | None = None
        self._redact = redactor(trigger.secrets.values())
        self._log: LogTail | None = None  # this rank's log, once connected
        self._next_sibling_check = 0.0
        self._unreachable_since: dict[int, float] = {}
        self.behind = False  # more log to read than one poll returned
        self.own_done = False  # this rank exited 0; waiting for the others

    @property
    def line_offset(self) -> int:
        """The end of the last whole line logged: where the resumed task goes on."""
        return self._log.line_offset if self._log is not None else self.trigger.offset

    def clients(self) -> dict[int, NodeClient]:
        if self._clients is None:
            trigger = self.trigger
            nodes = [Node.from_dict(n) for n in trigger.nodes]
            self._clients = self._stack.enter_context(_hook(trigger).clients(nodes, conn_retry_attempts=1))
            self._log = LogTail(
                self._clients[trigger.rank],
                trigger.job_id,
                trigger.generation,
                trigger.setup,
                lambda line: trigger.log.info("%s", self._redact(line)),
                offset=trigger.offset,
                keep=0,
            )
        return self._clients

    def poll(self) -> str | None:
        """One round: log new lines; return why the task must wake up, or None to keep waiting."""
        trigger = self.trigger
        try:
            clients = self.clients()
        except RemoteError:
            return self._unreachable(trigger.rank)
        if not self.own_done:
            reason = self._poll_own()
            if reason is not None or self.behind:
                return reason
        if time.monotonic() < self._next_sibling_check:
            return None
        self._next_sibling_check = time.monotonic() + trigger.sibling_interval_s
        return self._check_siblings(clients)

    def _poll_own(self) -> str | None:
        assert self._log is not None
        rank = self.trigger.rank
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
            if rank == self.trigger.rank:
                continue
            try:
                state = jobs.poll_job(client, self.trigger.job_id, self.trigger.generation, 0, max_bytes=0)
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
        if rank == self.trigger.rank and self._clients is not None:
            self._clients[rank].close()  # reconnect on the next poll
        return None

    def close(self) -> None:
        self._stack.close()
