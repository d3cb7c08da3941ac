"""The door: a task opens one Cluster through its one hook, and works the job through one GangJob."""

from __future__ import annotations

from typing import Any

from airflow_sky import Task
from airflow_sky.gang.phases import register_job
from airflow_sky.hooks import cluster as hook_module
from airflow_sky.infra.registry import open_cluster


def test_a_follow_task_opens_one_cluster_and_one_job_object_for_all_it_does(local_cluster, monkeypatch):
    from airflow_sky.operators.phase import SkyFollowOperator

    name, nodes, _ = local_cluster(2)
    task = Task(name="door", num_nodes=2, run="true")
    handle = register_job(open_cluster(name, "local"), task, nodes, submit_key="door")
    opened: list[tuple[Any, ...]] = []

    def counting_open(*args: Any) -> Any:
        opened.append(args)
        return open_cluster(*args)

    monkeypatch.setattr(hook_module, "open_cluster", counting_open)
    # As provision pushes it: the handle names the job, the job state has its nodes.
    operator = SkyFollowOperator(
        task_id="run_follow",
        sky_task=task,
        phase="run",
        node={"rank": 1},
        cluster=handle.to_dict(nodes=False),
    )
    # What a follow task asks before it follows: its job, the generation, the current nodes.
    assert operator.handle().nodes == handle.nodes
    assert operator._generation(operator.handle()) == 0
    assert operator.latest_handle({}).nodes == handle.nodes
    assert [n.rank for n in operator.job.phase_nodes("run", operator.job.state())] == [0, 1]
    assert operator.hook(operator.handle()).job(operator.handle()) is operator.job
    assert len(opened) == 1  # one hook, one Cluster (one infra driver, one cloud session) per task
