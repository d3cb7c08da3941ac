"""Watching one rank of a running phase from the triggerer, so a deferred follow task holds no worker slot.

The trigger streams its node's log into the task log and watches the other ranks. It fires as soon as
there is something to act on: its own rank ended, a sibling failed or was lost, or a node stopped
answering. The follow task then resumes on a worker, where the same code as in the non-deferrable path
decides (success, fail-fast, recovery) and, while the job runs on, defers again.

SSH goes through the same paramiko clients as everywhere else, each call in a thread of this module's own
bounded pool (never the event loop's default executor: a few unreachable nodes must not starve other
triggers of threads), and each poll has a deadline: a node that does not answer in time wakes the task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_sky.gang.phases import kill_rank
from airflow_sky.gang.watch import RankWatch
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.infra.base import Node
from airflow_sky.task.redaction import redactor

# One thread per trigger in flight at most; past that, our triggers queue among themselves.
_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="airflow-sky-trigger")
POLL_DEADLINE_S = 180.0  # one poll's SSH calls are bounded by their own timeouts (60 s each) well before


async def _in_thread(call: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, call)


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

    def _watch(self) -> RankWatch:
        redact = redactor(self.secrets.values())
        return RankWatch(
            self._hook().cluster,
            [Node.from_dict(n) for n in self.nodes],
            self.rank,
            self.job_id,
            self.generation,
            self.offset,
            self.setup,
            emit=lambda line: self.log.info("%s", redact(line)),
            sibling_interval_s=self.sibling_interval_s,
        )

    def _hook(self) -> SkyClusterHook:
        return SkyClusterHook(self.cluster_name, self.infra, self.conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = self._watch()
        try:
            while True:
                try:
                    reason = await asyncio.wait_for(_in_thread(watch.poll), POLL_DEADLINE_S)
                except TimeoutError:
                    # The task resumes on a worker, where the follow path decides about the silent node.
                    reason = f"rank {self.rank}'s node did not answer within {POLL_DEADLINE_S:.0f}s"
                except Exception as e:  # a failed trigger fails the task; the follow path can recover
                    reason = f"watching rank {self.rank} failed: {type(e).__name__}: {e}"
                if reason is not None:
                    yield TriggerEvent(
                        {"reason": reason, "generation": self.generation, "offset": watch.line_offset}
                    )
                    return
                if not watch.behind:
                    await asyncio.sleep(self.poll_interval_s)
        finally:
            await _in_thread(watch.close)

    async def on_kill(self) -> None:
        """The deferred task was marked failed or cleared: stop this rank's processes, as on_kill does."""
        await _in_thread(self._kill)

    def _kill(self) -> None:
        node = next(Node.from_dict(n) for n in self.nodes if int(n["rank"]) == self.rank)
        kill_rank(self._hook().cluster, self.job_id, node, self.generation)
