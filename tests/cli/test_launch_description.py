"""The launch description crosses a process boundary as JSON and comes back equal: the task (secrets
included, which only a pipe or a 0600 file carries) and every option."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_sky.task import Task
from airflow_sky.task.launch import Launch, LaunchOptions


def test_a_launch_comes_back_from_json_as_it_went() -> None:
    task = Task(name="train", run="echo $X", envs={"X": "1"}, num_nodes=2)
    task.update_secrets({"TOKEN": "t0k3n"})
    options = LaunchOptions(
        cluster_name="c1",
        infra="local",
        down=False,
        must_exist=True,
        pipeline_name="p",
        pipeline_index=1,
        pipeline_task_names=("a", "b"),
        pipeline_task_ids=("id-a", "id-b"),
    )
    back = Launch.from_json(Launch(task, options).to_json())
    assert back.options == options
    assert back.task.to_dict() == task.to_dict()
    assert back.task.secrets == {"TOKEN": "t0k3n"}
    assert back.task.base_dir == task.base_dir


def test_the_description_is_immutable() -> None:
    launch = Launch(Task(run="true"), LaunchOptions(cluster_name="c1"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.options = LaunchOptions(cluster_name="c2")  # type: ignore[misc]
