"""A minGPT learning-rate sweep, 4 trials x 2 local nodes, on a pool of 2 warm workers under a real Airflow
(scheduler, triggerer, API server; sweep_driver.py), watched in headless Chromium:

- the pool's setup ran once per worker, never per trial; every trial succeeded with its own SKYPILOT_JOB_RANK
  and at most 2 ran at once (the pool's queue, no lanes: max_parallel is not given);
- the progress view showed every trial, the best so far and a line per trial, and changed while they ran;
- the downstream task got the 4 results and picked the lowest final loss;
- an eval DAG scheduled on the checkpoint asset by partition ran once per trial;
- a second run, cancelled from the view's API once two trials ran: refused (403) for a viewer, done for the
  admin: the running trials stopped, the others never started, and the pool's workers are up and idle.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.scheduler.stack import REPO, run_in_private_network, terminate_clusters

pytest.importorskip("torch")
pytest.importorskip("playwright")

# The stack's own deadline bounds the test: a sweep, its eval runs and a cancelled second run.
pytestmark = pytest.mark.timeout(1700)

POOL = "gptpool"
DAG_ID = "lr_sweep_mingpt"
EVAL_DAG_ID = "eval_checkpoints"
LRS = ("3e-2", "1e-2", "3e-3", "1e-4")  # trial 0 (the largest rate) learns fastest in 40 tiny steps

POOL_FILE = """
pool:
  workers: 2
num_nodes: 2
workdir: {workdir}
setup: |
  set -eu
  python3 -c "import torch" && echo "setup $SKYPILOT_SETUP_NODE_RANK of $(hostname)-$$" >> {probe}/setups
"""

TRIAL_RUN = r"""
# The second (cancelled) run's trials wait here until they are cancelled: never done before the cancel.
if [ -f {probe}/hold ]; then sleep 600; fi
echo "start $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $SKYPILOT_NODE_RANK $(date +%s.%N)" >> {probe}/trials
SNAPSHOT_PATH=$HOME/ckpt/trial-$SKYPILOT_JOB_RANK.pt
mkdir -p $HOME/ckpt
MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
SNAPSHOT_PATH=$SNAPSHOT_PATH torchrun --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=1 \
  --master_addr=$MASTER_ADDR --master_port=$((8008 + SKYPILOT_JOB_RANK)) --node_rank=$SKYPILOT_NODE_RANK main.py
code=$?
echo "end $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $SKYPILOT_NODE_RANK $(date +%s.%N)" >> {probe}/trials
exit $code
"""

DAG = """
from airflow.sdk import DAG, Asset, task
from airflow_sky import Task, best_trial, sky_sweep, sweep_results

CKPT = Asset(name="mingpt_checkpoints", uri="file:///checkpoints/mingpt")
ENVS = {envs!r}

with DAG({dag_id!r}, schedule=None) as dag:
    trial = Task(name="mingpt-trial", num_nodes=2, envs=ENVS, run={run!r})
    sweep = sky_sweep(
        trial, params=[{{"LR": lr}} for lr in {lrs!r}], pool={pool!r}, metric="loss", outlets=[CKPT],
        trigger_min_wait_s=1,
    )

    @task
    def pick(results):
        return best_trial(results, "final_loss")

    pick(sweep_results(sweep))
"""

EVAL_DAG = """
from airflow.sdk import DAG, Asset, PartitionedAssetTimetable, task

CKPT = Asset(name="mingpt_checkpoints", uri="file:///checkpoints/mingpt")

with DAG({dag_id!r}, schedule=PartitionedAssetTimetable(assets=CKPT)) as dag:

    @task
    def evaluate(**context):
        events = [e.extra for events in context["triggering_asset_events"].values() for e in events]
        print("EVALUATING", context["dag_run"].partition_key, events)

    evaluate()
"""

ENVS = {
    "MAX_STEPS": "40",
    "SNAPSHOT_EVERY": "20",
    "LOG_EVERY": "5",
    "N_LAYER": "1",
    "N_HEAD": "2",
    "N_EMBD": "32",
    "BLOCK_SIZE": "32",
    "BATCH_SIZE": "16",
    "SEED": "7",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sweep-view")
    probe = tmp / "probe"
    probe.mkdir()
    home = tmp / "airflow"
    (home / "dags").mkdir(parents=True)
    (tmp / "pool.yaml").write_text(POOL_FILE.format(workdir=REPO / "examples" / "mingpt", probe=probe))
    run = TRIAL_RUN.format(probe=probe)
    (home / "dags" / f"{DAG_ID}.py").write_text(
        DAG.format(envs=ENVS, dag_id=DAG_ID, run=run, lrs=LRS, pool=POOL)
    )
    (home / "dags" / f"{EVAL_DAG_ID}.py").write_text(EVAL_DAG.format(dag_id=EVAL_DAG_ID))
    config = {
        "home": str(home),
        "pool": POOL,
        "pool_file": str(tmp / "pool.yaml"),
        "dag_id": DAG_ID,
        "eval_dag_id": EVAL_DAG_ID,
        "trials": len(LRS),
        "hold": str(probe / "hold"),
        "timeout_s": 600,
    }
    try:
        driver, report_path = run_in_private_network(
            [sys.executable, "-m", "tests.ui.sweep_driver"], tmp, config, timeout_s=1600
        )
        log_path = home / "standalone.log"
        log = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
        assert driver.returncode == 0 and report_path.exists(), driver.stdout + driver.stderr[-5000:] + log
        report: dict[str, Any] = json.loads(report_path.read_text())
        report["context"] = json.dumps(report, indent=1)[-12000:] + "\n--- standalone.log\n" + log
        report["probe"] = {
            name: (probe / name).read_text().splitlines()
            for name in ("setups", "trials")
            if (probe / name).exists()
        }
        return report
    finally:
        terminate_clusters(POOL)  # a failed run leaves its workers up


def _spans(lines: list[str]) -> dict[int, tuple[float, float]]:
    spans: dict[int, list[float]] = {}
    for line in lines:
        _, rank, _, _, at = line.split()
        spans.setdefault(int(rank), []).append(float(at))
    return {rank: (min(times), max(times)) for rank, times in spans.items()}


def test_the_sweep_ran_on_the_pool_two_at_a_time_with_setup_once_per_worker(swept: dict[str, Any]) -> None:
    assert "error" not in swept and swept["apply"]["rc"] == 0, swept["context"]
    assert swept["first"]["state"] == "success", swept["context"]
    assert len(swept["probe"]["setups"]) == 4, swept["probe"]  # 2 workers x 2 nodes, at apply, never again
    trials = swept["probe"]["trials"]
    first_run = trials[: 4 * 2 * 2]  # the first run's start and end lines (the cancelled run's come after)
    starts = sorted({(line.split()[1], line.split()[2]) for line in first_run if line.startswith("start")})
    assert starts == [(str(rank), "4") for rank in range(4)], trials
    spans = _spans(first_run)
    for moment, _ in spans.values():
        assert sum(1 for start, end in spans.values() if start <= moment <= end) <= 2, spans


def test_the_view_showed_every_trial_and_the_best_and_changed_while_they_ran(swept: dict[str, Any]) -> None:
    reads = [r["view"][0] for r in swept["reads"] if r["view"]]
    assert reads, swept["context"]
    assert all(len(view["trials"]) == 4 for view in reads)
    states = {tuple(t["state"] for t in view["trials"]) for view in reads}
    assert len(states) >= 3, states  # it changed while they ran (pending, running, succeeded ...)
    assert any(view["cancel"] for view in reads)  # offered while trials were left
    final = swept["first"]["view"][0]
    assert [t["state"] for t in final["trials"]] == ["SUCCEEDED"] * 4
    assert final["lines"] == 4  # one line per trial in the loss chart
    best = [t for t in final["trials"] if t["best"]]
    assert len(best) == 1 and "★" in best[0]["cells"][-1]
    assert final["best"].startswith(f"Best so far: trial {best[0]['trial']} (loss ")
    assert final["total"].startswith("4 of 4 finished · 100.0% of all steps")


def test_the_downstream_task_got_all_results_and_picked_the_lowest_loss(swept: dict[str, Any]) -> None:
    picked, results = swept["first"]["picked"], swept["first"]["results"]
    assert picked is not None and results is not None, swept["context"]
    assert [r["trial"] for r in results] == [0, 1, 2, 3] and all(r["succeeded"] for r in results), results
    assert [r["params"]["LR"] for r in results] == list(LRS)
    lowest = min(results, key=lambda r: r["result"]["final_loss"])
    assert picked["trial"] == lowest["trial"] and picked["params"]["LR"] == LRS[lowest["trial"]], results


def test_the_eval_dag_ran_once_per_trial_from_the_checkpoint_asset(swept: dict[str, Any]) -> None:
    runs = swept["eval_runs"]
    assert sorted(r.get("partition_key") for r in runs) == [f"trial-{i}" for i in range(4)], runs
    assert all(r["state"] == "success" for r in runs), runs


def test_cancelling_the_sweep_stops_its_trials_and_leaves_the_workers_up_and_idle(
    swept: dict[str, Any],
) -> None:
    cancel = swept["cancel"]
    assert cancel["viewer"] == 403 and cancel["admin"] == 200, swept["context"]
    assert len(cancel["answer"]["cancelled"]) == 2, cancel["answer"]
    assert cancel["state"] == "failed"
    assert [t["state"] for t in cancel["trials"]] == ["CANCELLED"] * 4, cancel["trials"]
    provisions = {
        ti["task_id"]: ti["state"] for ti in cancel["task_instances"] if ti["task_id"].endswith(".provision")
    }
    assert sorted(provisions.values()) == ["skipped", "skipped", "success", "success"], provisions
    assert [(w["status"], w["job"]) for w in cancel["workers"]] == [("UP", None), ("UP", None)], cancel[
        "workers"
    ]
    assert swept["down"]["rc"] == 0, swept["down"]
