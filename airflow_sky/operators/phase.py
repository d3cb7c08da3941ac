"""Setup and run, each a pair of mapped tasks: a quick start (detached) and a follow (log + gang watch).

Starting every node before any task waits is what lets `airflow dags test`, which runs task instances one
after another, run N nodes in the time of one, and keeps torchrun's rank 0 from waiting on a rank 1 that
has not started.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

from airflow.sdk import conf

from airflow_sky import events
from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang import KILLED_EXIT_CODE, GangFollower, Relaunch
from airflow_sky.job import JobHandle, Phase
from airflow_sky.logs import redactor
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.recovery import (
    DEFAULT_MAX_RECOVERIES,
    RECOVERY_XCOM_KEY,
    Decision,
    RecoveryState,
    decide,
    latest_announced,
)
from airflow_sky.relaunch import RECOVERY_COUNT_ENV, claim_lead, current_nodes, relaunch, unhealthy_ranks
from airflow_sky.remote import jobs, queue
from airflow_sky.remote.shell import JOBS_DIR
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
    def failed_status(self) -> queue.JobStatus:
        return queue.JobStatus.FAILED_SETUP if self.phase == "setup" else queue.JobStatus.FAILED


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
            return {"rank": rank, "pid": None, "started": False}
        hook = self.hook(handle)
        env = hook.phase_env(self.sky_task, handle, self.phase, rank).env
        if self.phase == "run":
            env[RECOVERY_COUNT_ENV] = str(handle.generation)
        try:
            with hook.client(handle.node(rank)) as client:
                if self.phase == "setup" and rank == handle.nodes[0].rank:
                    queue.update_record(client, handle.job_id, status=queue.JobStatus.SETTING_UP)
                start = jobs.start_job(
                    client, handle.remote_job_id(self.phase), self.script, env, handle.generation
                )
        except RemoteError:
            if self.phase != "run" or rank not in unhealthy_ranks(hook, [handle.node(rank)]):
                raise
            # Preempted between provisioning and now: recovering is the run follow tasks' job.
            self.log.warning(
                "The node of rank %d is gone (%s): the run follow tasks will recover the job",
                rank,
                handle.node(rank).internal_ip,
            )
            return {"rank": rank, "pid": None, "started": False, "lost": True}
        self.log.info(
            "%s %s on rank %d (pid %s)",
            "Started" if start.started else "Attached to",
            self.phase,
            rank,
            start.pid,
        )
        return {"rank": rank, "pid": start.pid, "started": start.started}


class SkyFollowOperator(_PhaseOperator):
    """Streams one node's log into the task log and ends with the node's exit code.

    Also watches the other nodes of the phase: when one fails, the rest are killed (exit code 137) and every
    follow task fails naming the rank and exit code that caused it. In the run phase, a lost node (or an
    exit code the task's job_recovery allows) relaunches the job instead: the head rank's follow task leads
    (airflow_sky.relaunch), the others follow the new generation. Returns the JSON the job wrote to
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
        hook = self.hook(handle)
        while True:
            phase_ranks = {p.rank for p in handle.phase_nodes(self.phase)}
            nodes = [n for n in current_nodes(handle, state) if n.rank in phase_ranks]
            self._following = (hook, nodes, state.generation)
            with hook.clients(nodes, conn_retry_attempts=1) as clients:
                follower = GangFollower(
                    job_id=handle.remote_job_id(self.phase),
                    generation=state.generation,
                    rank=rank,
                    clients=clients,
                    emit=self._log,
                    publish=functools.partial(self._publish_node_line, handle, state.generation),
                    tail_siblings=events.has_listeners(),
                    setup=self.phase == "setup",
                    failed_status=self.failed_status.value,
                    on_failure=functools.partial(self._record_failure, clients[nodes[0].rank], handle),
                    triage=self._triage(context, hook, handle, state, nodes) if self.phase == "run" else None,
                    start_offset=offset,
                    until_quiet=self.deferrable,
                )
                try:
                    result = follower.run()
                except Relaunch as relaunching:
                    state = self._next_generation(context, hook, handle, state, relaunching)
                    offset = 0
                    continue
                except JobFailed as e:
                    self.log.error("%s: %s", e.status, e)
                    code = e.exit_code if e.rank == rank or e.exit_code == KILLED_EXIT_CODE else None
                    events.publish(events.Event("exit", self.step, rank, str(e), exit_code=code))
                    raise
                if result.running:
                    self._defer(handle, nodes, state, result.offset)
                events.publish(events.Event("exit", self.step, rank, exit_code=0))
                if self.phase == "run":
                    return self._return_value(clients[rank], handle, rank)
            return None

    def _defer(self, handle: JobHandle, nodes: list[Any], state: RecoveryState, offset: int) -> None:
        self.log.info("Rank %s is running: waiting in the triggerer (no worker slot held)", self.node["rank"])
        self.defer(
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
                secrets=dict(self.sky_task.secrets),
            ),
            method_name="resume",
        )

    def on_kill(self) -> None:
        """The task was killed (or its run marked failed): stop this rank's processes on its node."""
        following = getattr(self, "_following", None)
        if following is None:
            return
        hook, nodes, generation = following
        rank = int(self.node["rank"])
        node = next((n for n in nodes if n.rank == rank), None)
        if node is None:
            return
        self.log.info("Killing rank %d's processes on %s", rank, node.internal_ip)
        with hook.client(node) as client:
            jobs.kill_job(client, self.handle().remote_job_id(self.phase), generation, grace_s=5.0)

    # ---- recovery ----------------------------------------------------------------------------------

    def _announced_state(self, context: Any, handle: JobHandle) -> RecoveryState:
        """The latest generation the leader announced (none yet: the provisioned one)."""
        if self.phase != "run":
            return RecoveryState(generation=handle.generation)
        announced = context["ti"].xcom_pull(
            task_ids=self.task_id, map_indexes=list(range(handle.num_run_nodes)), key=RECOVERY_XCOM_KEY
        )
        state = latest_announced(announced)
        return state if state.generation >= handle.generation else RecoveryState(generation=handle.generation)

    def _triage(
        self, context: Any, hook: Any, handle: JobHandle, state: RecoveryState, nodes: list[Any]
    ) -> Any:
        def triage(rank: int, code: int | None) -> Decision | None:
            if self._announced_state(context, handle).generation > state.generation:
                return None  # the leader relaunched already: follow the new generation
            bad = unhealthy_ranks(hook, nodes)
            return decide(bad, code, self.sky_task.job_recovery, state, self.max_recoveries)

        return triage

    def _next_generation(
        self, context: Any, hook: Any, handle: JobHandle, state: RecoveryState, relaunching: Relaunch
    ) -> RecoveryState:
        if relaunching.decision is not None and claim_lead(hook, handle, state, int(self.node["rank"])):
            new_state = relaunch(hook, self.sky_task, handle, state, relaunching.decision, self._emit)
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
        return redactor(self.sky_task.secrets.values())

    def _log(self, line: str) -> None:
        """Into this task's log: its own node's lines and its own messages."""
        self.log.info("%s", self._redact(line))

    def _emit(self, line: str) -> None:
        self._log(line)
        events.publish(events.Event("log", self.step, int(self.node["rank"]), self._redact(line)))

    def _publish_node_line(
        self, handle: JobHandle, generation: int, rank: int, number: int, line: str
    ) -> None:
        events.publish_line(
            (handle.cluster_name, handle.job_id, self.step, generation, rank),
            number,
            events.Event("log", self.step, rank, self._redact(line)),
        )

    def _record_failure(self, head: Any, handle: JobHandle, rank: int, code: int) -> None:
        queue.update_record(
            head, handle.job_id, status=self.failed_status, failed_rank=rank, failed_exit_code=code
        )

    def _return_value(self, client: Any, handle: JobHandle, rank: int) -> Any:
        job_id = handle.remote_job_id("run")
        raw = jobs.read_xcom(client, job_id)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            path = f"~/{JOBS_DIR}/{job_id}/xcom/return.json"
            raise JobFailed(
                f"rank {rank} ({client.node.internal_ip}): {path} is not valid JSON: {e}", rank=rank
            ) from e
