"""Jobs on a kept cluster, as a SkyPilot user drives them: queue, logs, cancel, detach, ssh, and the SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
CLUSTER = "jobs-kept"

HELLO = """\
name: hello
num_nodes: 3
setup: echo "setup on $SKYPILOT_SETUP_NODE_RANK"
run: echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
"""
TWO_NODES = """\
name: two
num_nodes: 2
run: |
  echo "nodes=$SKYPILOT_NUM_NODES"
  echo "ips=$(echo "$SKYPILOT_NODE_IPS" | tr '\\n' ' ')"
  # A SkyPilot task, not a template: Go-template braces and bash lengths reach the node as written.
  NAME=abc; echo "literal={{.Names}} len=${#NAME}"
"""
FAILS = """\
name: fails
run: exit 7
"""
SLEEPER = """\
name: sleeper
num_nodes: 3
run: |
  echo "sleeping on $SKYPILOT_NODE_RANK"
  sleep 3600
"""
SLOW_SETUP = """\
name: slow-setup
num_nodes: 2
secrets:
  SECRET_TOKEN: null
setup: |
  echo "setup waiting on $SKYPILOT_SETUP_NODE_RANK"
  while [ ! -f "$RELEASE" ]; do sleep 0.2; done
run: echo "run on $SKYPILOT_NODE_RANK after setup"
"""
RESTARTS = """\
name: restarts
num_nodes: 2
resources:
  job_recovery: {max_restarts_on_errors: 2}
run: |
  echo "up on $SKYPILOT_NODE_RANK gen $AIRFLOW_SKY_RECOVERY_COUNT"
  sleep 3600
"""
SHORT = """\
name: short
num_nodes: 2
run: |
  echo "started on $SKYPILOT_NODE_RANK"
  # Runs until the test releases it, however slow the machine is.
  while [ ! -f "$RELEASE" ]; do sleep 0.2; done
  echo "finished on $SKYPILOT_NODE_RANK"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("sky-home")
    result = dict(os.environ)
    result.pop("AIRFLOW_HOME", None)
    result.pop("AIRFLOW_SKY_AIRFLOW_HOME", None)
    result["AIRFLOW_SKY_HOME"] = str(home)
    result["AIRFLOW_SKY_SSH_CONFIG"] = str(home / "ssh_config")
    return result


@pytest.fixture(scope="module")
def yamls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("yamls")
    for name, text in {
        "hello": HELLO,
        "two": TWO_NODES,
        "fails": FAILS,
        "sleeper": SLEEPER,
        "short": SHORT,
        "restarts": RESTARTS,
        "slow_setup": SLOW_SETUP,
    }.items():
        (folder / f"{name}.yaml").write_text(text)
    return folder


def cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def kept_cluster(env: dict[str, str], yamls: Path) -> Iterator[str]:
    launched = cli(env, "launch", "-c", CLUSTER, str(yamls / "hello.yaml"), "-y")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    yield CLUSTER
    cli(env, "down", CLUSTER)
    assert daemon.processes_with_marker(CLUSTER) == []


def test_exec_jobs_get_increasing_ids_and_statuses_match_exit_codes(env, yamls, kept_cluster):
    two = cli(env, "exec", kept_cluster, str(yamls / "two.yaml"))
    assert two.returncode == 0, two.stdout + two.stderr
    assert "nodes=2" in two.stdout
    assert "literal={{.Names}} len=3" in two.stdout
    ips = next(line for line in two.stdout.splitlines() if "ips=" in line).split("ips=")[1].split()
    assert len(ips) == 2 and len(set(ips)) == 2
    fails = cli(env, "exec", kept_cluster, str(yamls / "fails.yaml"))
    assert fails.returncode == 1
    queue = cli(env, "queue", kept_cluster)
    assert queue.returncode == 0
    rows = {line.split()[1]: line for line in queue.stdout.splitlines() if line.startswith("│")}
    assert "SUCCEEDED" in rows["1"] and "hello" in rows["1"]
    assert "SUCCEEDED" in rows["2"] and "two" in rows["2"]
    assert "FAILED" in rows["3"] and "fails" in rows["3"]
    assert cli(env, "logs", "--status", kept_cluster, "2").returncode == 0
    status3 = cli(env, "logs", "--status", kept_cluster, "3")
    assert status3.returncode == 1 and "FAILED" in status3.stdout
    logs = cli(env, "logs", kept_cluster, "1", "--no-follow")
    assert "rank 2 of 3" in logs.stdout and "(setup worker2, rank=2" in logs.stdout


def test_two_concurrent_execs_on_one_cluster_both_succeed_with_their_own_output(env, kept_cluster, tmp_path):
    procs = {}
    for tag in ("alpha", "beta"):
        task = tmp_path / f"{tag}.yaml"
        task.write_text(f'name: {tag}\nnum_nodes: 2\nrun: echo "{tag} on $SKYPILOT_NODE_RANK"; sleep 2\n')
        procs[tag] = subprocess.Popen(
            [*CLI, "exec", kept_cluster, str(task)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    outputs = {tag: proc.communicate(timeout=600)[0] for tag, proc in procs.items()}
    for tag, other in (("alpha", "beta"), ("beta", "alpha")):
        assert procs[tag].returncode == 0, outputs[tag]
        assert f"{tag} on 0" in outputs[tag] and f"{tag} on 1" in outputs[tag], outputs[tag]
        assert f"{other} on" not in outputs[tag]
    assert launch_files(env) == []


def test_exec_that_needs_more_nodes_than_the_cluster_has_is_refused_with_the_fix(env, yamls, kept_cluster):
    refused = cli(env, "exec", kept_cluster, str(yamls / "two.yaml"), "--num-nodes", "4")
    assert refused.returncode == 1
    assert "has 3 node(s); the task needs 4" in refused.stderr
    assert f"airflow-sky launch -c {kept_cluster}" in refused.stderr
    assert "Provisioning" not in refused.stdout
    row = next(line for line in cli(env, "status").stdout.splitlines() if kept_cluster in line)
    assert [cell.strip() for cell in row.split("│")][2] == "3", row  # not grown to 4


def test_cancel_of_a_sleeping_job_leaves_no_process_on_any_node(env, yamls, kept_cluster):
    started = cli(env, "exec", kept_cluster, str(yamls / "sleeper.yaml"), "--detach-run")
    assert started.returncode == 0, started.stdout + started.stderr
    job_id = started.stdout.split("Job ", 1)[1].split()[0]
    assert len([p for p in daemon.processes_with_marker(kept_cluster) if p.name() == "sleep"]) == 3
    cancelled = cli(env, "cancel", kept_cluster, job_id)
    assert cancelled.returncode == 0 and f"Cancelled job(s) {job_id}" in cancelled.stdout
    assert [
        p for p in daemon.processes_with_marker(kept_cluster) if p.is_running() and p.name() == "sleep"
    ] == []
    assert "CANCELLED" in cli(env, "logs", "--status", kept_cluster, job_id).stdout


def exec_until(
    env: dict[str, str],
    args: list[str],
    done: Callable[[list[str]], bool],
    on_stuck: Callable[[subprocess.Popen[str]], object],
    command: str = "exec",
) -> tuple[subprocess.Popen[str], list[str]]:
    """Start `airflow-sky exec ARGS` and read its output until done(lines); on_stuck(proc) after 180 s."""
    proc = subprocess.Popen(
        [*CLI, command, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(180, on_stuck, args=(proc,))
    watchdog.start()
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if done(seen):
            break
    watchdog.cancel()
    return proc, seen


def test_cancel_of_a_followed_job_is_not_taken_for_an_error_to_restart_on(env, yamls, kept_cluster):
    proc, seen = exec_until(
        env,
        [kept_cluster, str(yamls / "restarts.yaml")],
        done=lambda lines: sum("up on" in line for line in lines) == 2,
        on_stuck=lambda stuck: stuck.kill(),
    )
    job_id = "".join(seen).split("Job ", 1)[1].split()[0]
    cancelled = cli(env, "cancel", kept_cluster, job_id)
    try:
        rest, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest = proc.communicate()[0] + "\n[still running 120 s after the cancel: killed]"
    output = "".join(seen) + rest
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert proc.returncode == 1, output
    assert "cancelled (airflow-sky cancel)" in output
    assert "gen 1" not in output and "RESTART" not in output, output  # no relaunch after the cancel
    assert "CANCELLED" in cli(env, "logs", "--status", kept_cluster, job_id).stdout
    assert [
        p for p in daemon.processes_with_marker(kept_cluster) if p.is_running() and p.name() == "sleep"
    ] == []


def launch_files(env: dict[str, str]) -> list[Path]:
    """The DAG and spec files the CLI writes for a launch (the spec holds the task's secrets), and the
    dags folder each launch makes for them."""
    dags = Path(env["AIRFLOW_SKY_HOME"]) / "airflow" / "dags"
    return sorted([*dags.rglob("sky_launch_*"), *dags.glob("launch-*")]) if dags.is_dir() else []


def interrupt_and_reattach(
    env: dict[str, str], cluster: str, proc: subprocess.Popen[str], seen: list[str], release: Path
) -> str:
    """SIGINT the CLI like Ctrl-C; the job must go on to SUCCEEDED and `logs` must reattach to it."""
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert proc.returncode == 130, output
    assert "Detached from the logs" in output and f"airflow-sky logs {cluster}" in output
    assert launch_files(env) == [], "the launch's task JSON (it holds secrets) outlived Ctrl-C"
    job_id = output.split("Detached from the logs; job ", 1)[1].split()[0]
    status = cli(env, "logs", "--status", cluster, job_id)
    assert "RUNNING" in status.stdout or "SETTING_UP" in status.stdout, status.stdout + status.stderr
    release.touch()
    reattached = cli(env, "logs", cluster, job_id, timeout=240)
    assert reattached.returncode == 0, reattached.stdout + reattached.stderr
    assert "SUCCEEDED" in cli(env, "logs", "--status", cluster, job_id).stdout
    return reattached.stdout


def test_interrupted_exec_detaches_and_logs_reattaches(env, yamls, kept_cluster, tmp_path):
    release = tmp_path / "release"
    # Whichever rank the in-process runner follows first, every node's log is shown live; if that broke,
    # end the job (release it) rather than hang, and fail below with what was printed.
    proc, seen = exec_until(
        env,
        [kept_cluster, str(yamls / "short.yaml"), "--env", f"RELEASE={release}"],
        done=lambda lines: "started on 0" in lines[-1],
        on_stuck=lambda _: release.touch(),
    )
    assert not release.exists(), "rank 0's log never showed up live:\n" + "".join(seen)
    # Rank 1 may not even be started yet: the background driver starts it.
    logs = interrupt_and_reattach(env, kept_cluster, proc, seen, release)
    assert "finished on 0" in logs and "finished on 1" in logs


def test_interrupted_setup_goes_on_to_the_run_and_logs_reattach(env, yamls, kept_cluster, tmp_path):
    release = tmp_path / "release"
    proc, seen = exec_until(
        env,
        [
            "-c",
            kept_cluster,
            str(yamls / "slow_setup.yaml"),
            "--env",
            f"RELEASE={release}",
            "--env",
            "SECRET_TOKEN=s3cr3t-value",
            "-y",
        ],
        done=lambda lines: "setup waiting on 0" in lines[-1],
        on_stuck=lambda _: release.touch(),
        command="launch",
    )
    assert not release.exists(), "rank 0's setup log never showed up live:\n" + "".join(seen)
    logs = interrupt_and_reattach(env, kept_cluster, proc, seen, release)
    assert all(f"run on {rank} after setup" in logs for rank in (0, 1)), logs
    assert "s3cr3t-value" not in logs


def test_ssh_config_entries_reach_the_workers(env, kept_cluster):
    config = Path(env["AIRFLOW_SKY_SSH_CONFIG"])
    assert "Include" in config.read_text()
    result = subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", f"{kept_cluster}-worker1", "echo $HOME; hostname"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    home = result.stdout.split()[0]
    worker = next(n for n in LocalCloud().nodes(kept_cluster) if n.rank == 1)
    assert home == layout.read_node_record(layout.instances_dir(kept_cluster) / worker.instance_id)["home"]
    direct = cli(env, "ssh", kept_cluster, "2", "echo", "rank-two")
    assert direct.returncode == 0 and "rank-two" in direct.stdout


def test_sdk_launch_tail_logs_down_from_a_plain_script(env, tmp_path):
    script = tmp_path / "use_sdk.py"
    script.write_text(
        textwrap.dedent(
            """
            import airflow_sky as sky

            task = sky.Task(name="sdk", num_nodes=2, run='echo "sdk says hi from $SKYPILOT_NODE_RANK"; sleep 2')
            job_id, handle = sky.launch(task, cluster_name="sdk-c", detach_run=True, stream_logs=False)
            print("JOB", job_id, handle.cluster_name, len(handle.nodes))
            rc = sky.tail_logs("sdk-c", job_id, follow=True)
            print("TAIL_RC", rc)
            print("STATUS", sky.job_status("sdk-c", [job_id])[job_id].value)
            print("QUEUE", [r["job_id"] for r in sky.queue("sdk-c")])
            sky.down("sdk-c")
            print("CLUSTERS", [c["name"] for c in sky.status()])
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "JOB 1 sdk-c 2" in out
    assert "sdk says hi from 0" in out and "sdk says hi from 1" in out
    assert "TAIL_RC 0" in out and "STATUS SUCCEEDED" in out and "QUEUE [1]" in out
    assert "sdk-c" not in out.split("CLUSTERS", 1)[1]
    assert daemon.processes_with_marker("sdk-c") == []
