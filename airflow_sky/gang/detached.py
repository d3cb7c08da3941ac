"""Drive a job to its end with no Airflow run behind it: what a launch hands over when its user detaches.

Ctrl-C in `airflow-sky launch` ends the in-process DAG run wherever it is: between two rank starts, while
setup runs, before the run started. SkyPilot's job goes on to its end on the cluster whatever phase it was
in, so the launcher hands the job to a background process that does what the DAG's remaining tasks would:
start every rank of each phase not yet started (starts are idempotent), and watch each phase to its verdict
(the same watcher as the follow tasks': fail-fast, and the job's end written into the job state). Recovery
from a lost node needs the DAG run's follow tasks: a detached job that loses a node fails.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobHandle, JobStatus, Phase
from airflow_sky.gang.phases import job_states, start_rank
from airflow_sky.gang.relaunch import current_handle
from airflow_sky.gang.watch_lease import WatchHold
from airflow_sky.gang.watcher import PhaseWatcher
from airflow_sky.infra.cluster import Cluster
from airflow_sky.task import Task

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


def drive(
    cluster: Cluster,
    task: Task,
    handle: JobHandle,
    phases: Sequence[Phase],
    poll_interval_s: float = POLL_INTERVAL_S,
) -> JobStatus:
    """Run the job's remaining `phases` to their end; returns the job's status as the job state has it."""
    states = job_states(cluster)
    owner = f"detached-{os.getpid()}"
    for phase in phases:
        state = states.require(handle.job_id)
        if state.status.is_terminal:
            log.info("Job %s is %s already: nothing left to drive", handle.job_id, state.status.value)
            return state.status
        if (task.setup if phase == "setup" else task.run) is None:
            continue
        current = current_handle(handle, state)
        if phase == "run" and state.status is not JobStatus.RUNNING:
            states.update(handle.job_id, lambda s: js.set_status(s, JobStatus.RUNNING, time.time()))
        nodes = list(current.phase_nodes(phase))
        for node in nodes:
            start = start_rank(cluster, task, current, phase, node.rank)
            if start.started:
                log.info("Started the %s on rank %d", phase, node.rank)
        generation = current.generation if phase == "run" else handle.generation
        watcher = PhaseWatcher(cluster, states, handle.job_id, phase, generation, nodes, log=log.info)
        try:
            verdict = _watch(states, watcher, owner, poll_interval_s)
        finally:
            watcher.close()
        if verdict != "SUCCEEDED":
            break
    final = states.require(handle.job_id)
    log.info("Job %s %s", handle.job_id, final.status.value)
    return final.status


def _watch(states: js.JobStates, watcher: PhaseWatcher, owner: str, poll_interval_s: float) -> str:
    """Hold the phase's watch until it has a verdict (a follow task left running may hold it meanwhile)."""
    hold = WatchHold(states, watcher.job_id, watcher.key, owner)
    while True:
        state, held = hold.hold(states.require(watcher.job_id))
        if held:
            state = watcher.round(state)
        phase = state.phase(watcher.phase, watcher.generation)
        if phase.verdict == "SUCCEEDED" or (phase.verdict == "FAILED" and phase.killed):
            return phase.verdict
        if (state.status.is_terminal and phase.verdict is None) or state.relaunch is not None:
            return state.status.value
        time.sleep(poll_interval_s)
