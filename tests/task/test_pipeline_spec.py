"""Pipeline files read the way SkyPilot reads them (`sky/utils/dag_utils.py`): header, names, execution."""

from __future__ import annotations

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.task import SpecWarning, Task
from airflow_sky.task.pipeline import PARALLEL, SERIAL, Pipeline


def test_a_header_document_names_the_pipeline_and_unnamed_tasks_are_numbered_after_it():
    pipeline = Pipeline.from_yaml_str("name: pipe\n---\nname: train\nrun: a\n---\nrun: b\n---\n")
    assert pipeline.name == "pipe" and pipeline.execution == SERIAL
    assert [t.name for t in pipeline.tasks] == ["train", "pipe-1"]
    assert [t.run for t in pipeline.tasks] == ["a", "b"]


def test_without_a_header_every_document_is_a_task_and_the_file_names_the_pipeline():
    pipeline = Pipeline.from_yaml_str("run: a\n---\nname: second\nrun: b\n", default_name="mypipe")
    assert pipeline.name == "mypipe"
    assert [t.name for t in pipeline.tasks] == ["mypipe-0", "second"]


def test_a_header_with_execution_serial_is_a_header_and_a_lone_task_takes_the_pipeline_name():
    pipeline = Pipeline.from_yaml_str("name: one\nexecution: serial\n---\nname: inner\nrun: a\n")
    assert pipeline.name == "one" and [t.name for t in pipeline.tasks] == ["one"]


def test_a_header_alone_is_one_empty_task_as_in_skypilot():
    pipeline = Pipeline.from_yaml_str("name: solo\n")
    assert [t.name for t in pipeline.tasks] == ["solo"] and pipeline.tasks[0].run is None


def test_execution_parallel_makes_a_job_group_whose_tasks_need_distinct_safe_names():
    text = "name: grp\nexecution: parallel\n---\nname: a\nrun: x\n---\nname: b\nrun: y\n"
    pipeline = Pipeline.from_yaml_str(text)
    assert pipeline.execution == PARALLEL and [t.name for t in pipeline.tasks] == ["a", "b"]

    with pytest.raises(SpecError, match=r"\(document 3\): name: 'a' is already the name of document 2"):
        Pipeline.from_yaml_str("name: grp\nexecution: parallel\n---\nname: a\n---\nname: a\n")
    with pytest.raises(SpecError, match=r"\(document 2\): name: every task of a parallel pipeline needs"):
        Pipeline.from_yaml_str("name: grp\nexecution: parallel\n---\nrun: x\n")
    with pytest.raises(SpecError, match=r"\(document 1\): prioritty: not a field .* primary_tasks"):
        Pipeline.from_yaml_str("name: grp\nexecution: parallel\nprioritty: 1\n---\nname: a\n")


def test_a_job_groups_primary_tasks_are_accepted_and_named_once_as_not_acted_on():
    text = "name: grp\nexecution: parallel\nprimary_tasks: [a]\ntermination_delay: 10s\n---\nname: a\n"
    with pytest.warns(SpecWarning, match="primary_tasks, termination_delay"):
        Pipeline.from_yaml_str(text)


def test_an_invalid_execution_mode_is_refused_with_what_is_allowed():
    with pytest.raises(SpecError, match=r"\(document 1\): execution: a pipeline header takes 'serial'"):
        Pipeline.from_yaml_str("name: p\nexecution: parallel\n")


def test_an_error_in_a_task_names_its_document_and_field():
    with pytest.raises(SpecError, match=r"^<string> \(document 3\): num_nodes: must be an integer >= 1"):
        Pipeline.from_yaml_str("name: p\n---\nrun: a\n---\nnum_nodes: 0\n")
    with pytest.raises(SpecError, match=r"\(document 2\): a document must be a mapping"):
        Pipeline.from_yaml_str("name: p\n---\n- a list\n")


def test_env_overrides_reach_every_task_of_the_pipeline():
    text = "name: p\n---\nenvs: {LR: null}\nrun: a\n---\nenvs: {LR: '0.1'}\nrun: b\n"
    pipeline = Pipeline.from_yaml_str(text, env_overrides={"LR": "0.5"})
    assert [t.envs["LR"] for t in pipeline.tasks] == ["0.5", "0.5"]


def test_job_ids_are_taskgroup_safe_and_unique_even_for_repeated_names():
    pipeline = Pipeline.from_yaml_str("name: p\n---\nname: my.step\n---\nname: my.step\n---\nname: x\n")
    assert pipeline.job_ids == ["my_step", "my_step_2", "x"]


def test_a_single_task_loader_points_a_pipeline_file_to_the_pipeline_loaders():
    with pytest.raises(SpecError, match=r"found 2 YAML documents .* that is a pipeline.*load_pipeline"):
        Task.from_yaml_str("name: a\nrun: x\n---\nname: b\nrun: y\n")


def test_a_trailing_document_separator_leaves_a_single_task_file_a_single_task():
    assert Task.from_yaml_str("name: a\nrun: x\n---\n").name == "a"


def test_to_documents_round_trips_through_the_loader():
    text = "name: grp\nexecution: parallel\n---\nname: a\nrun: x\n---\nname: b\nnum_nodes: 2\nrun: y\n"
    pipeline = Pipeline.from_yaml_str(text)
    again = Pipeline.from_documents(pipeline.to_documents())
    assert again.execution == PARALLEL and again.tasks == pipeline.tasks
