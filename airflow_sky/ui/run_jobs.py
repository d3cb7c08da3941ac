"""A DAG run's sky jobs and their progress, as the progress view's JSON API answers them.

Each sky_job group's provision task pushed the job's handle (XCom key `handle`) and, when the job names one,
its connection (CONN_ID_XCOM_KEY: an ssh pool's or a non-default cloud connection); the job's progress is read
live through SkyClusterHook and its job object (`GangJob.progress()`), and when the cluster is gone or
unreachable from the final progress XCom (PROGRESS_XCOM_KEY) its collect or head run-follow task pushed.
The metadata DB is read with Airflow's own models, as its core API routes do.
"""

from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.app import API_ROOT_PATH
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_sky.gang.job import JobHandle
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.operators.base import CONN_ID_XCOM_KEY, PROGRESS_XCOM_KEY
from airflow_sky.ui.live_reads import LiveReads
from airflow_sky.ui.sweeps import run_sweeps

log = logging.getLogger(__name__)

HANDLE_XCOM_KEY = "handle"  # operators/provision.py pushes the JobHandle under this key
PROVISION_TASK = "provision"
RUN_FOLLOW_TASK = "run_follow"
# Where a job's final progress may be: collect pushes it, else the head rank's run follow (part of a run
# that never reached collect). The first found wins.
FINAL_TASKS = (("collect", -1), (RUN_FOLLOW_TASK, 0))
# A cloud that does not answer must not hold the view: past this (for all the run's jobs together), a job
# shows its final progress (or none) and its read goes on in the background, on a few threads of its own
# (LiveReads: hung reads cannot take the API server's threads).
LIVE_TIMEOUT_S = 15.0
_live_reads = LiveReads()


class RunNotFound(LookupError):
    """No DAG run `dag_id` / `run_id` in the metadata DB."""


def group_of(task_id: str) -> str:
    """The sky_job TaskGroup id of one of its tasks (`train.provision` -> `train`; "" outside a group)."""
    return task_id.rpartition(".")[0]


def task_in(group: str, task: str) -> str:
    return f"{group}.{task}" if group else task


def log_url(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """The Airflow UI's page of a mapped task instance (its index tab is the log)."""
    parts = (quote(dag_id, safe=""), quote(run_id, safe=""), quote(task_id, safe=""))
    root = API_ROOT_PATH.rstrip("/")
    return f"{root}/dags/{parts[0]}/runs/{parts[1]}/tasks/{parts[2]}/mapped/{map_index}"


def _xcoms(session: Session, dag_id: str, run_id: str, key: str) -> dict[tuple[str, int], Any]:
    rows = session.scalars(
        select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == key)
    )
    return {(row.task_id, row.map_index): XComModel.deserialize_value(row) for row in rows}


def _read_live(handle: JobHandle, with_history: bool, conn_id: str | None) -> dict[str, Any] | None:
    try:
        hook = SkyClusterHook(handle.cluster_name, handle.infra, conn_id)
        return hook.job(handle).progress(with_history=with_history)
    except Exception as err:  # any infra or store failure means "not live": the view shows what remains
        log.debug("progress of job %s on %s not readable live: %s", handle.job_id, handle.cluster_name, err)
        return None


def live_progress(
    jobs: list[tuple[JobHandle, str | None]], with_history: bool, timeout_s: float = LIVE_TIMEOUT_S
) -> list[dict[str, Any] | None]:
    """Each job's progress read now from its cluster's state store (through its conn_id, the connection the
    job named, else the infra's default); None for a job whose cluster or record is gone, or that is not
    read within `timeout_s` in all (the caller falls back to the final XCom)."""
    reads = {
        (handle.cluster_name, handle.job_id, conn_id, with_history): functools.partial(
            _read_live, handle, with_history, conn_id
        )
        for handle, conn_id in jobs
    }
    results = _live_reads.read_all(reads, timeout_s)
    return [results[key] for key in reads]


def found_jobs(session: Session, dag_id: str, run_id: str) -> list[tuple[str, JobHandle, str | None]]:
    """The run's sky jobs: (the sky_job group, the job's handle, the connection it named)."""
    found = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if found is None:
        raise RunNotFound(f"no DAG run {run_id!r} of DAG {dag_id!r}")
    handles = _xcoms(session, dag_id, run_id, HANDLE_XCOM_KEY)
    conn_ids = _xcoms(session, dag_id, run_id, CONN_ID_XCOM_KEY)
    jobs: list[tuple[str, JobHandle, str | None]] = []
    for (task_id, map_index), value in sorted(handles.items()):
        if task_id.rpartition(".")[2] != PROVISION_TASK or not isinstance(value, dict):
            continue
        try:
            handle = JobHandle.from_dict(value)
        except (KeyError, TypeError, ValueError) as err:  # not a sky job's handle: another task's XCom
            log.warning(
                "%s.%s: XCom %r is not a job handle (%s); left out", dag_id, task_id, HANDLE_XCOM_KEY, err
            )
            continue
        conn_id = conn_ids.get((task_id, map_index))
        jobs.append((group_of(task_id), handle, conn_id if isinstance(conn_id, str) else None))
    return jobs


def run_jobs(session: Session, dag_id: str, run_id: str, with_history: bool = True) -> dict[str, Any]:
    """The JSON API's answer for one DAG run (the HTTP contract in docs/progress-view.md)."""
    found_jobs_ = found_jobs(session, dag_id, run_id)
    finals = _xcoms(session, dag_id, run_id, PROGRESS_XCOM_KEY)
    lives = live_progress([(handle, conn_id) for _, handle, conn_id in found_jobs_], with_history)
    jobs = []
    for (group, handle, _), progress in zip(found_jobs_, lives, strict=True):
        source = "live"
        if progress is None:
            final = next(
                (finals[(task_in(group, t), i)] for t, i in FINAL_TASKS if (task_in(group, t), i) in finals),
                None,
            )
            progress, source = (final, "final") if isinstance(final, dict) else (None, "none")
        follow = task_in(group, RUN_FOLLOW_TASK)
        jobs.append(
            {
                "group": group,
                "cluster": handle.cluster_name,
                "infra": handle.infra,
                "job_id": handle.job_id,
                "source": source,
                "progress": progress,
                "log_urls": {
                    str(rank): log_url(dag_id, run_id, follow, rank) for rank in range(handle.num_run_nodes)
                },
            }
        )
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "jobs": jobs,
        "sweeps": run_sweeps(session, dag_id, run_id, jobs),
    }
