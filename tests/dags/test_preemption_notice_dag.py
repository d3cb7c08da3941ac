"""A preemption with notice, end to end (real Airflow `airflow dags test`, real local nodes, real S3 API from
moto's server, real rclone MOUNT_CACHED mounts): `airflow-sky local preempt --notice` warns rank 1; its
preemption hook runs there, every rank checkpoints on SIGTERM to the bucket, the node is replaced before its
deadline and the job resumes with no step done twice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from airflow_sky.client import sdk
from airflow_sky.gang.lifecycle import hook_runs
from airflow_sky.gang.state import JobStates
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.registry import open_cluster
from tests.dags.test_bucket_mounts import _dag, _env, s3  # noqa: F401 - the moto S3 server fixture
from tests.metadata_standin import steps_by_generation

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]

# Each rank steps every 0.2 s and logs each step to the probe; it checkpoints to the bucket every 25 steps
# and on SIGTERM, and resumes from its checkpoint. It stops at 120 steps.
TRAIN = """\
python3 - <<'EOF'
import json, os, signal, sys, time
from airflow_sky.progress import report
rank, gen = int(os.environ["SKYPILOT_NODE_RANK"]), os.environ["AIRFLOW_SKY_RECOVERY_COUNT"]
path, probe = f"/checkpoint/rank{rank}.json", os.environ["PROBE"]
step = 0
if os.path.exists(path):
    with open(path) as f:
        step = json.load(f)["step"]
    print(f"resumed from step {step}", flush=True)
def save(*_):
    with open(path, "w") as f:
        json.dump({"step": step}, f)
    print(f"checkpoint step {step}", flush=True)
def stop(*_):
    save()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while step < 120:
    step += 1
    with open(f"{probe}/steps-{rank}", "a") as f:
        f.write(f"{gen} {step}\\n")
    report(step=step, total=120)
    if step % 25 == 0:
        save()
    time.sleep(0.2)
save()
EOF
"""

HOOK = 'echo "preemption hook on rank $SKYPILOT_NODE_RANK: $AIRFLOW_SKY_HOOK_EVENT"; touch "$PROBE/hook-$SKYPILOT_NODE_RANK"'


def _task(bucket: str, probe: Path) -> str:
    spec = {
        "name": "notice",
        "num_nodes": 2,
        "envs": {"PROBE": str(probe)},
        "run": TRAIN,
        "file_mounts": {"/checkpoint": {"name": bucket, "store": "s3", "mode": "MOUNT_CACHED"}},
        "config": {"hooks": [{"run": HOOK, "events": ["preemption"]}]},
    }
    return f"Task.from_dict({spec!r})"


def _when_training(probe: Path, act) -> threading.Thread:  # type: ignore[no-untyped-def]
    """`act()` once rank 1 of generation 0 is 30 steps in (past its first periodic checkpoint)."""

    def run() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            steps = probe / "steps-1"
            if steps.exists() and len(steps.read_text().splitlines()) >= 30:
                act()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_noticed_preemption_runs_the_hook_replaces_the_node_before_its_deadline_and_redoes_no_step(
    run_dag,
    s3,  # noqa: F811
    tmp_path: Path,
) -> None:
    cluster, bucket = "notice-c", "notice-ckpt"
    preempter: list[subprocess.CompletedProcess[str]] = []
    thread = _when_training(
        tmp_path,
        lambda: preempter.append(
            subprocess.run(
                [*CLI, "local", "preempt", cluster, "1", "--notice", "30"], capture_output=True, text=True
            )
        ),
    )
    try:
        result = run_dag("notice", _dag("notice", cluster, _task(bucket, tmp_path), down=False), env=_env(s3))
        thread.join(timeout=60)
        assert result.returncode == 0, result.digest
        assert "RECOVER (preemption notice for rank 1)" in result.output, result.digest
        assert "got a preemption notice: replacing it before it goes" in result.output
        # The hook ran on the noticed node only, with its event; what it printed was kept before the node
        # went (`airflow dags test` follows rank 1 only after the relaunch: its old log is not in the output).
        assert (tmp_path / "hook-1").exists() and not (tmp_path / "hook-0").exists()
        kept = [r for r in hook_runs(open_cluster(cluster, "local")) if r["event"] == "preemption"]
        assert kept and kept[-1]["results"][0]["output"] == "preemption hook on rank 1: preemption\n"
        hooks_cli = subprocess.run([*CLI, "logs", cluster, "--hook"], capture_output=True, text=True)
        assert "(hook 1, rank 1) preemption hook on rank 1: preemption" in hooks_cli.stdout, hooks_cli
        # No step done twice: every rank resumed where it stopped, from the checkpoint written on SIGTERM.
        for rank in (0, 1):
            steps = steps_by_generation(tmp_path, rank)
            assert steps["1"][0] == steps["0"][-1] + 1, (rank, steps["0"][-3:], steps["1"][:3])
            assert steps["1"][-1] == 120
        resumed = re.findall(r"rank=1[^)]*\) resumed from step (\d+)", result.output)
        assert resumed and int(resumed[0]) == steps_by_generation(tmp_path, 1)["0"][-1]
        # The job state has the notice (the infra's word) and the replacement was up before the deadline.
        (state,) = JobStates(open_cluster(cluster, "local").state_store()).all()
        (notice,) = state.info["notices"]
        assert notice["rank"] == 1 and notice["generation"] == 0
        replaced_at = state.history[-1]["replaced_at"]["1"]
        assert notice["seen_at"] < replaced_at < notice["preempt_at"]
        # The progress document (the view's, the XCom's) has the recovery: from the notice, no step redone.
        doc = sdk.job_progress(cluster, state.job_id)
        (recovery,) = doc["recoveries"]
        assert doc["goodput"]["steps_redone"] == 0 and 0 < doc["goodput"]["ratio"] <= 1, doc["goodput"]
        assert recovery["notice_at"] == notice["seen_at"] and recovery["preempt_at"] == notice["preempt_at"]
        assert recovery["steps_redone"] == 0 and recovery["lost_s"] >= 0, recovery
        # The preempter waited out the window and found the old node already gone (replaced).
        assert preempter and "already replaced or ended" in preempter[0].stdout, preempter
    finally:
        LocalCloud().terminate(cluster)
    assert daemon.processes_with_marker(cluster) == []
    assert json.loads(s3.client.get_object(Bucket=bucket, Key="rank1.json")["Body"].read()) == {"step": 120}
