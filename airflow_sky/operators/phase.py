"""The per-rank tasks of setup and run: the follow task (one per rank: its node's log, the job state, the
phase's verdict) and the start task (one rank's script, detached).

sky_job starts every rank before any follow task waits (setup from the sync tasks, the run from the launch
task): that is what lets `airflow dags test`, which runs task instances one after another, run N nodes in
the time of one, and keeps torchrun's rank 0 from waiting on a rank 1 that has not started.
SkyStartOperator serves DAGs that start each rank as a mapped task of its own. Both work the job through
the hook's job object (SkyBaseOperator.job, gang.gang_job.GangJob).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import conf

from airflow_sky.gang.gang_job import GangJob, RankFollower, Step, Triage, Wake
from airflow_sky.gang.job import JobHandle, JobStatus, Phase
from airflow_sky.gang.job_progress import final_metrics
from airflow_sky.gang.job_status import ManagedStatus, mirror, of_record
from airflow_sky.gang.recovery import DEFAULT_MAX_RECOVERIES
from airflow_sky.gang.state import JobStates
from airflow_sky.hooks.progress_metrics import progress_gauges
from airflow_sky.operators.base import (
    JOB_STATUS_XCOM_KEY,
    PROGRESS_XCOM_KEY,
    RESULT_XCOM_KEY,
    SkyBaseOperator,
)
from airflow_sky.operators.links import SkyNodeConsoleLink
from airflow_sky.task.redaction import sensitive_values, task_redactor
from airflow_sky.triggers import SkyFollowTrigger
from airflow_sky.triggers.follow import MIN_WAIT_S

POLL_INTERVAL_S = 0.5
# Follow in the worker this long before deferring: a short phase then never defers. Airflow 3.3 can fail a
# task whose trigger fires before the scheduler has processed the deferring attempt's exit (apache/airflow
# #66374, #71580, #72716); the trigger's own minimum wait (SkyFollowTrigger.min_wait_s) covers the rest.
DEFER_AFTER_S = 30.0


class _PhaseOperator(SkyBaseOperator):
    operator_extra_links = (SkyNodeConsoleLink(),)

    def __init__(self, *, phase: Phase, node: dict[str, Any] | Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if phase not in ("setup", "run"):
            raise ValueError(f"phase must be 'setup' or 'run', got {phase!r}")
        self.phase: Phase = phase
        self.node = node

    @property
    def script(self) -> str | None:
        return self.sky_task.setup if self.phase == "setup" else self.sky_task.run

    @property
    def failed_status(self) -> JobStatus:
        return JobStatus.FAILED_SETUP if self.phase == "setup" else JobStatus.FAILED


class SkyStartOperator(_PhaseOperator):
    """Starts the phase's script on one node, detached, with that node's env; returns at once.

    Idempotent: a retry (same job id and generation) attaches to the running script. Returns
    {"rank", "pid", "started"}.
    """

    ui_color = "#e1f5fe"

    def execute(self, context: Any) -> dict[str, Any]:
        self.mask_secrets()
        handle = self.handle()
        rank = int(self.node["rank"])
        if self.script is None:
            self.log.info("The task has no %s section; nothing to start on rank %d", self.phase, rank)
        start = self.job.start(self.sky_task, self.phase, rank)
        if start.skipped:
            self.log.info("Nothing started on rank %d: %s", rank, start.skipped)
        elif start.lost:
            # Preempted between provisioning and now: recovering is the run follow tasks' job.
            self.log.warning(
                "The node of rank %d is gone (%s): the run follow tasks will recover the job",
                rank,
                handle.node(rank).internal_ip,
            )
        elif self.script is not None:
            self.log.info(
                "%s %s on rank %d (pid %s)",
                "Started" if start.started else "Attached to",
                self.phase,
                rank,
                start.pid,
            )
        return start.to_dict()


class SkyFollowOperator(_PhaseOperator):
    """Streams one node's log into the task log and ends with the phase's verdict for that node.

    The follow tasks of a phase share one watcher (gang.watcher: whichever of them holds its lease reads
    every rank's exit and writes the verdict into the job state); each task reads its own node and that
    record. When a rank fails, the rest are killed (exit code 137) and every follow task fails naming the
    rank and exit code that caused it. In the run phase, a lost node (or an exit code the task's
    job_recovery allows) relaunches the job instead: one follow task leads by compare-and-swap on the job
    state (gang.relaunch), the others follow the new generation. Returns the JSON the job wrote to
    $AIRFLOW_SKY_XCOM_DIR/return.json on its node (None when absent) in the run phase.

    :param max_recoveries: relaunches allowed for lost nodes and recover_on_exit_codes (default 3).
    :param deferrable: wait in the triggerer while the rank runs (airflow_sky.triggers.SkyFollowTrigger),
        holding no worker slot; the task resumes on a worker only to act on an ending, a failure or a lost
        node. Default: `[operators] default_deferrable`.
    :param defer_after_s: with `deferrable`, follow in the worker this long first: a phase that ends sooner
        never defers (a short phase is where Airflow's resume-after-defer race bites).
    :param trigger_min_wait_s: the trigger fires no sooner than this after it started (see MIN_WAIT_S).
    """

    ui_color = "#b3e5fc"

    def __init__(
        self,
        *,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        defer_after_s: float = DEFER_AFTER_S,
        trigger_min_wait_s: float = MIN_WAIT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_recoveries = max_recoveries
        self.deferrable = deferrable
        self.defer_after_s = defer_after_s
        self.trigger_min_wait_s = trigger_min_wait_s

    def execute(self, context: Any) -> Any:
        self.mask_secrets()
        if self.script is None:
            return None
        handle = self.handle()
        return self._follow(context, handle, self._generation(handle), offset=0)

    def resume(self, context: Any, event: dict[str, Any]) -> Any:
        """Back from the triggerer: something happened (or the trigger moved); act on it, or defer again."""
        self.mask_secrets()
        handle = self.handle()
        generation = self._generation(handle)
        self.log.info("Resumed: %s", event.get("reason", "the trigger fired"))
        # A newer generation than the trigger's runs now: its log starts at 0.
        offset = int(event.get("offset", 0)) if int(event.get("generation", -1)) == generation else 0
        return self._follow(context, handle, generation, offset, deferred_before=True)

    def _generation(self, handle: JobHandle) -> int:
        return self.job.generation(self.phase)

    def lease_owner(self, context: Any) -> str:
        """Who holds a watch lease or leads a relaunch: this task instance, whatever its try (a retry resumes)."""
        ti = context["ti"]
        return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{getattr(ti, 'map_index', -1)}"

    def _follow(
        self, context: Any, handle: JobHandle, generation: int, offset: int, deferred_before: bool = False
    ) -> Any:
        rank = int(self.node["rank"])
        job = self.job
        owner = self.lease_owner(context)
        started = time.monotonic()
        gauges = (
            progress_gauges(context["ti"].dag_id, job.cluster.name, job.job_id)
            if self.phase == "run"
            else None
        )
        while True:
            nodes = job.phase_nodes(self.phase, job.state())
            self._following = (job.cluster, nodes, generation, job.states, job.job_id)
            follower = job.follower(
                self.phase,
                generation,
                rank,
                nodes,
                owner,
                emit=self._log,
                triage=self._triage() if self.phase == "run" else GangJob.triage(None),
                start_offset=offset,
                redact=self._redact,
                on_progress=gauges,
            )
            try:
                step = self._until_step(context, follower, handle, started, deferred_before)
                if step.wake is Wake.RELAUNCH:
                    self.log.info("%s", step.reason)
                    self._push_job_status(context, ManagedStatus.RECOVERING, generation)  # the claim woke it
                    state = job.relaunch(self.sky_task, generation, owner, self._log)
                    generation, offset = state.generation, 0
                    self._push_job_status(context, of_record(state), generation)
                    continue
                follower.release_watch()
                if self.phase == "run" and rank == 0:
                    self._push_progress(context, follower)
                if step.wake is Wake.FAILED:
                    assert step.error is not None
                    self.log.error("%s: %s", step.error.status, step.error)
                    raise step.error
                if self.phase != "run":
                    return None
                value = job.read_result(follower.own, self._redact)
            finally:
                follower.close()
            # Under a key of its own too, pushed even when None: collect reads every rank's in one request
            # (a per-index pull of a missing return value logs an error).
            context["ti"].xcom_push(key=RESULT_XCOM_KEY, value={"rank": rank, "value": value})
            return value

    def _push_progress(self, context: Any, follower: RankFollower) -> None:
        """The head's follow task keeps the job's last progress in XCom when the run ends, succeeded or
        failed (collect pushes it again once every rank wrote its last report); nothing when none came."""
        follower.flush_progress()
        try:
            doc = self.job.progress(with_history=False)
        except Exception as error:  # the job's own outcome matters more than its progress
            self.log.warning("The job's progress could not be read: %s", error)
            return
        if doc is not None and doc["reported_ranks"]:
            context["ti"].xcom_push(key=PROGRESS_XCOM_KEY, value=final_metrics(doc))

    def _push_job_status(self, context: Any, status: ManagedStatus, generation: int) -> None:
        """The record's mirror that `airflow-sky jobs queue` reads over the REST API (the record itself lives
        with the infra): RECOVERING while a relaunch runs, the record's status after it, and the generation
        (= recoveries so far)."""
        context["ti"].xcom_push(key=JOB_STATUS_XCOM_KEY, value=mirror(status, generation))

    def _until_step(
        self, context: Any, follower: RankFollower, handle: JobHandle, started: float, deferred_before: bool
    ) -> Step:
        def each_round(follower: RankFollower) -> None:
            if follower.sibling_check_due():
                self._cancel_if_a_sibling_failed(context, follower.states, handle.job_id)
            waited = time.monotonic() - started
            if self.deferrable and not follower.behind and (deferred_before or waited >= self.defer_after_s):
                offset, generation = follower.line_offset, follower.generation
                nodes = list(follower.watcher.nodes.values())
                follower.close()
                self._defer(context, handle, nodes, generation, offset)

        return follower.run(POLL_INTERVAL_S, each_round)

    def _cancel_if_a_sibling_failed(self, context: Any, states: JobStates, job_id: int) -> None:
        ti = context["ti"]
        GangJob(self.job.cluster, job_id, states=states).cancel_if_a_sibling_failed(
            lambda: ti.get_ti_count(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], states=["failed"]
            ),
            self.log.warning,
        )

    def _defer(self, context: Any, handle: JobHandle, nodes: list[Any], generation: int, offset: int) -> None:
        self.log.info("Rank %s is running: waiting in the triggerer (no worker slot held)", self.node["rank"])
        self.defer(
            # The phase's deadline holds across deferrals: what is left of execution_timeout since the start.
            timeout=self._time_left(context),
            trigger=SkyFollowTrigger(
                cluster_name=handle.cluster_name,
                infra=handle.infra,
                conn_id=self.conn_id,
                nodes=[n.to_dict() for n in nodes],
                rank=int(self.node["rank"]),
                job_id=handle.job_id,
                phase=self.phase,
                generation=generation,
                owner=self.lease_owner(context),
                offset=offset,
                job_recovery=self.sky_task.job_recovery.to_dict() if self.phase == "run" else None,
                max_recoveries=self.max_recoveries,
                min_wait_s=self.trigger_min_wait_s,
                secrets=sensitive_values(self.sky_task),
            ),
            method_name="resume",
        )

    def _time_left(self, context: Any) -> timedelta | None:
        if self.execution_timeout is None:
            return None
        started = getattr(context["ti"], "start_date", None) or datetime.now(UTC)
        return max(self.execution_timeout - (datetime.now(UTC) - started), timedelta(seconds=1))

    def on_kill(self) -> None:
        """The task was killed (marked failed, or past its timeout): the job is cancelled, never relaunched.

        Writing CANCELLED into the job state makes the phase's watcher stop every rank; this rank is
        stopped here too, at once.
        """
        following = getattr(self, "_following", None)
        if following is None:
            return
        cluster, nodes, generation, states, job_id = following
        rank = int(self.node["rank"])
        self.log.info("Task killed: cancelling job %s (every rank is stopped)", job_id)
        reason = f"the follow task of rank {rank} was killed"
        GangJob(cluster, job_id, states=states).cancel_and_kill(reason, self.phase, rank, nodes, generation)

    # ---- recovery ----------------------------------------------------------------------------------

    def _triage(self) -> Triage:
        return GangJob.triage(self.sky_task.job_recovery, self.max_recoveries)

    # ---- output ------------------------------------------------------------------------------------

    @functools.cached_property
    def _redact(self) -> Callable[[str], str]:
        return task_redactor(self.sky_task)

    def _log(self, line: str) -> None:
        """Into this task's log: its own node's lines and its own messages."""
        self.log.info("%s", self._redact(line))
