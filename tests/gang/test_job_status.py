"""One status vocabulary: the job-state record names a managed job's status, and where the record cannot be
read (the REST client, a launch whose cluster is gone) the run's states and the launch's outcome name it in
the same words."""

from __future__ import annotations

import pytest

from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.job_status import (
    ManagedStatus,
    mirror,
    mirrored_recoveries,
    of_launch,
    of_record,
    of_run,
)
from airflow_sky.gang.recovery import Action
from airflow_sky.gang.state_record import JobState, Relaunch


@pytest.mark.parametrize(
    ("status", "word"),
    [
        (JobStatus.INIT, "PENDING"),
        (JobStatus.SETTING_UP, "STARTING"),
        (JobStatus.RUNNING, "RUNNING"),
        (JobStatus.FAILED_SETUP, "FAILED_SETUP"),
        (JobStatus.CANCELLED, "CANCELLED"),
    ],
)
def test_the_records_status_in_managed_words(status: JobStatus, word: str) -> None:
    assert of_record(JobState(job_id=1, status=status)) == word


def test_a_claimed_relaunch_is_recovering_until_the_job_ended() -> None:
    claim = Relaunch(target=1, action=next(iter(Action)), reason="rank 1 lost")
    assert of_record(JobState(job_id=1, status=JobStatus.RUNNING, relaunch=claim)) == "RECOVERING"
    assert of_record(JobState(job_id=1, status=JobStatus.FAILED, relaunch=claim)) == "FAILED"


def test_the_mirror_carries_the_word_and_the_recoveries() -> None:
    pushed = mirror(ManagedStatus.RECOVERING, 2)
    assert pushed == {"status": "RECOVERING", "generation": 2}
    assert of_run("running", False, [("launch", "success")], pushed) == "RECOVERING"
    assert mirrored_recoveries(pushed) == 2 and mirrored_recoveries(None) == 0


@pytest.mark.parametrize(
    ("run_state", "cancelled", "steps", "word"),
    [
        ("queued", False, [], "PENDING"),
        ("running", False, [], "PENDING"),
        ("running", False, [("provision", "running")], "STARTING"),
        ("running", False, [("provision", "success"), ("launch", "success")], "RUNNING"),
        ("success", False, [], "SUCCEEDED"),
        ("failed", False, [("setup_follow", "failed")], "FAILED_SETUP"),
        ("failed", False, [("spec", "failed")], "FAILED_PRECHECKS"),
        ("failed", False, [("run_follow", "failed")], "FAILED"),
        ("running", True, [], "CANCELLING"),
        ("failed", True, [], "CANCELLED"),
    ],
)
def test_a_runs_states_in_managed_words(
    run_state: str, cancelled: bool, steps: list[tuple[str, str]], word: str
) -> None:
    assert of_run(run_state, cancelled, steps) == word


def test_a_launchs_outcome_in_the_records_words() -> None:
    assert of_launch(True, {}, []) is JobStatus.SUCCEEDED
    assert of_launch(False, {0: 0, 1: 3}, ["rank 1 failed"]) is JobStatus.FAILED_SETUP
    assert of_launch(False, {0: 0}, ["Job cancelled"]) is JobStatus.CANCELLED
    assert of_launch(False, {0: 0}, ["rank 0 failed with exit code 1"]) is JobStatus.FAILED
