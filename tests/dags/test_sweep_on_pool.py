"""A sweep of 4 trials x 2 local nodes on a pool of 2 warm workers (`airflow dags test`, the real CLI for the
pool): the pool's setup ran once per worker and never per trial, every trial got its own SKYPILOT_JOB_RANK,
at most 2 ran at once, the downstream task got all 4 results and picked the lowest loss, each trial's
success emitted an asset event with its trial and params (partition `trial-<i>`), and the workers are left
up and idle for the next sweep; `jobs pool down` then ends them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
POOL = "sweepp"

POOL_FILE = """
pool:
  workers: 2
num_nodes: 2
setup: |
  echo "setup $SKYPILOT_SETUP_NODE_RANK $(cat ~/.worker-id 2>/dev/null || (od -An -N4 -tx4 /dev/urandom | tr -d ' ' | tee ~/.worker-id))" >> {probe}/setups
"""

RUN = r"""
echo "start $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $SKYPILOT_NODE_RANK $(date +%s.%N) $LR" >> {probe}/trials
sleep 3
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
  python3 -c "import json, os; json.dump({{'loss': abs(float(os.environ['LR']) - 3e-4)}}, open(os.environ['AIRFLOW_SKY_XCOM_DIR'] + '/return.json', 'w'))"
fi
echo "end $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $SKYPILOT_NODE_RANK $(date +%s.%N)" >> {probe}/trials
"""

DAG = """
from airflow.sdk import DAG, Asset, task
from airflow_sky import Task, best_trial, sky_sweep, sweep_results

CKPT = Asset(name="lr_sweep_checkpoints", uri="file:///checkpoints/lr-sweep")

with DAG("lr_sweep", schedule=None) as dag:
    trial = Task(name="trial", num_nodes=2, run={run!r})
    sweep = sky_sweep(
        trial,
        params=[{{"LR": lr}} for lr in ("1e-3", "3e-4", "1e-4", "3e-5")],
        pool={pool!r},
        max_parallel=2,
        outlets=[CKPT],
    )

    @task
    def pick(results):
        best = best_trial(results, "loss")
        print("BEST TRIAL", best["trial"], best["params"]["LR"], len(results))
        return best

    pick(sweep_results(sweep))
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _intervals(lines: list[str]) -> dict[int, tuple[float, float]]:
    """Each trial's [first start, last end] over its nodes."""
    spans: dict[int, list[float]] = {}
    for line in lines:
        _, rank, _, _, at = line.split()[:5]
        spans.setdefault(int(rank), []).append(float(at))
    return {rank: (min(times), max(times)) for rank, times in spans.items()}


def test_a_sweep_on_a_pool_sets_up_once_per_worker_and_runs_two_trials_at_a_time(
    run_dag, airflow_home, tmp_path: Path
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    (tmp_path / "pool.yaml").write_text(POOL_FILE.format(probe=probe))
    try:
        applied = _cli("jobs", "pool", "apply", "-p", POOL, str(tmp_path / "pool.yaml"), "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert f"Pool {POOL!r}: 2 worker(s) set up" in applied.stdout
        setups = (probe / "setups").read_text().splitlines()
        assert len(setups) == 4 and len({line.split()[2] for line in setups}) == 4, (
            setups
        )  # 2 workers x 2 nodes

        result = run_dag("lr_sweep", DAG.format(run=RUN.format(probe=probe), pool=POOL), timeout=600)
        assert result.returncode == 0, result.digest
        assert "BEST TRIAL 1 3e-4 4" in result.output, result.digest

        # Setup never ran again: the trials ran on the workers as the pool left them.
        assert (probe / "setups").read_text().splitlines() == setups
        lines = (probe / "trials").read_text().splitlines()
        starts = [line.split() for line in lines if line.startswith("start")]
        assert sorted({(s[1], s[2], s[3]) for s in starts}) == [
            (str(rank), "4", str(node)) for rank in range(4) for node in range(2)
        ]
        spans = _intervals(lines)
        for moment in (start for start, _ in spans.values()):
            running = [rank for rank, (start, end) in spans.items() if start <= moment <= end]
            assert len(running) <= 2, (moment, running, spans)

        # One asset event per trial, partitioned by trial, saying which trial and params it came from.
        db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
        with contextlib.closing(sqlite3.connect(db)) as conn:
            events = conn.execute(
                "SELECT e.partition_key, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "WHERE a.name = 'lr_sweep_checkpoints' AND e.source_dag_id = 'lr_sweep'"
            ).fetchall()
        extras = sorted((key, json.loads(extra)) for key, extra in events)
        assert [key for key, _ in extras] == [f"trial-{i}" for i in range(4)]
        assert [(e["trial"], e["params"]["LR"]) for _, e in extras] == [
            (0, "1e-3"),
            (1, "3e-4"),
            (2, "1e-4"),
            (3, "3e-5"),
        ]
        assert {e["cluster"] for _, e in extras} == {f"{POOL}-0", f"{POOL}-1"}

        status = _cli("jobs", "pool", "status", POOL)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("idle") == 2 and "0/2 busy, 0 job(s) pending" in status.stdout, (
            status.stdout
        )
    finally:
        down = _cli("jobs", "pool", "down", POOL, "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert [c for c in LocalCloud().clusters() if c.startswith(POOL)] == []
    assert daemon.processes_with_marker(f"{POOL}-0") == [] and daemon.processes_with_marker(f"{POOL}-1") == []
    gone = _cli("jobs", "pool", "status", POOL)
    assert gone.returncode != 0 and "no such pool on local" in gone.stderr


PREEMPT_RUN = r"""
echo "start $SKYPILOT_JOB_RANK $SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT $(python3 -c 'import json, os; print(json.loads(os.environ["SKYPILOT_CLUSTER_INFO"])["cluster_name"])')" >> {probe}/trials
test -f ~/.pool-setup-done || {{ echo "rank $SKYPILOT_NODE_RANK has no pool setup"; exit 3; }}
if [ "$SKYPILOT_JOB_RANK" = 1 ] && [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 300; fi
sleep 2
echo "end $SKYPILOT_JOB_RANK $SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> {probe}/trials
"""

PREEMPT_POOL_FILE = """
pool:
  workers: 2
num_nodes: 2
setup: |
  touch ~/.pool-setup-done
  echo "setup $SKYPILOT_SETUP_NODE_RANK" >> {probe}/setups
"""

PREEMPT_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_sweep

with DAG("preempted_sweep", schedule=None) as dag:
    trial = Task(name="trial", num_nodes=2, run={run!r})
    sky_sweep(trial, params=[{{"LR": "1"}}, {{"LR": "2"}}], pool={pool!r}, max_parallel=2, trigger_min_wait_s=0)
"""


def test_a_preempted_node_of_one_trial_recovers_that_trial_with_the_pools_setup_and_leaves_the_other(
    run_dag, tmp_path: Path
) -> None:
    import threading
    import time

    probe = tmp_path / "probe"
    probe.mkdir()
    pool = "preemptp"
    (tmp_path / "pool.yaml").write_text(PREEMPT_POOL_FILE.format(probe=probe))
    preempted: dict[str, object] = {}

    def preempt_trial_1_rank_1() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            lines = (probe / "trials").read_text().splitlines() if (probe / "trials").exists() else []
            started = [line.split() for line in lines if line.startswith("start 1 ")]
            if len(started) == 2:
                cluster = started[0][4]
                preempted["cluster"] = cluster
                preempted["node"] = LocalCloud().preempt(cluster, 1).instance_id
                return
            time.sleep(0.5)

    try:
        applied = _cli("jobs", "pool", "apply", "-p", pool, str(tmp_path / "pool.yaml"), "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        watcher = threading.Thread(target=preempt_trial_1_rank_1, daemon=True)
        watcher.start()
        result = run_dag(
            "preempted_sweep", PREEMPT_DAG.format(run=PREEMPT_RUN.format(probe=probe), pool=pool)
        )
        watcher.join(timeout=10)
        assert result.returncode == 0, result.digest
        assert preempted.get("node"), preempted
        ends = sorted(
            line.split()[1:4]
            for line in (probe / "trials").read_text().splitlines()
            if line.startswith("end")
        )
        # Trial 0 ran once on each rank; trial 1 ended in its second generation on each rank.
        assert ends == [["0", "0", "0"], ["0", "1", "0"], ["1", "0", "1"], ["1", "1", "1"]], ends
        # The replacement node got the pool's setup (a fifth setup line), so trial 1's rank 1 found it.
        assert len((probe / "setups").read_text().splitlines()) == 5
        assert "RECOVER" in result.output or "Relaunching job" in result.output
    finally:
        down = _cli("jobs", "pool", "down", pool, "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert [c for c in LocalCloud().clusters() if c.startswith(pool)] == []


OWN_CLUSTERS_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_sweep

with DAG("own_clusters_sweep", schedule=None) as dag:
    trial = Task(name="trial", run={run!r})
    sky_sweep(trial, params=[{{"LR": "1"}}, {{"LR": "2"}}, {{"LR": "3"}}], max_parallel=2)
"""


def test_a_sweep_without_a_pool_gives_each_trial_a_cluster_of_its_own_and_tears_it_down(
    run_dag, tmp_path: Path
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    run = f"""echo "$SKYPILOT_JOB_RANK $(python3 -c 'import json, os; print(json.loads(os.environ["SKYPILOT_CLUSTER_INFO"])["cluster_name"])')" >> {probe}/trials"""
    result = run_dag("own_clusters_sweep", OWN_CLUSTERS_DAG.format(run=run))
    assert result.returncode == 0, result.digest
    lines = sorted(line.split() for line in (probe / "trials").read_text().splitlines())
    assert [rank for rank, _ in lines] == ["0", "1", "2"]
    clusters = {cluster for _, cluster in lines}
    assert len(clusters) == 3, lines  # never one cluster shared by the trials (nor a queue between them)
    assert not clusters & set(LocalCloud().clusters())  # each torn down by its trial's teardown
