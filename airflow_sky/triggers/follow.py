"""Following one rank of a running phase from the triggerer, so a deferred follow task holds no worker slot.

The trigger runs the very step the blocking follow task runs (airflow_sky.gang.follow.RankFollower): it
streams its node's log into the task log, reads the job state and, holding the phase's watch lease, probes
every rank and writes the verdict. It fires as soon as the follow task has something to act on (the phase
ended, failed or is relaunched); the task then resumes on a worker, re-reads the same job state and acts
(a relaunch is led from a worker, never from the triggerer), or defers again.

SSH goes through the same paramiko clients as everywhere else, each call in a thread of this module's own
bounded pool (never the event loop's default executor: a few unreachable nodes must not starve other
triggers of threads), and each step has a deadline: a node that does not answer in time wakes the task.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_sky.gang.gang_job import GangJob, RankFollower
from airflow_sky.gang.job import Phase, nodes_of
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.hooks.progress_metrics import progress_gauges
from airflow_sky.task import JobRecovery
from airflow_sky.task.redaction import redactor
from airflow_sky.triggers.task_states import failed_count

# One thread per trigger in flight at most; past that, our triggers queue among themselves.
_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="airflow-sky-trigger")
POLL_DEADLINE_S = 180.0  # one step's SSH calls are bounded by their own timeouts (60 s each) well before
# A trigger never fires sooner than this after it started: Airflow 3.3 fails a resumed task whose deferring
# attempt's exit the scheduler had not processed yet (apache/airflow #66374, #71580, #72716).
MIN_WAIT_S = 15.0


async def _in_thread(call: Callable[[], Any]) -> Any:
    # In this task's context: the triggerer binds the trigger's id in context variables, and only a log
    # line that carries it reaches the task's own log (the node's lines would land in the triggerer's).
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, context.run, call)


class SkyFollowTrigger(BaseTrigger):
    """Fires when rank `rank` of phase `phase` (generation `generation`) of job `job_id` needs its task.

    :param nodes: the phase's nodes (Node.to_dict()), this generation's.
    :param owner: the follow task instance (its watch lease and relaunch claims carry this name).
    :param offset: where the task log left off in the rank's log (a line boundary).
    :param job_recovery: the task's job_recovery (run phase), so a fault is triaged where it is seen.
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
        job_id: int,
        phase: str,
        generation: int,
        owner: str,
        offset: int = 0,
        job_recovery: dict[str, Any] | None = None,
        max_recoveries: int = 3,
        secrets: dict[str, str] | None = None,
        poll_interval_s: float = 2.0,
        min_wait_s: float = MIN_WAIT_S,
    ) -> None:
        super().__init__()
        self.cluster_name = cluster_name
        self.infra = infra
        self.conn_id = conn_id
        self.nodes = nodes
        self.rank = rank
        self.job_id = job_id
        self.phase = phase
        self.generation = generation
        self.owner = owner
        self.offset = offset
        self.job_recovery = job_recovery
        self.max_recoveries = max_recoveries
        self.secrets = secrets or {}
        self.poll_interval_s = poll_interval_s
        self.min_wait_s = min_wait_s

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
                "phase": self.phase,
                "generation": self.generation,
                "owner": self.owner,
                "offset": self.offset,
                "job_recovery": self.job_recovery,
                "max_recoveries": self.max_recoveries,
                "secrets": self.secrets,
                "poll_interval_s": self.poll_interval_s,
                "min_wait_s": self.min_wait_s,
            },
        )

    @property
    def _phase(self) -> Phase:
        return "setup" if self.phase == "setup" else "run"

    @functools.cached_property
    def job(self) -> GangJob:
        """The job, from the hook: built once per trigger (one Cluster and infra driver for all its steps)."""
        hook = SkyClusterHook(self.cluster_name, self.infra, self.conn_id)
        return GangJob(hook.cluster, self.job_id)

    def _follower(self) -> RankFollower:
        redact = redactor(self.secrets.values())
        policy = JobRecovery(**self.job_recovery) if self.job_recovery is not None else None
        triage = GangJob.triage(policy, self.max_recoveries)
        return self.job.follower(
            self._phase,
            self.generation,
            self.rank,
            nodes_of(self.nodes),
            self.owner,
            emit=lambda line: self.log.info("%s", redact(line)),
            triage=triage,
            start_offset=self.offset,
            redact=redact,
            keep_tail=0,
            on_progress=self._gauges() if self._phase == "run" else None,
        )

    def _gauges(self) -> Callable[[dict[str, Any]], None] | None:
        dag_id = self.owner.split("/", 1)[0]  # the follow task instance's name (a DAG id has no `/`)
        return progress_gauges(dag_id, self.cluster_name, self.job_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        follower = await _in_thread(self._follower)
        try:
            while True:
                try:
                    step = await asyncio.wait_for(_in_thread(follower.step), POLL_DEADLINE_S)
                    reason = step.reason if step is not None else None
                except TimeoutError:
                    # The task resumes on a worker, where the follow path decides about the silent node.
                    reason = f"rank {self.rank}'s node did not answer within {POLL_DEADLINE_S:.0f}s"
                except Exception as e:  # a failed trigger fails the task; the follow path can recover
                    reason = f"watching rank {self.rank} failed: {type(e).__name__}: {e}"
                if reason is not None:
                    early = self.min_wait_s - (time.monotonic() - started)
                    if early > 0:
                        await asyncio.sleep(early)
                    yield TriggerEvent(
                        {"reason": reason, "generation": self.generation, "offset": follower.line_offset}
                    )
                    return
                if follower.sibling_check_due():
                    await _in_thread(self._cancel_if_a_sibling_failed)
                if not follower.behind:
                    await asyncio.sleep(self.poll_interval_s)
        finally:
            await _in_thread(follower.close)

    def _cancel_if_a_sibling_failed(self) -> None:
        """As the follow task does (SkyFollowOperator): a sibling failed from outside cancels the job."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return
        self.job.cancel_if_a_sibling_failed(
            lambda: failed_count(ti.dag_id, ti.task_id, ti.run_id), self.log.warning
        )

    async def on_kill(self) -> None:
        """The deferred task was marked failed or cleared: cancel the job, as the task's on_kill does."""
        await _in_thread(self._kill)

    def _kill(self) -> None:
        reason = f"the follow task of rank {self.rank} was killed"
        self.job.cancel_and_kill(reason, self._phase, self.rank, nodes_of(self.nodes), self.generation)
