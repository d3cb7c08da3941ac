"""Sweeps: one task over a list of parameter sets, each set a trial (a whole multi-node job), in one DAG.

    with DAG("lr_sweep", schedule=None) as dag:
        sweep = sky_sweep(
            Task.from_yaml("train.yaml"),
            params=[{"LR": lr} for lr in ("1e-3", "3e-4", "1e-4", "3e-5")],
            pool="gpt-pool",                     # or no pool: each trial gets a cluster of its own
            max_parallel=2,
            outlets=[Asset("s3://team/ckpt/gpt")],
        )
        pick_best(sweep_results(sweep))

Each trial is a sky_job TaskGroup of its own (`<sweep>.trial_<i>`), so the grid has a row per trial and
per node, and a trial's retries and recoveries are its own. (Airflow maps a task group over a list, but not
a task that is itself mapped inside a mapped group: a trial's per-node phases are mapped over its nodes, so
the trials are one group each, built when the DAG is parsed from the list given.) Trial `i` gets its
parameters as envs and SKYPILOT_JOB_RANK=i / SKYPILOT_NUM_JOBS=len(params), SkyPilot's names for a pool's
job ranks. The `results` task hands every trial's outcome to downstream tasks, failed trials included.

How many trials run at once: on a pool, at most its workers (the others wait PENDING in its queue); with
`max_parallel`, trial `i` also starts only after trial `i - max_parallel` ended, whatever its outcome —
which is also what lets `airflow dags test`, which runs one task at a time, get through a sweep on a pool
smaller than the sweep.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import TaskGroup, XComArg, task

from airflow_sky.dags.job import sky_job
from airflow_sky.dags.task_path import resolve_task_path
from airflow_sky.errors import JobFailed, SpecError
from airflow_sky.operators.base import PROGRESS_XCOM_KEY, SWEEP_XCOM_KEY
from airflow_sky.task import Task
from airflow_sky.task.env_values import checked_env_values
from airflow_sky.task.pool import job_rank_envs

log = logging.getLogger(__name__)
RESULTS_TASK_ID = "results"
PLAN_TASK_ID = "plan"
TRIAL_GROUP = "trial_{index}"


def trial_envs(params: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Each trial's envs: its parameters (as strings) and its SKYPILOT_JOB_RANK / SKYPILOT_NUM_JOBS (pure)."""
    if not params:
        raise SpecError("sky_sweep: params: give at least one parameter set (a list of env mappings)")
    envs = []
    for i, one in enumerate(params):
        if not isinstance(one, Mapping):
            raise SpecError(f"sky_sweep: params[{i}]: must be a mapping of env names to values, got {one!r}")
        try:
            values = checked_env_values(one, "envs")
        except SpecError as e:
            raise SpecError(f"sky_sweep: params[{i}]: {e}") from None
        envs.append({**values, **job_rank_envs(i, len(params))})
    return envs


def sky_sweep(
    task: Task | str | os.PathLike[str],
    params: Sequence[Mapping[str, Any]],
    *,
    pool: str | None = None,
    max_parallel: int | None = None,
    group_id: str | None = None,
    outlets: Sequence[Any] | None = None,
    metric: str | None = None,
    mode: str = "min",
    **job_kwargs: Any,
) -> TaskGroup:
    """A sweep of `task` over `params` (one env mapping per trial), as a TaskGroup in the current DAG.

    :param pool: run every trial on a free worker of this pool (sky_job's pool=), else each trial launches
        (and, with the default down=True, tears down) a cluster of its own.
    :param max_parallel: at most this many trials at once (trial i waits for trial i - max_parallel).
    :param outlets: assets each trial's success emits an event for, with the trial, its params and its last
        step as the event's extra and `trial-<i>` as its partition key.
    :param metric: the progress metric (or result key) trials are compared by, `mode` "min" or "max": the
        progress view shows it per trial and marks the best so far.
    :param job_kwargs: passed to every trial's sky_job (infra, artifacts, deferrable, run_timeout, ...).
    """
    if max_parallel is not None and (isinstance(max_parallel, bool) or max_parallel < 1):
        raise SpecError(f"sky_sweep: max_parallel: a whole number >= 1, got {max_parallel!r}")
    if mode not in ("min", "max"):
        raise SpecError(f"sky_sweep: mode: 'min' or 'max', got {mode!r}")
    if "cluster_name" in job_kwargs:
        raise SpecError(
            "sky_sweep: cluster_name: every trial needs a cluster of its own (or a pool's worker)"
        )
    base = task if isinstance(task, Task) else Task.from_yaml(resolve_task_path(task))
    envs = trial_envs(params)
    group_id = group_id or f"{base.name or 'sky'}_sweep".replace("-", "_")
    with TaskGroup(group_id=group_id) as sweep:
        manifest = {
            "sweep": sweep.group_id,
            "metric": metric,
            "mode": mode,
            "pool": pool,
            "trials": [
                {
                    "trial": i,
                    "params": {str(k): str(v) for k, v in params[i].items()},  # as the trial's envs
                    "group": f"{sweep.group_id}.{TRIAL_GROUP.format(index=i)}",
                }
                for i in range(len(envs))
            ],
        }
        plan = plan_sweep.override(task_id=PLAN_TASK_ID)(manifest)
        trials: list[TaskGroup] = []
        for i, env in enumerate(envs):
            trial = sky_job(
                base.with_envs(env),
                group_id=TRIAL_GROUP.format(index=i),
                pool=pool,
                outlets=outlets,
                output_extra={"sweep": group_id, "trial": i, "params": dict(params[i])},
                output_partition=f"trial-{i}",
                sweep_plan_task=f"{sweep.group_id}.{PLAN_TASK_ID}",
                **job_kwargs,
            )
            plan >> _first_task(trial)
            if max_parallel is not None and i >= max_parallel:
                # The earlier trial's last task (teardown) ends whatever its job's outcome.
                _last_task(trials[i - max_parallel]) >> _first_task(trial)
            trials.append(trial)
        results = gather_results.override(task_id=RESULTS_TASK_ID)(
            [f"{trial.group_id}.collect" for trial in trials], [dict(p) for p in params]
        )
        for trial in trials:
            # Every trial's end, its teardown included (a group's leaves leave its teardown out).
            trial >> results
            _last_task(trial) >> results
    return sweep


@task
def plan_sweep(manifest: dict[str, Any], **context: Any) -> None:
    """The sweep's trials and their params, where the progress view and a cancel find them (XCom)."""
    context["ti"].xcom_push(key=SWEEP_XCOM_KEY, value=manifest)


@task(trigger_rule="all_done")
def gather_results(
    collect_task_ids: list[str], trial_params: list[dict[str, Any]], **context: Any
) -> list[dict[str, Any]]:
    """Every trial's outcome, in trial order: its number, params, whether it succeeded, the head's result and
    its final progress (None for a trial that failed or reported none). Fails only when every trial failed."""
    ti = context["ti"]
    outcomes = []
    for i, task_id in enumerate(collect_task_ids):
        outcomes.append(
            {
                "trial": i,
                "params": trial_params[i],
                # collect pushes `ranks` once the trial succeeded, whatever its ranks returned
                "succeeded": ti.xcom_pull(task_ids=task_id, key="ranks") is not None,
                "result": ti.xcom_pull(task_ids=task_id),
                "progress": ti.xcom_pull(task_ids=task_id, key=PROGRESS_XCOM_KEY),
            }
        )
    failed = [o["trial"] for o in outcomes if not o["succeeded"]]
    if failed and len(failed) == len(outcomes):
        raise JobFailed(f"every trial of the sweep failed (trials {failed}): no result to hand on")
    if failed:
        log.warning("Trials %s of the sweep failed; the others' results are handed on", failed)
    return outcomes


def sweep_results(sweep: TaskGroup) -> XComArg:
    """The sweep's `results` task output (a list of {trial, params, result}), for a downstream task."""
    return sweep.children[f"{sweep.group_id}.{RESULTS_TASK_ID}"].output  # type: ignore[attr-defined]


def best_trial(
    results: Sequence[Mapping[str, Any]], metric: str, mode: str = "min"
) -> Mapping[str, Any] | None:
    """The trial whose result has the lowest (`mode="min"`) or highest `metric`; None when none reported it."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    scored = [
        r
        for r in results
        if isinstance(r.get("result"), Mapping) and isinstance(r["result"].get(metric), (int, float))
    ]
    if not scored:
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda r: r["result"][metric])


def _first_task(group: TaskGroup) -> Any:
    return group.children[f"{group.group_id}.provision"]


def _last_task(group: TaskGroup) -> Any:
    return group.children[f"{group.group_id}.teardown"]
