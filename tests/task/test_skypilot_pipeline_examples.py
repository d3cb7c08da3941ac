"""SkyPilot's own pipeline and job-group examples (skypilot_examples/pipelines, see its README) through `check`."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from airflow_sky.client.cli import main
from airflow_sky.task import SpecWarning
from airflow_sky.task.pipeline import PARALLEL, SERIAL, Pipeline

EXAMPLES = Path(__file__).with_name("skypilot_examples") / "pipelines"

# file -> (pipeline name, execution, task names)
ACCEPTED = {
    "examples/spot_pipeline/bert_qa_train_eval.yaml": ("bert_qa", SERIAL, ["train", "eval"]),
    "examples/spot_pipeline/multi_jobs.yaml": ("pipeline", SERIAL, ["train1", "train2", "eval1", "eval2"]),
    "examples/spot_pipeline/single.yaml": ("dag-name", SERIAL, ["dag-name"]),  # a lone task takes the name
    "llm/gpt-2/gpt2-pipeline.yaml": ("gpt2-pipeline", SERIAL, ["gpt2-data", "gpt2-train"]),  # no header
}
# Job groups whose every task runs on Kubernetes: refused, naming the document and the field.
ON_KUBERNETES = (
    "llm/rl-post-training-jobgroup/rlhf-math-jobgroup-cpu.yaml",
    "llm/rl-post-training-jobgroup/rlhf-math-jobgroup.yaml",
    "llm/train-eval-jobgroup/train-eval-jobgroup.yaml",
)


def test_every_example_file_is_listed_here():
    found = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")}
    assert found == set(ACCEPTED) | set(ON_KUBERNETES)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_skypilot_pipeline_examples_load_as_skypilot_reads_them(name):
    pipeline = Pipeline.from_yaml(EXAMPLES / name, allow_unset=True)
    assert (pipeline.name, pipeline.execution, [t.name for t in pipeline.tasks]) == ACCEPTED[name]


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_check_validates_a_pipeline_and_says_how_it_runs(name, capsys):
    assert main(["check", str(EXAMPLES / name)]) == 0
    out, err = capsys.readouterr()
    expected_name, _, tasks = ACCEPTED[name]
    assert f"pipeline {expected_name!r}, {len(tasks)} task(s) run in order: {', '.join(tasks)}" in err
    assert out.count("\n---\n") == len(tasks)  # the header, then one document per task


def test_a_candidate_on_a_cloud_without_a_driver_is_skipped_and_named_once(capsys):
    with pytest.warns(SpecWarning) as caught:
        pipeline = Pipeline.from_yaml(EXAMPLES / "llm/gpt-2/gpt2-pipeline.yaml", allow_unset=True)
    message = " ".join(str(w.message) for w in caught)
    for index, cloud in ((0, "lambda"), (3, "azure"), (4, "fluidstack"), (5, "kubernetes")):
        assert f"resources.any_of.{index} ({cloud}: not a supported cloud, skipped)" in message
    assert [r.cloud for r in pipeline.tasks[1].resources.any_of] == ["aws", "gcp"]


def test_a_template_pipeline_names_the_values_each_task_needs_at_launch(capsys):
    assert main(["check", str(EXAMPLES / "examples/spot_pipeline/bert_qa_train_eval.yaml")]) == 0
    err = capsys.readouterr().err
    assert "(train): valid as a template; launch needs values for secrets.WANDB_API_KEY" in err
    assert "(eval): valid as a template" in err


@pytest.mark.parametrize("name", ON_KUBERNETES)
def test_job_groups_on_kubernetes_are_refused_naming_the_document(name, capsys):
    assert main(["check", str(EXAMPLES / name)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"\(document \d+\): resources\.infra: Kubernetes is not supported", err), err


@pytest.mark.parametrize("name", ON_KUBERNETES)
def test_job_groups_read_as_skypilot_reads_them_once_on_a_supported_cloud(name):
    # The same file with its Kubernetes placement moved to AWS, in memory (the data stays verbatim).
    text = re.sub(r"infra:\s*(k8s|kubernetes)\S*", "infra: aws", (EXAMPLES / name).read_text())
    expect_inert = "primary_tasks" in text  # primary/auxiliary tasks: accepted, named once as not acted on
    with pytest.warns(SpecWarning, match="primary_tasks") if expect_inert else contextlib.nullcontext():
        pipeline = Pipeline.from_yaml_str(text, source=name, allow_unset=True)
    assert pipeline.execution == PARALLEL and len(pipeline.tasks) >= 2
    assert len({t.name for t in pipeline.tasks}) == len(pipeline.tasks)
    assert all(t.resources.cloud in (None, "aws") for t in pipeline.tasks)
