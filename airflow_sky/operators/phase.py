"""Setup and run, each a pair of mapped tasks: a quick start (detached) and a follow (log + gang watch).

Starting every node before any task waits is what lets `airflow dags test`, which runs task instances one
after another, run N nodes in the time of one, and keeps torchrun's rank 0 from waiting on a rank 1 that
has not started.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import conf

from airflow_sky.errors import JobFailed
from airflow_sky.gang.follow import GangFollower, Relaunch
from airflow_sky.gang.job import JobHandle, JobStatus, Phase
from airflow_sky.gang.phases import kill_rank, read_result, record_failure, start_rank
from airflow_sky.gang.recovery import (
    DEFAULT_MAX_RECOVERIES,
    RECOVERY_XCOM_KEY,
    Decision,
    RecoveryState,
    decide,
    latest_announced,
)
from airflow_sky.gang.relaunch import claim_lead, current_nodes, relaunch
from airflow_sky.infra.cluster import Cluster
from airflow_sky.operators.base import RESULT_XCOM_KEY, SkyBaseOperator, pull_announcements
from airflow_sky.task.redaction import sensitive_values, task_redactor
from airflow_sky.triggers import SkyFollowTrigger

_WAIT_FOR_LEADER_S = 1800.0


class _PhaseOperator(SkyBaseOperator):
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
        start = start_rank(self.hook(handle).cluster, self.sky_task, handle, self.phase, rank)
        if start.lost:
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
    """Streams one node's log into the task log and ends with the node's exit code.

    Also watches the other nodes of the phase: when one fails, the rest are killed (exit code 137) and every
    follow task fails naming the rank and exit code that caused it. In the run phase, a lost node (or an
    exit code the task's job_recovery allows) relaunches the job instead: the head rank's follow task leads
    (airflow_sky.gang.relaunch), the others follow the new generation. Returns the JSON the job wrote to
    $AIRFLOW_SKY_XCOM_DIR/return.json on its node (None when absent) in the run phase.

    :param max_recoveries: relaunches allowed for lost nodes and recover_on_exit_codes (default 3).
    :param deferrable: wait in the triggerer while the rank runs (airflow_sky.triggers.SkyFollowTrigger),
        holding no worker slot; the task resumes on a worker only to act on an ending, a failure or a lost
        node. Default: `[operators] default_deferrable`.
    """

    ui_color = "#b3e5fc"

    def __init__(
        self,
        *,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_recoveries = max_recoveries
        self.deferrable = deferrable

    def execute(self, context: Any) -> Any:
        self.mask_secrets()
        if self.script is None:
            return None
        handle = self.handle()
        return self._follow(context, handle, self._announced_state(context, handle), offset=0)

    def resume(self, context: Any, event: dict[str, Any]) -> Any:
        """Back from the triggerer: something happened (or the trigger moved); act on it, or defer again."""
        self.mask_secrets()
        handle = self.handle()
        state = self._announced_state(context, handle)
        self.log.info("Resumed: %s", event.get("reason", "the trigger fired"))
        # A newer generation than the trigger's was announced: its log starts at 0.
        offset = int(event.get("offset", 0)) if int(event.get("generation", -1)) == state.generation else 0
        return self._follow(context, handle, state, offset)

    def _follow(self, context: Any, handle: JobHandle, state: RecoveryState, offset: int) -> Any:
        rank = int(self.node["rank"])
        cluster = self.hook(handle).cluster
        while True:
            phase_ranks = {p.rank for p in handle.phase_nodes(self.phase)}
            nodes = [n for n in current_nodes(handle, state) if n.rank in phase_ranks]
            self._following = (cluster, nodes, state.generation)
            with cluster.clients(nodes, conn_retry_attempts=1) as clients:
                follower = GangFollower(
                    job_id=handle.remote_job_id(self.phase),
                    generation=state.generation,
                    rank=rank,
                    clients=clients,
                    emit=self._log,
                    setup=self.phase == "setup",
                    failed_status=self.failed_status.value,
                    # The queue lives on the current head: a recovery may have replaced the first one.
                    on_failure=functools.partial(
                        record_failure, clients[nodes[0].rank], handle, self.failed_status
                    ),
                    triage=self._triage(context, cluster, handle, state, nodes)
                    if self.phase == "run"
                    else None,
                    start_offset=offset,
                    until_quiet=self.deferrable,
                    redact=self._redact,
                )
                try:
                    result = follower.run()
                except Relaunch as relaunching:
                    state = self._next_generation(context, cluster, handle, state, relaunching)
                    offset = 0
                    continue
                except JobFailed as e:
                    self.log.error("%s: %s", e.status, e)
                    raise
                if result.running:
                    self._defer(context, handle, nodes, state, result.offset)
                if self.phase != "run":
                    return None
                value = read_result(clients[rank], handle, self._redact)
                # Under a key of its own too, pushed even when None: collect reads every rank's in one
                # request (a per-index pull of a missing return value logs an error).
                context["ti"].xcom_push(key=RESULT_XCOM_KEY, value={"rank": rank, "value": value})
                return value

    def _defer(
        self, context: Any, handle: JobHandle, nodes: list[Any], state: RecoveryState, offset: int
    ) -> None:
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
                job_id=handle.remote_job_id(self.phase),
                generation=state.generation,
                offset=offset,
                setup=self.phase == "setup",
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
        """The task was killed (or its run marked failed): stop this rank's processes on its node."""
        following = getattr(self, "_following", None)
        if following is None:
            return
        cluster, nodes, generation = following
        rank = int(self.node["rank"])
        node = next((n for n in nodes if n.rank == rank), None)
        if node is None:
            return
        self.log.info("Killing rank %d's processes on %s", rank, node.internal_ip)
        kill_rank(cluster, self.handle().remote_job_id(self.phase), node, generation)

    # ---- recovery ----------------------------------------------------------------------------------

    def _announced_state(self, context: Any, handle: JobHandle) -> RecoveryState:
        """The latest generation the leader announced (none yet: the provisioned one)."""
        if self.phase != "run":
            return RecoveryState(generation=handle.generation)
        announced = pull_announcements(context, self.task_id)
        state = latest_announced(announced)
        return state if state.generation >= handle.generation else RecoveryState(generation=handle.generation)

    def _triage(
        self, context: Any, cluster: Cluster, handle: JobHandle, state: RecoveryState, nodes: list[Any]
    ) -> Any:
        def triage(rank: int, code: int | None) -> Decision | None:
            if self._announced_state(context, handle).generation > state.generation:
                return None  # the leader relaunched already: follow the new generation
            bad = cluster.unhealthy_ranks(nodes)
            return decide(bad, code, self.sky_task.job_recovery, state, self.max_recoveries)

        return triage

    def _next_generation(
        self, context: Any, cluster: Cluster, handle: JobHandle, state: RecoveryState, relaunching: Relaunch
    ) -> RecoveryState:
        if relaunching.decision is not None and claim_lead(cluster, handle, state, int(self.node["rank"])):
            new_state = relaunch(cluster, self.sky_task, handle, state, relaunching.decision, self._log)
            context["ti"].xcom_push(key=RECOVERY_XCOM_KEY, value=new_state.to_dict())
            return new_state
        self.log.info("Waiting for the head rank's task to relaunch the job (%s)", relaunching)
        deadline = time.monotonic() + _WAIT_FOR_LEADER_S
        while time.monotonic() < deadline:
            announced = self._announced_state(context, handle)
            if announced.generation > state.generation:
                return announced
            time.sleep(2.0)
        raise JobFailed(
            f"rank {self.node['rank']}: no relaunch after {_WAIT_FOR_LEADER_S:.0f}s ({relaunching})",
            status=self.failed_status.value,
        )

    # ---- output ------------------------------------------------------------------------------------

    @functools.cached_property
    def _redact(self) -> Callable[[str], str]:
        return task_redactor(self.sky_task)

    def _log(self, line: str) -> None:
        """Into this task's log: its own node's lines and its own messages."""
        self.log.info("%s", self._redact(line))
