"""Launch: the barrier between setup and run. Checks the job's nodes are up, then starts the run on every
one of them at once (detached; the run follow tasks stream and judge it)."""

from __future__ import annotations

from typing import Any

from airflow_sky.gang.job import JobHandle, JobStatus
from airflow_sky.operators.base import SkyBaseOperator


class SkyLaunchOperator(SkyBaseOperator):
    """Starts the run's script on each of the run's nodes (the first num_nodes of the cluster, head first),
    side by side over SSH, and returns those nodes; the run follow tasks map over them.

    Starting every rank from one task, instead of one start task per node, saves a scheduler hop and N task
    instances, and every rank still runs before any follow task waits (a gang job never waits for a worker
    slot). Idempotent: a retry attaches to the ranks already started.

    :param start_run: start the run here (default). False leaves the nodes idle: for DAGs that start each
        rank with their own SkyStartOperator tasks.
    """

    ui_color = "#c5cae9"

    def __init__(self, *, start_run: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_run = start_run

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.mask_secrets()
        handle = self.handle()
        self.job.check_run_nodes()
        self.job.set_status(JobStatus.RUNNING)
        self.log.info(
            "Launching the run on %d nodes: %s",
            handle.num_run_nodes,
            ", ".join(n.internal_ip for n in handle.run_nodes),
        )
        if self.start_run:
            self._start(handle)
        return [n.to_dict() for n in handle.run_nodes]

    def _start(self, handle: JobHandle) -> None:
        if self.sky_task.run is None:
            self.log.info("The task has no run section; nothing to start")
            return
        for start in self.job.start_all(self.sky_task, "run", [n.rank for n in handle.run_nodes]):
            if start.skipped:
                self.log.info("Nothing started on rank %d: %s", start.rank, start.skipped)
            elif start.lost:
                # Preempted between provisioning and now: recovering is the run follow tasks' job.
                self.log.warning(
                    "The node of rank %d is gone (%s): the run follow tasks will recover the job",
                    start.rank,
                    handle.node(start.rank).internal_ip,
                )
            else:
                verb = "Started" if start.started else "Attached to"
                self.log.info("%s the run on rank %d (pid %s)", verb, start.rank, start.pid)
