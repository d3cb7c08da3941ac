"""sky_job end to end through `airflow dags test` on real local nodes."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path

from airflow_sky.infra.local import daemon, layout

PROBE_SETUP = 'date +%s.%N > "$PROBE_DIR/setup-start-$SKYPILOT_SETUP_NODE_RANK"; sleep {sleep}; date +%s.%N > "$PROBE_DIR/setup-end-$SKYPILOT_SETUP_NODE_RANK"'
PROBE_RUN = """\
date +%s.%N > "$PROBE_DIR/run-start-$SKYPILOT_NODE_RANK"
python3 -c '
import json, os
keys = [k for k in os.environ if k.startswith("SKYPILOT_")] + ["PYTHONUNBUFFERED", "GREETING"]
json.dump({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd()}, open(os.environ["PROBE_DIR"] + "/env-" + os.environ["SKYPILOT_NODE_RANK"], "w"))
'
echo "rank $SKYPILOT_NODE_RANK done"
"""


def _dag(dag_id: str, cluster: str, probe_dir: Path, num_nodes: int, setup: str, run: str) -> str:
    return f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name={dag_id!r},
    num_nodes={num_nodes},
    envs={{"PROBE_DIR": {str(probe_dir)!r}, "GREETING": "hello world"}},
    setup={setup!r},
    run={run!r},
)
with DAG({dag_id!r}, schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r})
"""


def _assert_nothing_left(cluster: str) -> None:
    assert daemon.processes_with_marker(cluster) == []
    assert not layout.cluster_dir(cluster).exists()


def test_three_node_job_sees_skypilot_env_and_setup_finishes_before_run(run_dag, tmp_path):
    result = run_dag(
        "envprobe", _dag("envprobe", "envprobe-c", tmp_path, 3, PROBE_SETUP.format(sleep=1), PROBE_RUN)
    )
    assert result.returncode == 0, result.digest
    envs = [json.loads((tmp_path / f"env-{rank}").read_text()) for rank in range(3)]
    ips = envs[0]["SKYPILOT_NODE_IPS"].split("\n")
    assert len(set(ips)) == 3
    task_id = envs[0]["SKYPILOT_TASK_ID"]
    assert re.fullmatch(r"sky-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{6}_envprobe-c_1", task_id)
    for rank, env in enumerate(envs):
        assert env["SKYPILOT_NODE_RANK"] == str(rank)
        assert env["SKYPILOT_NODE_IPS"].split("\n") == ips
        assert env["SKYPILOT_NUM_NODES"] == "3"
        assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "0"
        assert env["SKYPILOT_TASK_ID"] == task_id
        assert json.loads(env["SKYPILOT_CLUSTER_INFO"])["cluster_name"] == "envprobe-c"
        assert env["PYTHONUNBUFFERED"] == "1" and env["GREETING"] == "hello world"
        assert env["cwd"].endswith("/sky_workdir")
    last_setup_end = max(float((tmp_path / f"setup-end-{r}").read_text()) for r in range(3))
    first_run_start = min(float((tmp_path / f"run-start-{r}").read_text()) for r in range(3))
    assert last_setup_end <= first_run_start
    assert "(worker2, rank=2, pid=" in result.output and f"ip={ips[2]}) rank 2 done" in result.output
    _assert_nothing_left("envprobe-c")


# Each rank's setup waits until every rank's setup has started (at most 120 s, then it fails): setups run
# one after another could never all have started, so the job would fail; load only makes the wait longer.
BARRIER_SETUP = (
    'date +%s.%N > "$PROBE_DIR/setup-start-$SKYPILOT_SETUP_NODE_RANK"; '
    'for _ in $(seq 1200); do [ "$(ls "$PROBE_DIR" | grep -c ^setup-start-)" -ge 4 ] && break; sleep 0.1; done; '
    '[ "$(ls "$PROBE_DIR" | grep -c ^setup-start-)" -ge 4 ] || exit 7; '
    'date +%s.%N > "$PROBE_DIR/setup-end-$SKYPILOT_SETUP_NODE_RANK"'
)


def test_four_node_setups_run_concurrently(run_dag, tmp_path):
    result = run_dag("slowsetup", _dag("slowsetup", "slowsetup-c", tmp_path, 4, BARRIER_SETUP, "true"))
    assert result.returncode == 0, result.digest
    starts = [float((tmp_path / f"setup-start-{r}").read_text()) for r in range(4)]
    ends = [float((tmp_path / f"setup-end-{r}").read_text()) for r in range(4)]
    assert max(starts) <= min(ends), (starts, ends)  # all four were running at one moment
    _assert_nothing_left("slowsetup-c")


def test_setup_failure_on_one_rank_ends_the_job_as_failed_setup_without_running(run_dag, tmp_path):
    setup = 'if [ "$SKYPILOT_SETUP_NODE_RANK" = 1 ]; then echo "no such package" >&2; exit 3; fi; sleep 3600'
    result = run_dag("badsetup", _dag("badsetup", "badsetup-c", tmp_path, 3, setup, 'touch "$PROBE_DIR/ran"'))
    assert result.returncode != 0
    assert "FAILED_SETUP" in result.output
    assert "rank 1 failed with exit code 3" in result.output
    assert "killed: rank 1 failed with exit code 3" in result.output
    assert "no such package" in result.output
    assert not (tmp_path / "ran").exists()
    # The other ranks' hour-long setups were killed, not waited for.
    assert result.seconds < 120, result.seconds
    _assert_nothing_left("badsetup-c")


def test_a_teardown_that_cannot_terminate_fails_the_run_even_when_the_job_succeeded(
    run_dag, airflow_home, tmp_path
):
    from airflow_sky.infra.local.cloud import LocalCloud

    source = _dag(
        "unterminable", "unterminable-c", tmp_path, 2, "true", 'touch "$PROBE_DIR/ran-$SKYPILOT_NODE_RANK"'
    )
    source = "from tests.dags import unterminable\nunterminable.install()\n" + source
    try:
        result = run_dag("unterminable", source, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert sorted(p.name for p in tmp_path.glob("ran-*")) == [
            "ran-0",
            "ran-1",
        ]  # the job itself succeeded
        assert "terminating unterminable-c was refused" in result.output
        # Nodes left running must not look like a success: the run fails (the `terminated` leaf).
        assert result.returncode != 0, result.digest
        db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
        with contextlib.closing(sqlite3.connect(db)) as conn:
            states = dict(
                conn.execute(
                    "SELECT task_id, state FROM task_instance WHERE dag_id = 'unterminable' AND map_index <= 0"
                ).fetchall()
            )
        assert states["unterminable.run_follow"] == "success" and states["unterminable.collect"] == "success"
        assert states["unterminable.teardown"] == "failed"
        assert states["unterminable.terminated"] == "upstream_failed", states
    finally:
        LocalCloud().terminate("unterminable-c")
    _assert_nothing_left("unterminable-c")


def test_a_run_that_failed_to_start_on_a_kept_cluster_is_cancelled_and_nothing_keeps_running(
    run_dag, tmp_path
):
    from airflow_sky.gang.cluster_jobs import ClusterJobs
    from airflow_sky.infra.local.cloud import LocalCloud
    from airflow_sky.infra.registry import open_cluster

    run = 'echo "$$" > "$PROBE_DIR/pid-$SKYPILOT_NODE_RANK"; sleep 3600'
    source = _dag("unstartable", "unstartable-c", tmp_path, 2, "true", run)
    source = source.replace("cluster_name='unstartable-c')", "cluster_name='unstartable-c', down=False)")
    assert "down=False" in source
    source = "from tests.dags import unstartable\nunstartable.install()\n" + source
    try:
        result = run_dag("unstartable", source, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert result.returncode != 0
        assert "starting the run on rank 1 failed" in result.output
        assert "no task of its DAG run follows it any more" in result.output, result.digest
        with ClusterJobs(open_cluster("unstartable-c", "local")) as jobs:
            state = jobs.state()
        assert state.status.value == "CANCELLED", state
        # Rank 0 had started: its process is gone, killed by the teardown.
        pid = int((tmp_path / "pid-0").read_text())
        assert not Path(f"/proc/{pid}").exists() or "sleep" not in Path(f"/proc/{pid}/cmdline").read_text()
    finally:
        LocalCloud().terminate("unstartable-c")
