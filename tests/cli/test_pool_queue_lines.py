"""`jobs queue`'s line per pool submission (client.cli.pool.pool_lines): its jobs by status and the share of
their steps done, from what the queue lists."""

from __future__ import annotations

from airflow_sky.client.cli.pool import pool_lines
from airflow_sky.client.managed_runs import ManagedJob


def _job(job_id: int, status: str, progress: dict[str, int] | None, pool: str | None = "p") -> ManagedJob:
    return ManagedJob(
        job_id=job_id,
        run_id=f"sky-job-{job_id}",
        name="batch",
        status=status,
        recoveries=0,
        num_nodes=1,
        submitted=None,
        duration_s=None,
        infra="local",
        progress=progress,
        pool=pool,
        num_jobs=4,
    )


def test_a_pool_submission_is_summed_up_in_one_line_and_other_jobs_are_left_out() -> None:
    jobs = [
        _job(1, "SUCCEEDED", {"step": 10, "total": 10}),
        _job(2, "RUNNING", {"step": 5, "total": 10}),
        _job(3, "PENDING", None),
        _job(4, "PENDING", None),
        _job(5, "RUNNING", {"step": 1, "total": 2}, pool=None),
    ]
    assert pool_lines(jobs) == [
        "Pool p, batch: 4 job(s): 2 pending, 1 running, 1 succeeded; 75% of their steps (1 done)"
    ]


def test_a_submission_partly_listed_says_how_many_of_it_are_shown() -> None:
    assert pool_lines([_job(1, "RUNNING", None)]) == ["Pool p, batch: 1 of 4 job(s): 1 running (0 done)"]
