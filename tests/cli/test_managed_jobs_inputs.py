"""`jobs.launch` works on copies: the caller's Task or Pipeline stays as it was given."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import ApiConfig
from airflow_sky.errors import SpecError
from airflow_sky.task import Task
from airflow_sky.task.pipeline import Pipeline


class FakeApi:
    """Answers launch's requests; keeps the DAG run's conf."""

    def __init__(self) -> None:
        self.config = ApiConfig("http://airflow.invalid")
        self.confs: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if path.endswith("/dagRuns"):
            self.confs.append(kwargs["json"]["conf"])
        return None

    def get(self, path: str, **params: Any) -> Any:
        if path.endswith("/tasks"):  # a DAG with two pipeline slots
            return {"tasks": [{"task_id": "spec"}, {"task_id": "spec2"}]}
        return {"dag_id": "airflow_sky_jobs", "is_paused": False, "is_stale": False}


def test_launch_leaves_the_callers_task_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    task = Task("train", run="echo $LR", envs={"LR": "0.1"})
    api = FakeApi()
    managed_jobs.launch(task, env={"LR": "0.2"}, secrets={"TOKEN": "t0k3n"}, num_nodes=2, api=api)  # type: ignore[arg-type]
    (conf,) = api.confs
    assert conf["task"]["envs"] == {"LR": "0.2"} and conf["task"]["num_nodes"] == 2
    assert (task.envs, task.secrets, task.num_nodes) == ({"LR": "0.1"}, {}, 1)


def test_launch_leaves_the_callers_pipeline_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    pipeline = Pipeline.from_yaml_str("name: p\n---\nname: a\nrun: 'true'\n---\nname: b\nrun: 'true'\n")
    api = FakeApi()
    managed_jobs.launch(pipeline, env={"X": "1"}, secrets={"TOKEN": "t0k3n"}, api=api)  # type: ignore[arg-type]
    assert len(api.confs) == 1
    assert [(t.envs, t.secrets) for t in pipeline.tasks] == [({}, {}), ({}, {})]


def test_launch_names_the_cluster_as_launch_c_does(monkeypatch, tmp_path):
    """The one place that normalizes cluster names (client.cluster_names) names a managed job's cluster too:
    a name SkyPilot accepts becomes the host name label the cluster gets, one it refuses is refused."""
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    api = FakeApi()
    managed_jobs.launch(Task("train", run="true"), cluster_name="Dev_Box", api=api)  # type: ignore[arg-type]
    assert api.confs[0]["cluster_name"] == "dev-box"
    with pytest.raises(SpecError, match="cluster name '-bad' is invalid"):
        managed_jobs.launch(Task("train", run="true"), cluster_name="-bad", api=api)  # type: ignore[arg-type]
    assert len(api.confs) == 1
