"""What a new user meets first, on one kept 3-node local cluster: launch/exec output, secrets from the
shell, queue/logs (--tail, --sync-down, `| head`), ssh without a rank, autostop, stop/start, the SDK's
streamed logs, and `down -y`. Real launches are slow: each test runs few of them, in order, on one cluster."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.client import ssh_config
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from tests.cli.test_launch_cli import _cli, cli_env, launch_log  # noqa: F401 - the module's CLI environment

CLUSTER = "first-user"

KEPT = """\
name: greet
num_nodes: 3
secrets:
  API_TOKEN: null
setup: |
  echo "setup nodes=$SKYPILOT_NUM_NODES rank=$SKYPILOT_SETUP_NODE_RANK"
run: |
  echo "mode=$MODE token=$API_TOKEN on $SKYPILOT_NODE_RANK"
"""
# Two nodes of the three: setup still runs on all of them.
CHATTY = """\
name: chatty
num_nodes: 2
run: |
  for i in $(seq 1 3000); do echo "chatty $SKYPILOT_NODE_RANK line $i"; done
"""
FAILS = """\
name: fails
num_nodes: 2
run: |
  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then exit 4; fi
  sleep 600
"""
RECOVERS = """\
name: recovers
num_nodes: 2
setup: echo "set up on $SKYPILOT_SETUP_NODE_RANK"
run: |
  echo "up on $SKYPILOT_NODE_RANK gen $AIRFLOW_SKY_RECOVERY_COUNT"
  if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 600; fi
  echo "done on $SKYPILOT_NODE_RANK"
"""
# One node of the three: setup runs on all three, and each sees the task's node count, as in SkyPilot.
ONE_NODE = """\
name: one
num_nodes: 1
setup: |
  echo "one-node setup rank=$SKYPILOT_SETUP_NODE_RANK nodes=$SKYPILOT_NUM_NODES ips=$(echo "$SKYPILOT_SETUP_NODE_IPS" | wc -l)"
run: echo "one-node run nodes=$SKYPILOT_NUM_NODES"
"""
BAD_SETUP = """\
name: bad-setup
num_nodes: 2
setup: |
  if [ "$SKYPILOT_SETUP_NODE_RANK" = 1 ]; then echo "setup broke"; exit 3; fi
  sleep 600
run: echo never
"""


@pytest.fixture(scope="module")
def yamls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("first-user-yamls")
    for name, text in {
        "kept": KEPT,
        "chatty": CHATTY,
        "fails": FAILS,
        "bad_setup": BAD_SETUP,
        "recovers": RECOVERS,
        "one_node": ONE_NODE,
    }.items():
        (folder / f"{name}.yaml").write_text(text)
    return folder


_LAUNCH: dict[str, str] = {}  # the kept cluster's launch output


@pytest.fixture(scope="module")
def kept(cli_env: dict[str, str], yamls: Path) -> Iterator[str]:  # noqa: F811
    env = {**cli_env, "MODE": "from-the-shell", "API_TOKEN": "tok-s3cr3t-value"}
    launched = _cli(
        env, "launch", "-c", CLUSTER, str(yamls / "kept.yaml"), "--env", "MODE", "--secret", "API_TOKEN", "-y"
    )
    _LAUNCH["output"] = launched.stdout + launched.stderr
    assert launched.returncode == 0, _LAUNCH["output"]
    yield CLUSTER
    _cli(cli_env, "down", CLUSTER, "-y")
    assert daemon.processes_with_marker(CLUSTER) == []


def test_launch_and_exec_say_what_they_do_and_never_show_the_secret(
    cli_env: dict[str, str],  # noqa: F811
    yamls: Path,
    kept: str,
) -> None:
    out = _LAUNCH["output"]
    assert "Provisioning nodes" in out and "Tearing down" not in out  # the cluster is kept
    assert "mode=from-the-shell token=*** on 2" in out
    assert "tok-s3cr3t-value" not in out
    log = launch_log(out)
    assert (
        log and "tok-s3cr3t-value" not in log
    )  # nor in the launch's Airflow log (task logs, rendered fields)
    assert "setup nodes=3 rank=2" in out  # setup's SKYPILOT_NUM_NODES: the task's 3 nodes
    assert f"✓ Job 1 on {CLUSTER} SUCCEEDED" in out
    chatty = _cli(cli_env, "exec", kept, str(yamls / "chatty.yaml"))
    assert chatty.returncode == 0, chatty.stdout + chatty.stderr
    assert "Provisioning" not in chatty.stdout and "Tearing down" not in chatty.stdout
    assert "chatty 1 line 3000" in chatty.stdout


def test_logs_tail_sync_down_and_a_closed_pipe(
    cli_env: dict[str, str],  # noqa: F811
    kept: str,
    tmp_path: Path,
) -> None:
    tail = _cli(cli_env, "logs", kept, "2", "--no-follow", "--tail", "2")
    assert tail.returncode == 0, tail.stdout + tail.stderr
    lines = [line for line in tail.stdout.splitlines() if "chatty" in line]
    assert sorted(line.split(") ", 1)[1] for line in lines) == [
        "chatty 0 line 2999",
        "chatty 0 line 3000",
        "chatty 1 line 2999",
        "chatty 1 line 3000",
    ], tail.stdout
    home = tmp_path / "home"
    home.mkdir()
    synced = _cli({**cli_env, "HOME": str(home)}, "logs", kept, "2", "--sync-down")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    folder = home / "sky_logs" / kept / "2-chatty"
    assert str(folder) in synced.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["0-head.log", "1-worker1.log"]
    assert (folder / "1-worker1.log").read_text().splitlines()[-1] == "chatty 1 line 3000"
    setup = _cli({**cli_env, "HOME": str(home)}, "logs", kept, "1", "--sync-down")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert {"setup-head.log", "setup-worker2.log", "2-worker2.log"} <= {
        p.name for p in (home / "sky_logs" / kept / "1-greet").iterdir()
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_sky.client.cli", "logs", kept, "2", "--no-follow"],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


def _texts(output: str) -> list[str]:
    """Provision log lines without their date and time."""
    return [line.split(" ", 2)[2] for line in output.splitlines()]


def test_logs_provision_shows_the_clusters_provisioning_and_one_workers_lines(
    cli_env: dict[str, str],  # noqa: F811
    kept: str,
) -> None:
    whole = _cli(cli_env, "logs", kept, "--provision", "--no-follow")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    text = _texts(whole.stdout)
    assert text[0] == f"Provisioning cluster {kept}: 3 node(s) (0 existing, 0 of them running)", text
    assert [t.split(":")[0] for t in text if t.startswith("rank ")] == [
        "rank 0 (head)",
        "rank 1 (worker1)",
        "rank 2 (worker2)",
    ], text
    assert text[-1].startswith("provisioned in "), text
    worker = _cli(cli_env, "logs", kept, "--provision", "-w", "2", "--no-follow")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert [t.split(":")[0] for t in _texts(worker.stdout)] == ["rank 2 (worker2)"], worker.stdout
    # Followed (the default), it ends at once: that provisioning is over (later launches reused the nodes).
    followed = _cli(cli_env, "logs", kept, "--provision", "--tail", "1")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert [t.split(" ")[0] for t in _texts(followed.stdout)] == ["provisioned"], followed.stdout
    refused = {
        ("--provision", "--worker", "5"): f"cluster {kept!r} has no worker 5 (its workers: 1, 2)",
        ("--provision", "--worker", "0"): "--worker: must be a positive integer",
        ("2", "--worker", "1"): "--worker can only be used with --provision",
        ("2", "--provision"): "--provision cannot be combined with a job id",
    }
    for extra, message in refused.items():
        result = _cli(cli_env, "logs", kept, *extra)
        assert result.returncode != 0 and message in result.stderr, (extra, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == "", (extra, result.stdout)


def test_failures_show_their_status_rank_and_exit_code(
    cli_env: dict[str, str],  # noqa: F811
    yamls: Path,
    kept: str,
) -> None:
    failed = _cli(cli_env, "exec", kept, str(yamls / "fails.yaml"))
    assert failed.returncode == 1
    assert f"✗ Job 3 on {kept} FAILED: rank 1 failed with exit code 4" in failed.stdout, failed.stdout
    setup = _cli(cli_env, "launch", "-c", kept, str(yamls / "bad_setup.yaml"), "-y")
    assert setup.returncode == 1
    assert f"✗ Job 4 on {kept} FAILED_SETUP" in setup.stdout, setup.stdout
    queue = _cli({**cli_env, "COLUMNS": "80"}, "queue", kept)
    assert queue.returncode == 0, queue.stderr
    assert max(len(line) for line in queue.stdout.splitlines()) <= 80, queue.stdout
    rows = {line.split("│")[1].strip(): line for line in queue.stdout.splitlines() if line.startswith("│")}
    assert "FAILED" in rows["3"] and "rank 1: exit 4" in rows["3"], queue.stdout
    assert "FAILED_SETUP" in rows["4"] and "rank 1: exit 3" in rows["4"], queue.stdout
    status = _cli({**cli_env, "COLUMNS": "80"}, "status")
    assert kept in status.stdout and max(len(line) for line in status.stdout.splitlines()) <= 80


def test_ssh_without_a_rank_runs_the_command_on_the_head(cli_env: dict[str, str], kept: str) -> None:  # noqa: F811
    result = _cli(cli_env, "ssh", kept, "echo", "head-says-hi")
    assert result.returncode == 0, result.stderr
    assert "head-says" in result.stdout and "invalid int" not in result.stderr


def test_sdk_launch_streams_the_logs_by_default(cli_env: dict[str, str], kept: str, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "sdk_launch.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import airflow_sky as sky

            task = sky.Task(name="sdk-stream", num_nodes=2, run='echo "streamed from $SKYPILOT_NODE_RANK"')
            job_id, handle = sky.launch(task, cluster_name={kept!r}, no_setup=True)
            print("JOB", job_id)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], env=cli_env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(head, rank=0, pid=" in result.stdout and "streamed from 0" in result.stdout, result.stdout
    assert "streamed from 1" in result.stdout


def test_a_recovery_is_shown_live_with_every_rank_of_the_new_generation(
    cli_env: dict[str, str],  # noqa: F811
    yamls: Path,
    kept: str,
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_sky.client.cli",
            "launch",
            "-c",
            kept,
            str(yamls / "recovers.yaml"),
            "-y",
        ],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if "up on 1 gen 0" in line:
            preempted = _cli(cli_env, "local", "preempt", kept, "1")
            assert preempted.returncode == 0, preempted.stdout + preempted.stderr
            break
    rest, _ = proc.communicate(timeout=600)
    out = "".join(seen) + rest
    assert proc.returncode == 0, out
    assert "⟳ RECOVER: node of rank 1 lost; relaunching the job as generation 1" in out, out
    assert "up on 1 gen 1" in out and "done on 1" in out and "done on 0" in out, out
    # The replacement node's setup is shown live too, after the recovery's line. (Not necessarily before the
    # new generation's first run line: each rank's setup and run logs are read by readers of their own.)
    after = out.split("⟳ RECOVER", 1)[1]
    assert "(setup worker1, rank=1, " in after and "set up on 1" in after, out
    assert "pid=?" not in out
    # `ssh <cluster>-worker1` reaches the replacement node, with its host key (not the lost node's).
    nodes = LocalCloud().nodes(kept)
    directory = Path(cli_env["AIRFLOW_SKY_HOME"]) / "ssh"
    assert (directory / f"{kept}.known_hosts").read_text() == ssh_config.known_hosts_text(nodes)
    assert f"HostName {nodes[1].ssh_host}" in (directory / f"{kept}.config").read_text()


def test_setup_of_a_one_node_task_on_the_three_node_cluster_sees_one_node(
    cli_env: dict[str, str],  # noqa: F811
    yamls: Path,
    kept: str,
) -> None:
    launched = _cli(cli_env, "launch", "-c", kept, str(yamls / "one_node.yaml"), "-y")
    out = launched.stdout + launched.stderr
    assert launched.returncode == 0, out
    for rank in range(3):
        assert f"one-node setup rank={rank} nodes=1 ips=3" in out, out
    assert "one-node run nodes=1" in out, out


def test_autostop_then_stop_start_and_down_yes(cli_env: dict[str, str], kept: str) -> None:  # noqa: F811
    armed = _cli(cli_env, "autostop", kept, "-i", "60")
    assert armed.returncode == 0, armed.stdout + armed.stderr
    assert "stop themselves after 60 idle minutes" in armed.stdout
    cancelled = _cli(cli_env, "autostop", kept, "--cancel")
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stderr
    stopped = _cli(cli_env, "stop", kept, "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "STOPPED" in _cli(cli_env, "status", kept).stdout
    started = _cli(cli_env, "start", kept)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "UP" in _cli(cli_env, "status", kept).stdout
    again = _cli(cli_env, "ssh", kept, "1", "echo", "back")
    assert again.returncode == 0 and "back" in again.stdout, again.stderr
    down = _cli(cli_env, "down", kept, "-y")
    assert down.returncode == 0 and f"Cluster {kept} terminated." in down.stdout
    assert daemon.processes_with_marker(kept) == []
