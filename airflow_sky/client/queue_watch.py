"""What a launch's job waits for in the cluster's job queue, told to its listeners while it waits.

The provision task waits in the queue (gang.job_queue) and writes what it waits for into its job's record;
this thread reads that record (the one owner of the queue state) and turns each new reason into a `queued`
event, until the job is admitted or the launch ends. The gang core itself publishes nothing.
"""

from __future__ import annotations

import threading

from airflow_sky.client import events
from airflow_sky.errors import SkyError
from airflow_sky.gang import job_queue
from airflow_sky.gang.phases import job_states
from airflow_sky.gang.state import JobStates
from airflow_sky.infra.cluster import Cluster

POLL_S = 1.0


class QueueWatch(threading.Thread):
    """Emit a `queued` event (text: 'Job 2 is PENDING, waiting for job 1 to free nodes 0-1 (RUNNING)',
    data: job_id, cluster_name) for each new reason the job `dag_id`'s provision writes."""

    def __init__(self, cluster: Cluster, dag_id: str, sink: events.Listener) -> None:
        super().__init__(name="airflow-sky-queue-watch", daemon=True)
        self.cluster = cluster
        self.cluster_name = cluster.name
        self.prefix = f"{dag_id}/"
        self.sink = sink
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        said = ""
        job_id: int | None = None
        states: JobStates | None = None
        while not self.stopped.wait(POLL_S):
            try:
                if states is None:
                    states = job_states(self.cluster)
                if job_id is None:
                    job_id = self._find(states)
                    if job_id is None:
                        continue
                state = states.get(job_id)
            except SkyError:
                continue  # not reachable now; the next look may be
            if state is None:
                continue  # its id is given out; its record is written right after
            if state.status.is_terminal or job_queue.is_admitted(state):
                return  # admitted (or ended): the job's own steps take it from here
            reason = job_queue.waiting_reason(state)
            if reason and reason != said:
                said = reason
                self.sink(
                    events.Event(
                        "queued",
                        "provision",
                        text=f"Job {job_id} is PENDING, {reason}",
                        data={"job_id": job_id, "cluster_name": self.cluster_name},
                    )
                )

    def _find(self, states: JobStates) -> int | None:
        """The launch's job id, once its provision registered it (the index maps submit keys to ids)."""
        index = states.index()
        keys = (index.data.get("keys") or {}) if index else {}
        found = [int(job) for key, job in keys.items() if str(key).startswith(self.prefix)]
        return found[0] if found else None
