"""Pipelines (multi-document task YAMLs) as one DAG, end to end through `airflow dags test` on local nodes."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import textwrap
from pathlib import Path

import psutil

from airflow_sky.infra.local import layout

# train writes a result; eval reads it through the sky_result template and records its env.
SERIAL_PIPELINE = """\
name: trainpipe
---
name: train
num_nodes: 2
envs:
  PROBE_DIR: {probe}
run: |
  if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
    echo '{{"checkpoint": "/ckpt/step-300", "loss": 0.25}}' > "$AIRFLOW_SKY_XCOM_DIR/return.json"
  fi
  printf '%s' "$SKYPILOT_TASK_ID" > "$PROBE_DIR/train-id-$SKYPILOT_NODE_RANK"
  printf '%s' "$SKYPILOT_TASK_IDS" > "$PROBE_DIR/train-ids"
---
name: eval
envs:
  PROBE_DIR: {probe}
  CHECKPOINT: "{{{{ sky_result('train')['checkpoint'] }}}}"
run: |
  printf '%s' "$CHECKPOINT" > "$PROBE_DIR/eval-checkpoint"
  printf '%s' '{{{{ sky_result("train") | tojson }}}}' > "$PROBE_DIR/eval-result"
  printf '%s' "$SKYPILOT_TASK_ID" > "$PROBE_DIR/eval-id"
  printf '%s' "$SKYPILOT_TASK_IDS" > "$PROBE_DIR/eval-ids"
"""

FAILING_MIDDLE = """\
name: failpipe
---
name: first
run: touch {probe}/first-ran
---
name: second
run: |
  touch {probe}/second-ran
  exit 3
---
name: third
run: touch {probe}/third-ran
"""

DAG_FILE = """
from airflow_sky import dag_from_yaml

dag = dag_from_yaml("{yaml}")  # relative: read next to this DAG file, whatever the working directory
"""


def _node_processes(prefix: str) -> list[psutil.Process]:
    """Local node processes of any cluster whose name starts with `prefix` (a pipeline's jobs' clusters)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(layout.NODE_MARKER_ENV, "").startswith(prefix):
                found.append(proc)
    return found


def _write(run_dag_folder: Path, name: str, text: str) -> None:
    (run_dag_folder / name).write_text(text)


def _task_states(airflow_home: dict[str, str], dag_id: str) -> dict[str, str]:
    db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT task_id, map_index, state FROM task_instance WHERE dag_id = ?", (dag_id,)
        ).fetchall()
    return {f"{task_id}[{index}]" if index >= 0 else task_id: state for task_id, index, state in rows}


def test_a_serial_pipeline_runs_in_order_and_hands_the_result_on_through_sky_result(
    run_dag, airflow_home, tmp_path
):
    dags = Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"])
    _write(dags, "trainpipe.yaml", SERIAL_PIPELINE.format(probe=tmp_path))
    result = run_dag("trainpipe", DAG_FILE.format(yaml="trainpipe.yaml"))
    assert result.returncode == 0, result.digest

    assert (tmp_path / "eval-checkpoint").read_text() == "/ckpt/step-300"
    assert json.loads((tmp_path / "eval-result").read_text()) == {
        "checkpoint": "/ckpt/step-300",
        "loss": 0.25,
    }
    # SKYPILOT_TASK_IDS: every task's id, one per line, the same list in each task; each its own entry.
    ids = (tmp_path / "train-ids").read_text().split("\n")
    assert (tmp_path / "eval-ids").read_text().split("\n") == ids
    assert len(ids) == 2
    assert (tmp_path / "train-id-0").read_text() == (tmp_path / "train-id-1").read_text() == ids[0]
    assert (tmp_path / "eval-id").read_text() == ids[1]
    assert re.fullmatch(r"sky-\d{4}(-\d{2}){5}-\d{6}_trainpipe_train_[0-9a-f]{6}-0", ids[0]), ids
    assert re.fullmatch(r"sky-\d{4}(-\d{2}){5}-\d{6}_trainpipe_eval_[0-9a-f]{6}-1", ids[1]), ids

    states = _task_states(airflow_home, "trainpipe")
    assert states["train.teardown"] == states["eval.teardown"] == "success", states
    assert _node_processes("trainpipe-") == []


def test_a_failed_middle_task_stops_the_pipeline_and_leaves_no_cluster(run_dag, airflow_home, tmp_path):
    dags = Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"])
    _write(dags, "failpipe.yaml", FAILING_MIDDLE.format(probe=tmp_path))
    result = run_dag("failpipe", DAG_FILE.format(yaml="failpipe.yaml"))
    assert result.returncode != 0, result.digest

    assert (tmp_path / "first-ran").exists() and (tmp_path / "second-ran").exists()
    assert not (tmp_path / "third-ran").exists()
    states = _task_states(airflow_home, "failpipe")
    assert states["first.collect"] == "success", states
    assert states["second.run_follow[0]"] == "failed", states
    assert states["second.teardown"] == "success", states  # its cluster went down anyway
    assert states["third.provision"] == "upstream_failed", states
    assert _node_processes("failpipe-") == []


def test_a_parallel_pipeline_runs_its_jobs_side_by_side_in_one_dag(run_dag, airflow_home, tmp_path):
    dags = Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"])
    text = textwrap.dedent(f"""\
        name: sidebyside
        execution: parallel
        ---
        name: left
        run: touch {tmp_path}/left-ran
        ---
        name: right
        num_nodes: 2
        run: touch {tmp_path}/right-ran-$SKYPILOT_NODE_RANK-$SKYPILOT_JOBGROUP_NAME
        """)
    _write(dags, "sidebyside.yaml", text)
    source = DAG_FILE.format(yaml="sidebyside.yaml") + textwrap.dedent("""
        # No edge between the two jobs: each one's provision is a root of the DAG.
        assert not dag.get_task("left.provision").upstream_task_ids
        assert not dag.get_task("right.provision").upstream_task_ids
    """)
    result = run_dag("sidebyside", source)
    assert result.returncode == 0, result.digest
    assert (tmp_path / "left-ran").exists()
    # SKYPILOT_JOBGROUP_NAME: the pipeline's name, as SkyPilot's job groups set it.
    assert (tmp_path / "right-ran-0-sidebyside").exists() and (tmp_path / "right-ran-1-sidebyside").exists()
    assert _node_processes("sidebyside-") == []
