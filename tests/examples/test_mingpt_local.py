"""The minGPT example trains for real: 2 torchrun processes (gloo, CPU), a snapshot, and a resume from it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.progress import Report, parse_line

pytest.importorskip("torch")

MAIN = Path(__file__).resolve().parents[2] / "examples" / "mingpt" / "main.py"
# Tiny sizes: each run is a few seconds of training; most of the time is torchrun and `import torch`.
TINY = {
    "N_LAYER": "1",
    "N_HEAD": "2",
    "N_EMBD": "32",
    "BLOCK_SIZE": "32",
    "BATCH_SIZE": "16",
    "LR": "0.01",
    "LOG_EVERY": "10",
    "SNAPSHOT_EVERY": "15",
    "SEED": "7",
}
STEP_LINE = re.compile(r"^\[rank (\d)/(\d)\] step (\d+)/(\d+) loss ([0-9.]+) ", re.MULTILINE)


def _torchrun(cwd: Path, max_steps: int, xcom: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "SNAPSHOT_"))}
    env.update(TINY, MAX_STEPS=str(max_steps), OMP_NUM_THREADS="1", AIRFLOW_SKY_XCOM_DIR=str(xcom))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, str(MAIN)], cwd=cwd, env=env, capture_output=True, text=True, timeout=150, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _rank0_steps(out: str) -> list[tuple[int, float]]:
    return [(int(m[3]), float(m[5])) for m in STEP_LINE.finditer(out) if m[1] == "0"]


def _last_reports(out: str) -> dict[int | None, Report]:
    """Each rank's last progress report (airflow_sky.progress lines)."""
    reports = [r for r in map(parse_line, out.splitlines()) if r is not None]
    return {r.rank: r for r in reports}


def test_two_process_ddp_trains_snapshots_and_resumes_from_the_saved_step(tmp_path: Path) -> None:
    first = _torchrun(tmp_path, max_steps=30, xcom=tmp_path / "xcom1")
    assert "[rank 0/2] world_size=2 " in first and "[rank 1/2] world_size=2 " in first, first[-3000:]
    steps = _rank0_steps(first)
    assert [s for s, _ in steps] == [1, 10, 20, 30], first[-3000:]
    assert steps[-1][1] < steps[0][1] - 0.5, f"loss did not fall: {steps}"
    assert {int(m[1]) for m in STEP_LINE.finditer(first)} == {0, 1}  # both ranks report progress
    snapshot = tmp_path / "gpt_snapshot.pt"  # the default SNAPSHOT_PATH is relative to the cwd
    assert snapshot.is_file()
    assert "resuming from snapshot" not in first
    # Every rank reports its progress: the last step of the run, with the loss the log line printed.
    last = _last_reports(first)
    assert sorted(last, key=str) == [0, 1], first[-3000:]
    for report in last.values():
        assert (report.step, report.total) == (30, 30)
        assert report.metrics["loss"] == pytest.approx(steps[-1][1], abs=1e-4)
        assert report.metrics["steps/s"] > 0 and report.metrics["tokens/s"] > report.metrics["steps/s"]
    result = json.loads((tmp_path / "xcom1" / "return.json").read_text())
    assert result["steps"] == 30 and result["world_size"] == 2
    assert result["final_loss"] < result["first_loss"]
    assert Path(result["snapshot"]) == snapshot.resolve()

    second = _torchrun(tmp_path, max_steps=40, xcom=tmp_path / "xcom2")
    assert "[rank 0/2] resuming from snapshot at step 30" in second, second[-3000:]
    assert "[rank 1/2] resuming from snapshot at step 30" in second  # broadcast from rank 0
    resumed = _rank0_steps(second)
    assert [s for s, _ in resumed] == [31, 40], second[-3000:]
    assert resumed[0][1] < steps[0][1] - 0.5  # continues from trained weights, not a fresh init
    assert json.loads((tmp_path / "xcom2" / "return.json").read_text())["steps"] == 40


def test_shipped_corpus_is_exactly_what_make_corpus_generates() -> None:
    spec = importlib.util.spec_from_file_location("make_corpus", MAIN.parent / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (MAIN.parent / "data" / "input.txt").read_text(encoding="utf-8") == module.corpus()


def test_sigterm_stops_every_rank_after_the_same_step_with_a_snapshot_the_next_run_resumes_from(
    tmp_path: Path,
) -> None:
    """What a preemption notice does to the example (airflow-sky SIGTERMs the job's process group)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "SNAPSHOT_"))}
    env.update(TINY, MAX_STEPS="100000", SNAPSHOT_EVERY="100000", OMP_NUM_THREADS="1", LOG_EVERY="5")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    proc = subprocess.Popen(
        [*cmd, str(MAIN)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if "[rank 0/2] step 20/" in line:  # training for a while, and no periodic snapshot yet
            os.killpg(proc.pid, signal.SIGTERM)
            break
    seen += proc.stdout.readlines()
    proc.wait(timeout=60)
    out = "".join(seen)
    stops = {
        int(m[1]): int(m[2]) for m in re.finditer(r"\[rank (\d)/2\] stopping at step (\d+): SIGTERM", out)
    }
    assert set(stops) == {0, 1} and stops[0] == stops[1] >= 20, out[-3000:]
    assert f"[rank 0/2] saved snapshot at step {stops[0]}" in out
    resumed = _torchrun(tmp_path, max_steps=stops[0] + 5, xcom=tmp_path / "xcom")
    assert f"[rank 0/2] resuming from snapshot at step {stops[0]}" in resumed, resumed[-3000:]
    assert next(s for s, _ in _rank0_steps(resumed)) == stops[0] + 1  # no step done twice
