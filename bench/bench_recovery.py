"""What a preemption costs a training job, with and without the cloud's notice (issue 39).

    baseline  rank 1's node killed without warning (`local preempt C 1`): the job learns of it when the node
              is gone, every rank goes back to its last periodic checkpoint (every 25 steps)
    ours      the same node warned first (`local preempt C 1 --notice 20`): its job gets SIGTERM and every
              rank checkpoints the step it is at; the node is replaced before its deadline

Each run is a real `airflow-sky launch` on a local cluster of N nodes: every rank steps every 0.2 s to 150,
reports its progress, checkpoints to a folder of this machine every 25 steps and on SIGTERM, and resumes
from its checkpoint. Rank 1 is preempted once it is 30 steps in. Printed per run, from the job's progress
document: the recovery (fault, or notice, to every rank running the new generation), the time it lost
(until every rank was back at the step reached), the steps redone and the run's goodput; then the ratio
of the noticed run's lost time to the unwarned one's.

Usage: python bench/bench_recovery.py [--nodes 2 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import header  # bench/common.py (the script's own folder)

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
TRAIN = """\
python3 - <<'EOF'
import json, os, signal, sys, time
from airflow_sky.progress import report
rank, gen = int(os.environ["SKYPILOT_NODE_RANK"]), os.environ["AIRFLOW_SKY_RECOVERY_COUNT"]
path = os.path.join(os.environ["CKPT"], f"rank{rank}.json")
step = json.load(open(path))["step"] if os.path.exists(path) else 0
def save(*_):
    tmp = path + ".tmp"
    json.dump({"step": step}, open(tmp, "w"))
    os.replace(tmp, path)
def stop(*_):
    save()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while step < 150:
    step += 1
    if rank == 1 and gen == "0":
        open(os.path.join(os.environ["CKPT"], "rank1-steps"), "a").write(f"{step}\\n")
    report(step=step, total=150)
    if step % 25 == 0:
        save()
    time.sleep(0.2)
save()
EOF
"""


def _rank1_steps(ckpt: Path) -> int:
    steps = ckpt / "rank1-steps"
    return len(steps.read_text().splitlines()) if steps.exists() else 0


def one_run(state: Path, nodes: int, notice: bool) -> dict[str, float | None]:
    cluster = f"bench-rec-{nodes}-{'notice' if notice else 'kill'}"
    ckpt = state / cluster
    ckpt.mkdir(parents=True)
    task = state / f"{cluster}.yaml"
    task.write_text(f"name: rec\nnum_nodes: {nodes}\nenvs:\n  CKPT: {ckpt}\nrun: |\n" + _indent(TRAIN))
    launch = subprocess.Popen(
        [*CLI, "launch", "-c", cluster, str(task), "-y"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    while _rank1_steps(ckpt) < 30:
        if launch.poll() is not None:
            raise SystemExit(f"{cluster}: the launch ended before rank 1 was 30 steps in")
        time.sleep(0.2)
    preempt = [*CLI, "local", "preempt", cluster, "1", *(["--notice", "20"] if notice else [])]
    preempter = threading.Thread(target=subprocess.run, args=(preempt,), kwargs={"capture_output": True})
    preempter.start()
    launch.wait(timeout=900)
    preempter.join(timeout=60)
    doc = json.loads(
        subprocess.run([*CLI, "progress", cluster, "--json"], capture_output=True, text=True).stdout
    )
    subprocess.run([*CLI, "down", cluster, "-y"], capture_output=True)
    (recovery,) = doc["recoveries"]
    since = recovery.get("notice_at") or recovery["fault_at"]
    return {
        "recovery_s": recovery["at"] - since,
        "lost_s": recovery["lost_s"],
        "steps_redone": recovery["steps_redone"],
        "goodput": (doc.get("goodput") or {}).get("ratio"),
    }


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 16])
    args = parser.parse_args()
    header()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir="/var/tmp") as tmp:
        state = Path(tmp)
        from bench_cli import private_cli_homes

        private_cli_homes(state)
        print(
            f"{'nodes':>5}  {'preemption':<10}  {'recovery':>9}  {'lost':>7}  {'redone':>6}  {'goodput':>7}"
        )
        for nodes in args.nodes:
            rows = {}
            for notice in (False, True):
                row = rows[notice] = one_run(state, nodes, notice)
                good = f"{100 * row['goodput']:.0f}%" if row["goodput"] is not None else "-"
                print(
                    f"{nodes:>5}  {'notice 20s' if notice else 'no warning':<10}  {row['recovery_s']:>8.1f}s  "
                    f"{row['lost_s']:>6.1f}s  {row['steps_redone']!s:>6}  {good:>7}",
                    flush=True,
                )
            if rows[False]["lost_s"]:
                print(
                    f"{nodes:>5}  lost with notice / without: {rows[True]['lost_s'] / rows[False]['lost_s']:.2f}"
                )


if __name__ == "__main__":
    main()
