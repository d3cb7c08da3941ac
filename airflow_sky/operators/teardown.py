"""Teardown: stop the cluster (down=True, the default) or keep it for the next job."""

from __future__ import annotations

from typing import Any

from airflow_sky.gang.job import JobHandle
from airflow_sky.infra.ledger import COST_XCOM_KEY, cost_line
from airflow_sky.operators.base import SkyBaseOperator
from airflow_sky.operators.job_spec import JobSpec


class SkyTeardownOperator(SkyBaseOperator):
    """Ends the job's use of the cluster; with `down` (the default) terminates every node once no other
    job holds the cluster (SkyPilot's autodown): a cluster another run still uses is left to the last job's
    teardown. Runs even when the job failed."""

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
        try:
            self._release(handle, hook)
        finally:
            self._push_cost(context, hook)

    def _push_cost(self, context: Any, hook: Any) -> None:
        """The run's cost (XCom `cost`): its cluster's node-hours since the run started times the catalog's
        price, from the fleet ledger; said in the log as the job's cost line."""
        started = getattr(context.get("dag_run"), "start_date", None)
        try:
            cost = hook.cost_since(started.timestamp() if started is not None else None)
        except Exception as e:  # the bill is an aid: a store that does not answer never fails the teardown
            self.log.warning("The run's cost is not known: %s", e)
            return
        if cost is None:
            return
        context["ti"].xcom_push(key=COST_XCOM_KEY, value=cost)
        self.log.info("%s", cost_line(cost))

    def _release(self, handle: JobHandle, hook: Any) -> None:
        name = handle.cluster_name
        release = hook.release_cluster(handle, self.down, self.log.info)
        if not release.terminate:
            self._cancel_an_unfollowed_job(handle)
            # The job has ended: its mounts' uploads finish, the mounts and their credentials go (unless other
            # jobs use the node's mounts), and buckets it created for `persistent: false` mounts are deleted.
            # Where another job keeps a requested down waiting, the last teardown deletes them.
            holders = "; ".join(h.describe() for h in release.holders)
            if release.down_requested:
                self.log.info(
                    "Keeping cluster %s up: %s still uses it. Down is requested: the last of its jobs to "
                    "finish tears it down (and releases this job's buckets then)",
                    name,
                    holders,
                )
                return
            if release.holders:
                hook.release_buckets(handle, self.sky_task, self.log.info, detach=False)
                self.log.info("Keeping cluster %s (down=False); %s still uses it", name, holders)
                return
            hook.release_buckets(handle, self.sky_task, self.log.info)
            self.log.info("Keeping cluster %s (down=False); stop it with: airflow-sky down %s", name, name)
            return
        if release.closing_by is not None:
            self.log.info(
                "Cluster %s is already being torn down by job %d's teardown", name, release.closing_by
            )
        try:
            # The down hooks first: they may save to the mounted buckets, whose uploads finish next.
            hook.run_lifecycle_hooks("down", self.log.info, self.sky_task, handle.job_id)
            # Before the nodes go; with the buckets of jobs whose teardown left the cluster to this one.
            hook.release_buckets(handle, self.sky_task, self.log.info, also=release.deferred)
        finally:
            # A bucket that could not be deleted fails this task, never keeps the nodes.
            self.log.info(
                "Tearing down cluster %s (%d nodes): no other job holds it", name, len(handle.nodes)
            )
            hook.terminate()

    def _cancel_an_unfollowed_job(self, handle: JobHandle) -> None:
        """On a kept cluster, a job that has not ended by now has nobody left to follow it (launch or a follow
        task failed before the job's verdict): stop its ranks rather than leave them running for nobody."""
        state = self.job.state()
        if state is None or state.status.is_terminal:
            return
        reason = "no task of its DAG run follows it any more (an upstream task failed)"
        self.log.warning("Job %d is %s but %s: cancelling it", handle.job_id, state.status.value, reason)
        self.job.cancel_everywhere(reason)
