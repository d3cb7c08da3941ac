"""A job's status in one vocabulary: SkyPilot's words, and the rules that name a job's status from what
of it can be read. No other module maps states to these words.

The job-state record (gang.state_record.JobState) is the source. A cluster job shows the record's own
status (JobStatus: INIT, PENDING, SETTING_UP, RUNNING and the ends; `airflow-sky queue`); a managed job
shows SkyPilot's managed-job words (ManagedStatus; `airflow-sky jobs queue`), the record's by `of_record`.
Where the record cannot be read, the same words come, by the rules here, from what can be:
- a managed job seen through Airflow's REST API (the record lives with the infra, and the REST client holds
  no credentials for it): its run's and task instances' states, and the record's mirror that the head's
  run follow task pushes as an XCom (`mirror`): `of_run`;
- a launch's end in the CLI, after its teardown took the record with the cluster: the exit codes and
  failures its follow tasks reported (client.engine's recorder keeps them from their events): `of_launch`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.state_record import JobState


class ManagedStatus(enum.StrEnum):
    """A managed job's status, as SkyPilot's `sky jobs queue` names it."""

    PENDING = "PENDING"
    STARTING = "STARTING"  # provisioning, syncing, setting up
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"  # a relaunch replaces lost nodes or restarts the run
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_PRECHECKS = "FAILED_PRECHECKS"  # the deployment refused the run's spec
    FAILED_CONTROLLER = "FAILED_CONTROLLER"  # the run failed before its spec task ran
    CANCELLED = "CANCELLED"


_OF_RECORD: dict[JobStatus, ManagedStatus] = {
    JobStatus.INIT: ManagedStatus.PENDING,
    JobStatus.PENDING: ManagedStatus.PENDING,
    JobStatus.SETTING_UP: ManagedStatus.STARTING,
    JobStatus.RUNNING: ManagedStatus.RUNNING,
    JobStatus.SUCCEEDED: ManagedStatus.SUCCEEDED,
    JobStatus.FAILED: ManagedStatus.FAILED,
    JobStatus.FAILED_SETUP: ManagedStatus.FAILED_SETUP,
    JobStatus.CANCELLED: ManagedStatus.CANCELLED,
}

# The steps of a job's TaskGroup (dags.job; `spec` is dags.managed's) whose task-instance states stand in
# for the record where it cannot be read.
_STARTING_STEPS = ("spec", "provision", "sync", "setup_follow", "launch")


def of_record(state: JobState) -> ManagedStatus:
    """The record's status in SkyPilot's managed-job words: a claimed relaunch is RECOVERING."""
    if state.relaunch is not None and not state.status.is_terminal:
        return ManagedStatus.RECOVERING
    return _OF_RECORD[state.status]


def mirror(status: ManagedStatus, generation: int) -> dict[str, Any]:
    """What the head's run follow task pushes for the REST client: the status and the generation, which is
    the recoveries so far."""
    return {"status": status.value, "generation": generation}


def mirrored_recoveries(mirrored: Mapping[str, Any] | None) -> int:
    return int((mirrored or {}).get("generation", 0))


def of_run(
    run_state: str | None,
    cancelled: bool,
    steps: Iterable[tuple[str, str | None]],
    mirrored: Mapping[str, Any] | None = None,
) -> ManagedStatus:
    """A managed job's status from its Airflow run: the run's state, whether `jobs cancel` marked it,
    (step, state) of each task instance (step: the task id's last part), and the record's mirror."""
    steps = list(steps)

    def any_in(step: str, state: str) -> bool:
        return (step, state) in steps

    if cancelled:
        return ManagedStatus.CANCELLED if run_state in ("success", "failed") else ManagedStatus.CANCELLING
    if run_state == "queued":
        return ManagedStatus.PENDING
    if run_state == "success":
        return ManagedStatus.SUCCEEDED
    if run_state == "failed":
        if any_in("setup_follow", "failed"):
            return ManagedStatus.FAILED_SETUP
        if any_in("spec", "failed"):
            return ManagedStatus.FAILED_PRECHECKS
        return ManagedStatus.FAILED
    if mirrored and mirrored.get("status") == ManagedStatus.RECOVERING:
        return ManagedStatus.RECOVERING
    if any_in("launch", "success"):
        return ManagedStatus.RUNNING
    started = any(step in _STARTING_STEPS and state for step, state in steps)
    return ManagedStatus.STARTING if started else ManagedStatus.PENDING


def of_launch(
    succeeded: bool, setup_exit_codes: Mapping[int, int | None], failures: Iterable[str]
) -> JobStatus:
    """A launch's job status as `airflow-sky queue` names it, from what the launch saw (the cluster, and
    the record with it, may be gone)."""
    if succeeded:
        return JobStatus.SUCCEEDED
    if any(code not in (0, None) for code in setup_exit_codes.values()):
        return JobStatus.FAILED_SETUP
    if any("cancelled" in failure.lower() for failure in failures):
        return JobStatus.CANCELLED
    return JobStatus.FAILED
