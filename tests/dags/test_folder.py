"""dags_from_folder: every task YAML of a folder becomes a DAG; a broken one is listed as a failing `broken` DAG."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_sky.errors import SpecError


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(textwrap.dedent(text))


def test_folder_yields_one_dag_per_task_and_reports_broken_files(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _write(tasks, "train.yaml", "name: train\nnum_nodes: 2\nrun: echo train\n")
    _write(
        tasks,
        "train.dag.yaml",
        """
        dag_id: nightly_train
        schedule: "@daily"
        retries: 2
        retry_delay_minutes: 5
        tags: [ml, nightly]
        infra: local
        down: true
        envs: {LR: 0.1}
        """,
    )
    _write(tasks, "eval.yaml", "name: eval\nrun: echo eval\n")
    _write(tasks, "broken.yaml", "name: broken\nnum_nodes: 0\nrun: echo never\n")
    _write(tasks, "badsidecar.yaml", "name: badsidecar\nrun: echo x\n")
    _write(tasks, "badsidecar.dag.yaml", "schedul: '@daily'\n")
    _write(tasks, "pipe.yaml", "name: twostep\n---\nname: prep\nrun: echo a\n---\nname: train\nrun: echo b\n")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "from_folder.py").write_text(
        f"from airflow_sky import dags_from_folder\n\ndags_from_folder({str(tasks)!r})\n"
    )

    bag = DagBag(dag_folder=str(dags))

    assert bag.import_errors == {}
    assert set(bag.dags) == {"nightly_train", "eval", "broken", "badsidecar", "pipe"}
    nightly = bag.dags["nightly_train"]
    assert nightly.tags == {"ml", "nightly"} or set(nightly.tags) == {"ml", "nightly"}
    assert nightly.default_args["retries"] == 2
    assert nightly.get_task("train.provision").sky_task.envs["LR"] == "0.1"
    warnings = " ".join(w for ws in bag.captured_warnings.values() for w in ws)
    assert "broken.yaml" in warnings and "num_nodes" in warnings
    assert "badsidecar.dag.yaml" in warnings and "schedul" in warnings
    # The UI lists each broken file as a DAG tagged `broken`: the error (with the file's path, and a
    # did-you-mean for a misspelt sidecar field) is its description, and its only task fails with it.
    broken, badsidecar = bag.dags["broken"], bag.dags["badsidecar"]
    assert "broken" in broken.tags and list(broken.task_dict) == ["spec_error"]
    with pytest.raises(SpecError, match="num_nodes"):
        broken.get_task("spec_error").python_callable()
    assert f"{tasks / 'broken.yaml'}: num_nodes: must be an integer >= 1" in broken.description
    assert f"{tasks / 'badsidecar.dag.yaml'}: schedul: unknown field; did you mean 'schedule'?" in (
        badsidecar.description
    )
    # A pipeline file is one DAG: its jobs in order, the second after the first's collect and teardown.
    pipe = bag.dags["pipe"]
    assert pipe.get_task("train.provision").upstream_task_ids == {"prep.collect", "prep.teardown"}
    assert pipe.get_task("prep.provision").sky_task.name == "prep"
