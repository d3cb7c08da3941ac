"""Teardown: stop the cluster (down=True, the default) or keep it for the next job."""

from __future__ import annotations

from typing import Any

from airflow_sky.gang.cluster_jobs import ClusterJobs
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import job_states
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.operators.job_spec import JobSpec


class SkyTeardownOperator(SkyBaseOperator):
    """Terminates every node of the cluster when `down` is true; runs even when the job failed."""

    ui_color = "#ffcdd2"

    def __init__(self, *, down: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down = down

    def adopt_job_spec(self, spec: JobSpec) -> None:
        self.down = spec.down

    def execute(self, context: Any) -> None:
        self.mask_secrets()  # (and a managed job's spec adopted: whether the cluster goes down)
        handle = self.handle()
        hook = self.hook(handle)
        if not self.down:
            self._cancel_an_unfollowed_job(handle)
            # The job has ended: its mounts' uploads finish, the mounts and their credentials go, and the
            # buckets it created for `persistent: false` mounts are deleted; the nodes stay.
            hook.release_buckets(handle, self.sky_task, self.log.info)
            self.log.info(
                "Keeping cluster %s (down=False); stop it with: airflow-sky down %s",
                handle.cluster_name,
                handle.cluster_name,
            )
            return
        try:
            hook.release_buckets(handle, self.sky_task, self.log.info)  # before the nodes go
        finally:
            # A bucket that could not be deleted fails this task, never keeps the nodes.
            self.log.info("Tearing down cluster %s (%d nodes)", handle.cluster_name, len(handle.nodes))
            hook.terminate()

    def _cancel_an_unfollowed_job(self, handle: JobHandle) -> None:
        """On a kept cluster, a job that has not ended by now has nobody left to follow it (launch or a follow
        task failed before the job's verdict): stop its ranks rather than leave them running for nobody."""
        cluster = self.hook(handle).cluster
        state = job_states(cluster).get(handle.job_id)
        if state is None or state.status.is_terminal:
            return
        reason = "no task of its DAG run follows it any more (an upstream task failed)"
        self.log.warning("Job %d is %s but %s: cancelling it", handle.job_id, state.status.value, reason)
        ClusterJobs(cluster).cancel([handle.job_id], reason=reason)
