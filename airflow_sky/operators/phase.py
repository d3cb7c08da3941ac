"""Setup and run, each a pair of mapped tasks: a quick start (detached) and a follow (log + gang watch).

Starting every node before any task waits is what lets `airflow dags test`, which runs task instances one
after another, run N nodes in the time of one, and keeps torchrun's rank 0 from waiting on a rank 1 that
has not started.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_sky import events
from airflow_sky.errors import JobFailed
from airflow_sky.gang import KILLED_EXIT_CODE, GangFollower
from airflow_sky.job import JobHandle, Phase
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.remote import jobs, queue
from airflow_sky.remote.shell import JOBS_DIR


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
        node_env = hook.phase_env(self.sky_task, handle, self.phase, rank)
        with hook.client(handle.node(rank)) as client:
            if self.phase == "setup" and rank == handle.nodes[0].rank:
                queue.update_record(client, handle.job_id, status=queue.JobStatus.SETTING_UP)
            start = jobs.start_job(
                client, handle.remote_job_id(self.phase), self.script, node_env.env, handle.generation
            )
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
    follow task fails naming the rank and exit code that caused it. The run phase's follow task returns the
    JSON the job wrote to $AIRFLOW_SKY_XCOM_DIR/return.json on its node (None when absent).
    """

    ui_color = "#b3e5fc"

    def execute(self, context: Any) -> Any:
        self.mask_secrets()
        handle = self.handle()
        rank = int(self.node["rank"])
        if self.script is None:
            return None
        hook = self.hook(handle)
        nodes = handle.phase_nodes(self.phase)
        job_id = handle.remote_job_id(self.phase)
        with hook.clients(nodes) as clients:
            follower = GangFollower(
                job_id=job_id,
                generation=handle.generation,
                rank=rank,
                clients=clients,
                emit=self._emit,
                setup=self.phase == "setup",
                failed_status=self.failed_status.value,
                on_failure=lambda r, c: self._record_failure(clients[nodes[0].rank], handle, r, c),
            )
            try:
                follower.run()
            except JobFailed as e:
                self.log.error("%s: %s", e.status, e)
                code = e.exit_code if e.rank == rank or e.exit_code == KILLED_EXIT_CODE else None
                events.publish(events.Event("exit", self.step, rank, str(e), exit_code=code))
                raise
            events.publish(events.Event("exit", self.step, rank, exit_code=0))
            if self.phase == "run":
                return self._return_value(clients[rank], handle, rank)
        return None

    def _emit(self, line: str) -> None:
        self.log.info("%s", line)
        events.publish(events.Event("log", self.step, int(self.node["rank"]), line))

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
