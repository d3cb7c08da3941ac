"""sky_sweep's DAG, as parsed: one sky_job group per trial with its params and job rank as envs, the plan
first, max_parallel lanes, the results task after every trial; and what it and sky_job(pool=) refuse."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG

from airflow_sky import SpecError, Task, sky_job, sky_sweep
from airflow_sky.dags.sweep import best_trial

TRIAL = Task(name="t", num_nodes=2, run="echo $LR")


def test_each_trial_is_a_job_group_with_its_params_and_rank_and_lanes_bound_the_parallelism() -> None:
    with DAG("shape", schedule=None) as dag:
        sky_sweep(TRIAL, params=[{"LR": 0.1}, {"LR": 0.01}, {"LR": 0.001}], pool="p", max_parallel=2)
    envs = [dag.get_task(f"t_sweep.trial_{i}.provision").sky_task.envs for i in range(3)]
    assert envs == [
        {"LR": lr, "SKYPILOT_JOB_RANK": str(i), "SKYPILOT_NUM_JOBS": "3"}
        for i, lr in enumerate(("0.1", "0.01", "0.001"))
    ]
    assert TRIAL.envs == {}  # the caller's task is left as it was
    provision = dag.get_task("t_sweep.trial_2.provision")
    assert provision.upstream_task_ids == {"t_sweep.plan", "t_sweep.trial_0.teardown"}
    assert dag.get_task("t_sweep.trial_1.provision").upstream_task_ids == {"t_sweep.plan"}
    assert provision.sky_pool == "p" and provision.must_exist and not provision.down
    results = dag.get_task("t_sweep.results")
    assert {f"t_sweep.trial_{i}.teardown" for i in range(3)} <= results.upstream_task_ids
    assert results.trigger_rule == "all_done"
    manifest = dag.get_task("t_sweep.plan").op_args[0]
    assert manifest["trials"][1] == {"trial": 1, "params": {"LR": "0.01"}, "group": "t_sweep.trial_1"}
    collect = dag.get_task("t_sweep.trial_1.collect")
    assert collect.run_follow_task_id == "t_sweep.trial_1.run_follow"  # the prefixed id inside the sweep
    assert collect.output_partition == "trial-1" and collect.output_extra["params"] == {"LR": 0.01}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": []}, "sky_sweep: params: give at least one parameter set"),
        ({"params": ["LR=1"]}, r"sky_sweep: params\[0\]: must be a mapping of env names to values"),
        ({"params": [{"1LR": "x"}]}, r"sky_sweep: params\[0\]: "),
        ({"params": [{"LR": 1}], "max_parallel": 0}, "sky_sweep: max_parallel: a whole number >= 1, got 0"),
        (
            {"params": [{"LR": 1}], "cluster_name": "c"},
            "sky_sweep: cluster_name: every trial needs a cluster",
        ),
        ({"params": [{"LR": 1}], "mode": "best"}, "sky_sweep: mode: 'min' or 'max'"),
    ],
)
def test_a_bad_sweep_is_refused_when_the_dag_is_parsed(kwargs: dict, message: str) -> None:
    with DAG("bad", schedule=None), pytest.raises(SpecError, match=message):
        sky_sweep(TRIAL, **kwargs)


def test_a_pool_job_may_not_name_a_cluster_or_bring_a_setup() -> None:
    with DAG("bad_pool", schedule=None):
        with pytest.raises(
            SpecError, match="pool= runs the job on the pool's workers: give no launch=, cluster_name"
        ):
            sky_job(TRIAL, pool="p", cluster_name="c")
        with pytest.raises(
            SpecError, match=r"sky_job\(pool='p'\): setup: a job for a pool may not have setup"
        ):
            sky_job(Task(run="x", setup="pip install y"), pool="p")
        with pytest.raises(SpecError, match="pool name 'P' is invalid"):
            sky_job(TRIAL, pool="P")


def test_the_best_trial_is_picked_by_the_metric_and_mode_from_those_that_report_it() -> None:
    results = [
        {"trial": 0, "result": {"loss": 2.0}},
        {"trial": 1, "result": None},
        {"trial": 2, "result": {"loss": 1.0}},
        {"trial": 3, "result": {"loss": "nan?"}},
    ]
    assert best_trial(results, "loss")["trial"] == 2
    assert best_trial(results, "loss", mode="max")["trial"] == 0
    assert best_trial(results, "accuracy") is None
