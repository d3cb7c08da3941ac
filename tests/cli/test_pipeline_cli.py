"""`airflow-sky launch pipeline.yaml`: a pipeline's tasks in order, each on its own cluster, live, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.infra.local import layout

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]

PIPELINE = """\
name: clipipe
---
name: prep
envs:
  DATASET: null
run: |
  echo "prep sees dataset $DATASET"
  echo '{"rows": 1234}' > "$AIRFLOW_SKY_XCOM_DIR/return.json"
---
name: train
num_nodes: 2
run: |
  echo "train rank $SKYPILOT_NODE_RANK got {{ sky_result('prep')['rows'] }} rows; ids=$(echo "$SKYPILOT_TASK_IDS" | wc -l)"
  docker_like='{{.Names}}'; echo "literal kept: $docker_like"
---
name: after
run: echo "after ran"
"""

FAILING = """\
name: failpipe
---
name: first
run: echo first ran
---
name: second
run: |
  echo second fails
  exit 5
---
name: third
run: echo third ran
"""


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIRFLOW_HOME", None)
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("cli-airflow"))
    home = tmp_path_factory.mktemp("sky-home")
    env["AIRFLOW_SKY_HOME"] = str(home)
    env["AIRFLOW_SKY_SSH_CONFIG"] = str(home / "ssh_config")
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _clusters_left(env: dict[str, str], prefix: str) -> list[str]:
    """Local clusters (their directories under the CLI's local root) whose name starts with `prefix`."""
    root = Path(env.get(layout.ROOT_ENV) or Path(env["AIRFLOW_SKY_HOME"]) / "local")
    return sorted(p.name for p in root.glob(f"{prefix}*")) if root.exists() else []


def test_a_pipeline_runs_its_tasks_in_order_with_results_handed_on_and_clusters_torn_down(cli_env, tmp_path):
    path = tmp_path / "pipe.yaml"
    path.write_text(PIPELINE)
    proc = _cli(
        {**cli_env, "DATASET": "from-the-shell"}, "launch", str(path), "-c", "pl", "--env", "DATASET", "-y"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # In order, each on a cluster of its own, with the same live view as one task.
    assert out.index("Task 1/3: prep on pl-0-prep") < out.index("Task 2/3: train on pl-1-train")
    assert out.index("Task 2/3: train") < out.index("Task 3/3: after on pl-2-after")
    assert "prep sees dataset from-the-shell" in out
    for rank in (0, 1):
        assert f"train rank {rank} got 1234 rows; ids=3" in out
    assert "literal kept: {{.Names}}" in out  # the rest of a SkyPilot script is not a template
    assert "after ran" in out and "Pipeline clipipe SUCCEEDED: 3 tasks" in out
    assert _clusters_left(cli_env, "pl-") == []  # each task's cluster went down when it ended


def test_a_failed_task_stops_the_pipeline_and_names_what_did_not_run(cli_env, tmp_path):
    path = tmp_path / "fail.yaml"
    path.write_text(FAILING)
    proc = _cli(cli_env, "launch", str(path), "-c", "fp", "-y")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]
    assert "first ran" in out and "second fails" in out and "third ran" not in out
    assert "Pipeline failpipe FAILED at task 2/3 (second); not started: third" in out
    assert _clusters_left(cli_env, "fp-") == []


def test_pipeline_flags_that_cannot_apply_are_refused_or_ignored_as_skypilot_does(cli_env, tmp_path):
    path = tmp_path / "fail.yaml"
    path.write_text(FAILING)
    proc = _cli(cli_env, "launch", str(path), "--gpus", "L4:1", "--dryrun")  # as `sky jobs launch`: ignored
    assert proc.returncode == 0, proc.stderr
    assert "override params --gpus are ignored, since" in proc.stderr and "Task 3/3: third" in proc.stdout
    proc = _cli(cli_env, "launch", str(path), "--detach-run", "-y")
    assert (
        proc.returncode == 2
        and "--detach-run: a pipeline's next task starts when this one ends" in proc.stderr
    )
    parallel = tmp_path / "par.yaml"
    parallel.write_text("name: par\nexecution: parallel\n---\nname: a\nrun: x\n---\nname: b\nrun: y\n")
    proc = _cli(cli_env, "launch", str(parallel), "-y")
    assert proc.returncode == 2 and "execution: parallel runs its 2 tasks side by side" in proc.stderr
    assert "Traceback" not in proc.stderr
