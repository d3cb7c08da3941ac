"""A GPU task on a machine without GPUs is refused by `check` and before a local launch starts (it was
refused only by the provision, after an Airflow run was built and ~9 s had passed). This machine has no
nvidia-smi; a stand-in on PATH plays one with GPUs, so the same task is then accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
TASK = "name: gpu\nnum_nodes: 2\nresources:\n  accelerators: L4:2\nrun: echo ran\n"
REFUSAL = "accelerators: each node asks for 2 GPU(s), but this machine has none"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_SKY_HOME=str(tmp_path / "sky"), AIRFLOW_SKY_SSH_CONFIG=str(tmp_path / "ssh_config"))
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def task(tmp_path: Path) -> Path:
    if subprocess.run(["bash", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.fail("this test expects a machine without nvidia-smi (it plays GPUs with a stand-in)")
    path = tmp_path / "gpu.yaml"
    path.write_text(TASK)
    return path


def test_check_and_launch_refuse_gpus_this_machine_lacks_before_anything_starts(
    tmp_path: Path, task: Path
) -> None:
    env = _env(tmp_path)
    checked = _cli(env, "check", str(task))
    assert checked.returncode == 0, checked.stderr
    assert f"launching on local would fail: {REFUSAL}" in checked.stderr

    launched = _cli(env, "launch", "-c", "gpu-none", str(task), "-y")
    out = launched.stdout + launched.stderr
    assert launched.returncode != 0 and REFUSAL in out, out
    assert "Traceback" not in out and "provision" not in out.lower()  # no Airflow run was started
    assert daemon.processes_with_marker("gpu-none") == []


def test_check_accepts_the_same_task_where_nvidia_smi_finds_enough_gpus(tmp_path: Path, task: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a stand-in: no GPU exists on this machine; answers the detection query
    smi.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "NVIDIA L4, 4"; done\n')
    smi.chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    checked = _cli(env, "check", str(task))
    assert checked.returncode == 0 and "would fail" not in checked.stderr, checked.stderr
    env_three = dict(env)
    (tmp_path / "three.yaml").write_text(TASK.replace("num_nodes: 2", "num_nodes: 3"))
    checked = _cli(env_three, "check", str(tmp_path / "three.yaml"))
    assert "3 node(s) x 2 GPU(s) = 6 GPUs asked for, but this machine has 4" in checked.stderr
