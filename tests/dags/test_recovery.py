"""Faults end in success or a clear failure, never duplicates or leaks (real local nodes, `airflow dags test`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud

REPO = Path(__file__).resolve().parents[2]


def _dag(dag_id: str, cluster: str, body: str, down: bool = True) -> str:
    return f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

{body}
with DAG({dag_id!r}, schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down={down!r})
"""


def _preempt_when(cluster: str, rank: int, ready: callable, timeout: float = 300) -> threading.Thread:  # type: ignore[valid-type]
    """Preempt `rank` of `cluster` from a background thread as soon as ready() says so."""

    def run() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                LocalCloud().preempt(cluster, rank)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _started(probe: Path, ranks: int) -> Callable[[], bool]:
    """Has every one of `ranks` ranks written its line to `probe`/starts?"""

    def check() -> bool:
        starts = probe / "starts"
        return starts.exists() and len(starts.read_text().splitlines()) >= ranks

    return check


def _exit_code_files(cluster: str, job: str) -> dict[int, Path]:
    files = {}
    for record_path in layout.instances_dir(cluster).glob("*/node.json"):
        record = json.loads(record_path.read_text())
        for path in (record_path.parent / "home" / ".airflow_sky" / "jobs" / job).glob("gen-*/exit_code"):
            files[int(record["rank"])] = path
    return files


def test_failing_rank_kills_the_others_fast_and_they_record_137(run_dag, tmp_path):
    body = f"""
task = Task(
    name="failfast",
    num_nodes=3,
    envs={{"PROBE": {str(tmp_path)!r}}},
    run='if [ "$SKYPILOT_NODE_RANK" = 2 ]; then sleep 2; date +%s.%N > "$PROBE/failed-at"; echo "bad input" >&2; exit 3; fi; sleep 3600',
)
"""
    result = run_dag("failfast", _dag("failfast", "failfast-c", body, down=False))
    try:
        assert result.returncode != 0
        assert "rank 2 failed with exit code 3; killed the processes on the other nodes" in result.output
        assert "bad input" in result.output  # the failing rank's last log lines are in its error
        assert result.output.count("killed: rank 2 failed with exit code 3") >= 2
        failed_at = float((tmp_path / "failed-at").read_text())
        codes = _exit_code_files("failfast-c", "1-run")
        assert {rank: path.read_text().strip() for rank, path in codes.items()} == {
            0: "137",
            1: "137",
            2: "3",
        }
        for rank in (0, 1):
            assert codes[rank].stat().st_mtime - failed_at < 10
        assert [p for p in daemon.processes_with_marker("failfast-c") if p.name() == "sleep"] == []
    finally:
        LocalCloud().terminate("failfast-c")
    assert daemon.processes_with_marker("failfast-c") == []


def test_preempted_worker_during_mingpt_is_replaced_and_training_resumes(run_dag):
    cluster = "mingpt-preempt"
    body = f"""
task = Task.from_yaml({str(REPO / "examples" / "mingpt" / "train.yaml")!r})
task.update_envs({{"MAX_STEPS": "160", "SNAPSHOT_EVERY": "20", "LOG_EVERY": "20"}})
"""

    def snapshot_saved() -> bool:
        return any(layout.instances_dir(cluster).glob("*/home/sky_workdir/gpt_snapshot.pt"))

    preempter = _preempt_when(cluster, 1, snapshot_saved)
    old_ips: dict[int, str] = {}

    def remember_ips() -> None:
        while not old_ips:
            nodes = LocalCloud().nodes(cluster)
            if len(nodes) == 2:
                old_ips.update({n.rank: n.internal_ip for n in nodes})
            time.sleep(0.2)

    threading.Thread(target=remember_ips, daemon=True).start()
    result = run_dag("mingpt_preempt", _dag("mingpt_preempt", cluster, body))
    preempter.join(timeout=1)
    assert result.returncode == 0, result.digest
    assert "RECOVER: node of rank 1 lost" in result.output
    assert "rank 1 is now " in result.output
    new_ip = result.output.split("rank 1 is now ", 1)[1].split()[0]
    assert old_ips and new_ip != old_ips[1]
    resumed = [line for line in result.output.splitlines() if "resuming from snapshot at step" in line]
    assert resumed, "training restarted from scratch instead of resuming"
    step = int(resumed[0].split("resuming from snapshot at step", 1)[1].split()[0])
    assert step >= 20
    assert "final loss" in result.output
    assert daemon.processes_with_marker(cluster) == []


def test_preempted_head_is_replaced_and_every_rank_relaunched(run_dag, tmp_path):
    cluster = "head-preempt"
    body = f"""
task = Task(
    name="headloss",
    num_nodes=2,
    envs={{"PROBE": {str(tmp_path)!r}}},
    run='echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT $(echo "$SKYPILOT_NODE_IPS" | head -n1) $SKYPILOT_TASK_ID" >> "$PROBE/starts"; sleep 6',
)
"""

    preempter = _preempt_when(cluster, 0, _started(tmp_path, 2))
    result = run_dag("head_preempt", _dag("head_preempt", cluster, body))
    preempter.join(timeout=1)
    assert result.returncode == 0, result.digest
    starts = [line.split() for line in (tmp_path / "starts").read_text().splitlines()]
    by_generation = {g: {s[0]: s for s in starts if s[1] == g} for g in ("0", "1")}
    assert set(by_generation["0"]) == {"0", "1"} and set(by_generation["1"]) == {"0", "1"}, starts
    assert by_generation["1"]["0"][2] != by_generation["0"]["0"][2]  # the head has a new address
    assert len({s[3] for s in starts}) == 1  # same SKYPILOT_TASK_ID across the recovery
    assert "RECOVER: node of rank 0 lost" in result.output
    assert daemon.processes_with_marker(cluster) == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_rank_that_finished_joins_the_recovery_when_a_sibling_is_lost_before_the_phase_ends(
    run_dag, tmp_path, deferrable
):
    cluster = f"late-loss-{int(deferrable)}"
    dag_id = f"late_loss_{int(deferrable)}"
    source = f"""
from airflow.sdk import DAG, task
from airflow_sky import Task, job_result, sky_job

job = Task(
    name="lateloss",
    num_nodes=2,
    envs={{"PROBE": {str(tmp_path)!r}}},
    run='''
echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> "$PROBE/starts"
if [ "$SKYPILOT_NODE_RANK" = 1 ] && [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 3600; fi
printf '{{"rank": %s, "recoveries": %s}}' "$SKYPILOT_NODE_RANK" "$AIRFLOW_SKY_RECOVERY_COUNT" > "$AIRFLOW_SKY_XCOM_DIR/return.json"
touch "$PROBE/done-$SKYPILOT_NODE_RANK-$AIRFLOW_SKY_RECOVERY_COUNT"
''',
)
with DAG({dag_id!r}, schedule=None) as dag:
    group = sky_job(job, cluster_name={cluster!r}, deferrable={deferrable!r}, defer_after_s=0, trigger_min_wait_s=0)

    @task
    def record(result):
        import json
        open({str(tmp_path / "result.json")!r}, "w").write(json.dumps(result))

    record(job_result(group))
"""
    # Rank 0 has finished generation 0 when rank 1's node goes: the job has not, so both ranks rerun.
    preempter = _preempt_when(cluster, 1, lambda: (tmp_path / "done-0-0").exists())
    result = run_dag(dag_id, source)
    preempter.join(timeout=1)
    assert result.returncode == 0, result.digest
    # Rank 1's node may go before its generation 0 started (its run_start then leaves it to recovery).
    starts = (tmp_path / "starts").read_text().split("\n")[:-1]
    assert {"0 0", "0 1", "1 1"} <= set(starts) <= {"0 0", "0 1", "1 0", "1 1"}, starts
    assert len(starts) == len(set(starts)), starts  # nothing started twice
    assert json.loads((tmp_path / "result.json").read_text()) == {"rank": 0, "recoveries": 1}
    assert daemon.processes_with_marker(cluster) == []


def test_preempting_the_head_and_rank_5_of_16_nodes_is_one_recovery_and_each_rank_starts_once_per_generation(
    run_dag, tmp_path
):
    cluster = "sixteen-preempt"
    body = f"""
task = Task(
    name="sixteen",
    num_nodes=16,
    envs={{"PROBE": {str(tmp_path)!r}}},
    run='echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> "$PROBE/starts"; [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ] && sleep 3600; sleep 3',
)
"""

    all_started = _started(tmp_path, 16)

    def preempt_both() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not all_started():
            time.sleep(0.2)
        LocalCloud().preempt(cluster, 0)
        LocalCloud().preempt(cluster, 5)

    preempter = threading.Thread(target=preempt_both, daemon=True)
    preempter.start()
    result = run_dag("sixteen_preempt", _dag("sixteen_preempt", cluster, body))
    preempter.join(timeout=1)
    assert result.returncode == 0, result.digest
    starts = (tmp_path / "starts").read_text().splitlines()
    assert sorted(starts) == sorted(f"{r} {g}" for r in range(16) for g in (0, 1)), starts
    assert result.output.count("Relaunching job") == 1, result.digest
    assert "rank 0 is now " in result.output and "rank 5 is now " in result.output
    assert daemon.processes_with_marker(cluster) == []
