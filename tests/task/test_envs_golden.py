"""Per-node env dicts (golden, full equality) and the bash env file, sourced by a real bash."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from airflow_sky.task import Resources, Task, gpus_per_node
from airflow_sky.task.envs import ClusterInfo, env_file_text, make_task_id, run_envs, setup_envs

CLUSTER = ClusterInfo(cluster_name="mycluster", cloud="local", region=None, zone=None)
CLUSTER_JSON = '{"cluster_name": "mycluster", "cloud": "local", "region": null, "zone": null}'
TASK_ID = "sky-2024-05-06-07-08-09-123456_mycluster_3"


def test_task_id_has_skypilot_format() -> None:
    submitted = datetime(2024, 5, 6, 7, 8, 9, 123456)
    assert make_task_id("mycluster", 3, submitted) == TASK_ID
    assert make_task_id("c", 12, datetime(2025, 1, 2, 3, 4, 5)) == "sky-2025-01-02-03-04-05-000000_c_12"


def test_single_node_run_and_setup_envs() -> None:
    task = Task(run="true", envs={"EPOCHS": 3})
    (run,) = run_envs(task, ["10.0.0.1"], CLUSTER, TASK_ID, 0)
    (setup,) = setup_envs(task, ["10.0.0.1"], CLUSTER, TASK_ID, 0)
    assert run == {
        "EPOCHS": "3",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "10.0.0.1",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "SKYPILOT_TASK_ID": TASK_ID,
        "SKYPILOT_CLUSTER_INFO": CLUSTER_JSON,
        "PYTHONUNBUFFERED": "1",
    }
    assert setup == {
        "EPOCHS": "3",
        "SKYPILOT_SETUP_NODE_RANK": "0",
        "SKYPILOT_SETUP_NODE_IPS": "10.0.0.1",
        "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "0",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_TASK_ID": TASK_ID,
        "SKYPILOT_CLUSTER_INFO": CLUSTER_JSON,
        "PYTHONUNBUFFERED": "1",
    }


def test_two_node_run_envs_with_gpus_and_secrets() -> None:
    task = Task(
        run="true",
        num_nodes=2,
        envs={"MODEL": "gpt"},
        secrets={"HF_TOKEN": "hf_x"},
        resources=Resources(accelerators="L4:4"),
    )
    cluster = ClusterInfo("train", "aws", "us-east-1", "us-east-1a")
    cluster_json = '{"cluster_name": "train", "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a"}'
    envs = run_envs(task, ["10.0.0.7", "10.0.0.9"], cluster, "tid", gpus_per_node(task.resources))
    common = {
        "MODEL": "gpt",
        "HF_TOKEN": "hf_x",
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.9",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
        "SKYPILOT_TASK_ID": "tid",
        "SKYPILOT_CLUSTER_INFO": cluster_json,
        "PYTHONUNBUFFERED": "1",
    }
    assert envs == [
        {**common, "SKYPILOT_NODE_RANK": "0"},
        {**common, "SKYPILOT_NODE_RANK": "1"},
    ]
    assert json.loads(envs[0]["SKYPILOT_CLUSTER_INFO"]) == {
        "cluster_name": "train",
        "cloud": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
    }


def test_five_node_setup_envs_rank_follows_ip_order() -> None:
    ips = ["10.0.0.5", "10.0.0.1", "10.0.0.4", "10.0.0.2", "10.0.0.3"]
    task = Task(run="true", num_nodes=5)
    envs = setup_envs(task, ips, CLUSTER, TASK_ID, 8)
    expected = [
        {
            "SKYPILOT_SETUP_NODE_RANK": str(rank),
            "SKYPILOT_SETUP_NODE_IPS": "10.0.0.5\n10.0.0.1\n10.0.0.4\n10.0.0.2\n10.0.0.3",
            "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "8",
            "SKYPILOT_NUM_NODES": "5",
            "SKYPILOT_TASK_ID": TASK_ID,
            "SKYPILOT_CLUSTER_INFO": CLUSTER_JSON,
            "PYTHONUNBUFFERED": "1",
        }
        for rank in range(5)
    ]
    assert list(envs) == expected
    run = run_envs(task, ips, CLUSTER, TASK_ID, 8)
    assert [e["SKYPILOT_NODE_RANK"] for e in run] == ["0", "1", "2", "3", "4"]
    assert run[3]["SKYPILOT_NODE_IPS"].splitlines()[3] == "10.0.0.2"


def test_setup_on_a_cluster_larger_than_the_task_sees_the_tasks_node_count() -> None:
    # As SkyPilot: setup runs on every cluster node with the cluster's IPs and ranks, but its
    # SKYPILOT_NUM_NODES is the task's node count (task_codegen.add_setup), what `run` will see.
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    task = Task(run="true", num_nodes=2)
    envs = setup_envs(task, ips, CLUSTER, TASK_ID, 0)
    assert [e["SKYPILOT_SETUP_NODE_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["SKYPILOT_SETUP_NODE_IPS"] for e in envs} == {"10.0.0.1\n10.0.0.2\n10.0.0.3"}
    assert {e["SKYPILOT_NUM_NODES"] for e in envs} == {"2"}
    run = run_envs(task, ips[:2], CLUSTER, TASK_ID, 0)
    assert {e["SKYPILOT_NUM_NODES"] for e in run} == {"2"}


def test_setup_envs_refuse_fewer_ips_than_the_tasks_nodes() -> None:
    with pytest.raises(ValueError, match=r"node_ips has 1 IPs.*num_nodes \(2\)"):
        setup_envs(Task(run="true", num_nodes=2), ["10.0.0.1"], CLUSTER, TASK_ID, 0)


@pytest.mark.parametrize(("accelerators", "gpus"), [("A100:0.5", "1"), (None, "0"), ("H100:8", "8")])
def test_num_gpus_per_node_env_is_the_ceiled_accelerator_count(accelerators: str | None, gpus: str) -> None:
    task = Task(run="true", resources=Resources(accelerators=accelerators))
    (env,) = run_envs(task, ["10.0.0.1"], CLUSTER, TASK_ID, gpus_per_node(task.resources))
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == gpus


def test_framework_variables_win_over_task_envs_and_secrets_win_over_envs() -> None:
    task = Task(
        run="true",
        envs={"SKYPILOT_NODE_RANK": "99", "PYTHONUNBUFFERED": "0", "SHARED": "env"},
        secrets={"SHARED": "secret", "SKYPILOT_TASK_ID": "forged"},
    )
    (env,) = run_envs(task, ["10.0.0.1"], CLUSTER, TASK_ID, 0)
    assert env["SKYPILOT_NODE_RANK"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["SKYPILOT_TASK_ID"] == TASK_ID
    assert env["SHARED"] == "secret"


def test_envs_need_at_least_one_node_and_a_gpu_count() -> None:
    with pytest.raises(ValueError, match="node_ips is empty"):
        run_envs(Task(), [], CLUSTER, TASK_ID, 0)
    with pytest.raises(ValueError, match="num_gpus_per_node"):
        run_envs(Task(), ["10.0.0.1"], CLUSTER, TASK_ID, -1)


TRICKY_VALUES = {
    "SINGLE": "it's",
    "DOUBLE": 'say "hi"',
    "DOLLAR": "$HOME and ${PATH} and $(whoami) and `id`",
    "SPACES": "  lead and trail  ",
    "NEWLINES": "line1\nline2\n\nline4\n",
    "UNICODE": "héllo wörld ✓ 日本",
    "BACKSLASH": "a\\b\\n\\",
    "EMPTY": "",
    "GLOB": "* ? [a-z]",
    "SEMICOLON": "a; rm -rf /tmp/nothing-here; b",
}


def test_env_file_round_trips_through_bash(tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(env_file_text(TRICKY_VALUES), encoding="utf-8")
    dump = f"import json, os; print(json.dumps({{k: os.environ[k] for k in {sorted(TRICKY_VALUES)!r}}}))"
    script = f'set -e; source "$1"; exec "$2" -c {shlex.quote(dump)}'
    result = subprocess.run(
        ["bash", "-c", script, "bash", str(env_file), sys.executable],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        check=True,
        timeout=30,
    )
    assert json.loads(result.stdout) == TRICKY_VALUES


def test_env_file_has_one_export_line_per_variable() -> None:
    assert env_file_text({"A": "1", "B": "two words"}) == "export A=1\nexport B='two words'\n"
    assert env_file_text({}) == ""


@pytest.mark.parametrize("key", ["1A", "A-B", "A B", "", "A=B"])
def test_env_file_rejects_invalid_names(key: str) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        env_file_text({key: "x"})


def test_env_file_rejects_nul_bytes() -> None:
    with pytest.raises(ValueError, match="NUL"):
        env_file_text({"A": "a\0b"})
