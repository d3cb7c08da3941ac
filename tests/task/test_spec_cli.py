"""`airflow-sky check`, run as a real child process."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

SPEC_DIR = Path(__file__).parent
RunCli = Callable[..., subprocess.CompletedProcess[str]]


def test_check_prints_the_normalized_mingpt_task(run_cli: RunCli) -> None:
    result = run_cli("check", str(SPEC_DIR / "valid" / "mingpt_ddp.yaml"))
    assert result.returncode == 0, result.stderr
    # Nothing on stderr but, on a machine without GPUs (CI's), the note that a local launch of its L4:4
    # nodes would be refused (tests/cli/test_local_gpu_refusal.py).
    assert [
        line for line in result.stderr.splitlines() if "accelerators: each node asks for 4" not in line
    ] == []
    assert yaml.safe_load(result.stdout) == {
        "name": "minGPT-ddp",
        "workdir": ".",
        "num_nodes": 2,
        "resources": {"cpus": "4+", "accelerators": "L4:4"},
        "setup": "pip install -r requirements.txt\n",
        "run": (
            'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
            "torchrun --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE \\\n"
            "  --master_addr=$MASTER_ADDR --master_port=8008 --node_rank=$SKYPILOT_NODE_RANK main.py\n"
        ),
    }


def test_check_invalid_task_exits_2_with_one_line_and_no_traceback(run_cli: RunCli) -> None:
    path = SPEC_DIR / "invalid" / "num_nodes_zero.yaml"
    result = run_cli("check", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "num_nodes" in lines[0] and "num_nodes_zero.yaml" in lines[0]
    assert "Traceback" not in result.stderr


def test_check_bad_env_argument_exits_2_naming_env(run_cli: RunCli) -> None:
    result = run_cli("check", str(SPEC_DIR / "valid" / "mingpt_ddp.yaml"), "--env", "NOEQUALS")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--env" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_applies_env_and_env_file_with_the_command_line_winning(
    run_cli: RunCli, tmp_path: Path
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("envs:\n  A: null\n  B: yaml\nsecrets:\n  TOKEN: null\nrun: echo $A\n")
    env_file = tmp_path / "launch.env"
    env_file.write_text("B=file\nTOKEN=t0ps3cret\n")
    result = run_cli("check", str(task), "--env", "A=arg", "--env", "B=arg", "--env-file", str(env_file))
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    assert data["envs"] == {"A": "arg", "B": "arg"}
    assert data["secrets"] == {"TOKEN": "<redacted>"}
    assert "t0ps3cret" not in result.stdout
    shown = run_cli("check", str(task), "--env", "A=x", "--env-file", str(env_file), "--show-secrets")
    assert yaml.safe_load(shown.stdout)["secrets"] == {"TOKEN": "t0ps3cret"}


def test_check_prints_unsupported_fields_as_one_warning_line(run_cli: RunCli, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  priority: 5\n  ports: 8080\nservice:\n  replicas: 2\nrun: echo\n")
    result = run_cli("check", str(task))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("airflow-sky: warning: ")
    assert "resources.priority" in lines[0] and "service" in lines[0]
    assert "resources.ports" not in lines[0]  # ports act (opened on aws/gcp, listed by status --endpoints)
    assert yaml.safe_load(result.stdout)["service"] == {"replicas": 2}


def test_check_yaml_syntax_error_exits_2_naming_the_line(run_cli: RunCli, tmp_path: Path) -> None:
    task = tmp_path / "broken.yaml"
    task.write_text("run: [echo\n")
    result = run_cli("check", str(task))
    assert result.returncode == 2
    assert "broken.yaml: line 2" in result.stderr and result.stderr.count("\n") == 1
