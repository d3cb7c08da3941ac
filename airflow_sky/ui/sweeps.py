"""A DAG run's sweeps (dags.sweep) for the progress view: every trial with its params, state, step, ETA and
the compared metric, the best so far and the sweep's total progress; and the sweep's cancel.

A sweep's plan task pushed its manifest (SWEEP_XCOM_KEY): the trials, their params and task groups, the
metric and mode. A trial's state is its tasks' (Airflow's word: pending until its provision ran, running,
succeeded once collect did, failed, cancelled/skipped); its step, ETA and metric are its job's progress,
which run_jobs read already. The summary is a pure function of those.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_sky.gang.job import JobHandle
from airflow_sky.hooks.cluster import SkyClusterHook
from airflow_sky.operators.base import SWEEP_CANCEL_XCOM_KEY, SWEEP_XCOM_KEY

log = logging.getLogger(__name__)

PLAN_TASK = "plan"
_FAILED = {"failed", "upstream_failed"}


def trial_state(task_states: Mapping[str, str | None], group: str) -> str:
    """A trial's state from its tasks' states (task id -> state), SkyPilot's words (pure)."""
    mine = {
        task.rpartition(".")[2]: state
        for task, state in task_states.items()
        if task.rpartition(".")[0] == group
    }
    if mine.get("collect") == "success":
        return "SUCCEEDED"
    if any(state in _FAILED for state in mine.values()):
        return "FAILED"
    if mine.get("provision") == "skipped":
        return "CANCELLED"
    if mine.get("provision") in ("success",) or mine.get("launch") or mine.get("sync"):
        return "RUNNING"
    return "PENDING"


def _over(task_states: Mapping[str, str | None], group: str) -> bool:
    """Every task of the trial's group has ended (none queued, running, deferred or waiting)."""
    active = {"queued", "running", "deferred", "scheduled", "up_for_retry", "up_for_reschedule", "restarting"}
    mine = [state for task, state in task_states.items() if task.rpartition(".")[0] == group]
    return bool(mine) and all(state is not None and state not in active for state in mine)


def _metric(progress: Mapping[str, Any] | None, result: Any, metric: str | None) -> float | None:
    """The trial's latest value of `metric`: its job's progress (any rank's newest), else its result."""
    if metric is None:
        return None
    value = ((progress or {}).get("metrics") or {}).get(metric)
    if value is None and isinstance(result, Mapping):
        value = result.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarize(
    manifest: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    task_states: Mapping[str, str | None],
    results: Mapping[str, Any] | None = None,
    cancelled: str | None = None,
) -> dict[str, Any]:
    """One sweep's summary for the view (pure): trials, best so far, total progress. Once the sweep was
    `cancelled` (the reason), a trial that failed or never started shows CANCELLED."""
    by_group = {job.get("group"): job for job in jobs}
    metric, mode = manifest.get("metric"), manifest.get("mode") or "min"
    trials = []
    steps = totals = 0
    for trial in manifest.get("trials") or ():
        group = str(trial.get("group"))
        job = by_group.get(group) or {}
        progress = job.get("progress") or {}
        step, total = progress.get("step"), progress.get("total")
        if isinstance(step, int) and isinstance(total, int) and total > 0:
            steps, totals = steps + min(step, total), totals + total
        state = trial_state(task_states, group)
        if cancelled and state in ("FAILED", "PENDING", "RUNNING") and _over(task_states, group):
            state = "CANCELLED"
        trials.append(
            {
                "trial": trial.get("trial"),
                "params": trial.get("params") or {},
                "group": group,
                "state": state,
                "cluster": job.get("cluster"),
                "job_id": job.get("job_id"),
                "step": step,
                "total": total,
                "eta_s": progress.get("eta_s"),
                "value": _metric(progress, (results or {}).get(group), metric),
                "history": _rank0_history(progress, metric),
            }
        )
    scored = [t for t in trials if t["value"] is not None]
    pick = min if mode == "min" else max
    best = pick(scored, key=lambda t: t["value"])["trial"] if scored else None
    done = sum(1 for t in trials if t["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"))
    return {
        "sweep": manifest.get("sweep"),
        "metric": metric,
        "mode": mode,
        "pool": manifest.get("pool"),
        "trials": trials,
        "best": best,
        "finished": done,
        "cancelled": cancelled,
        "percent": round(100.0 * steps / totals, 1) if totals else None,
    }


def _rank0_history(progress: Mapping[str, Any], metric: str | None) -> list[list[float]]:
    """[step, value] of `metric` as the head rank reported it: the sweep chart's line for this trial."""
    if metric is None:
        return []
    for rank in progress.get("ranks") or ():
        if rank.get("rank") == 0:
            return [
                [float(p[1]), float(p[3][metric])]
                for p in rank.get("history") or ()
                if len(p) > 3 and isinstance(p[3], Mapping) and isinstance(p[3].get(metric), (int, float))
            ]
    return []


def _xcoms(session: Session, dag_id: str, run_id: str, key: str, task_suffix: str = "") -> dict[str, Any]:
    query = select(XComModel).where(
        XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == key
    )
    if task_suffix:  # only those tasks' values: a run's other tasks may return anything, of any size
        query = query.where(XComModel.task_id.endswith(task_suffix))
    return {row.task_id: XComModel.deserialize_value(row) for row in session.scalars(query)}


def run_sweeps(
    session: Session, dag_id: str, run_id: str, jobs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The summaries of every sweep of the run (none: an empty list)."""
    manifests = [
        m for m in _xcoms(session, dag_id, run_id, SWEEP_XCOM_KEY).values() if isinstance(m, Mapping)
    ]
    if not manifests:
        return []
    rows = session.execute(
        select(TaskInstance.task_id, TaskInstance.state).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.map_index == -1
        )
    )
    states: dict[str, str | None] = {
        task_id: None if state is None else str(state) for task_id, state in rows
    }
    results = {
        task_id.rpartition(".")[0]: value
        for task_id, value in _xcoms(session, dag_id, run_id, "return_value", ".collect").items()
    }
    cancelled = _xcoms(session, dag_id, run_id, SWEEP_CANCEL_XCOM_KEY)
    summaries = []
    for manifest in manifests:
        reason = cancelled.get(f"{manifest.get('sweep')}.{PLAN_TASK}")
        summaries.append(
            summarize(manifest, jobs, states, results, reason if isinstance(reason, str) else None)
        )
    return summaries


def cancel_sweep(
    session: Session,
    dag_id: str,
    run_id: str,
    sweep: str,
    user: str,
    jobs: Sequence[tuple[str, JobHandle, str | None]],
) -> dict[str, Any]:
    """Cancel a sweep: its trials not yet started never start (their provision reads the mark and skips),
    and every trial's job that has not ended is cancelled on its cluster (its ranks stopped; its follow
    tasks fail, its teardown runs: a pool's worker is free again, a trial's own cluster goes down)."""
    manifests = _xcoms(session, dag_id, run_id, SWEEP_XCOM_KEY)
    plan_task = f"{sweep}.{PLAN_TASK}"
    manifest = manifests.get(plan_task)
    if not isinstance(manifest, Mapping):
        raise LookupError(f"no sweep {sweep!r} in run {run_id!r} of DAG {dag_id!r}")
    reason = f"cancelled by {user} from the progress view"
    XComModel.set(
        SWEEP_CANCEL_XCOM_KEY, reason, dag_id=dag_id, task_id=plan_task, run_id=run_id, session=session
    )
    session.commit()  # before any job is cancelled: a trial that starts now must see the mark
    groups = {str(t.get("group")) for t in manifest.get("trials") or ()}
    cancelled = []
    for group, handle, conn_id in jobs:
        if group not in groups:
            continue
        try:
            gang_job = SkyClusterHook(handle.cluster_name, handle.infra, conn_id).job(handle)
            if gang_job.cancel_everywhere(reason):
                cancelled.append(group)
        except Exception as err:  # one unreachable cluster must not keep the others' trials running
            log.warning(
                "sweep %s: could not cancel job %s on %s: %s", sweep, handle.job_id, handle.cluster_name, err
            )
    return {"sweep": sweep, "reason": reason, "cancelled": sorted(cancelled)}
