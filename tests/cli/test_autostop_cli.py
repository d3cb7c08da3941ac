"""`airflow-sky launch -i N [--down]`: the cluster outlives the launch and its nodes end themselves when idle."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_sky.gang.fleet import FleetReader
from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from tests.cli.test_launch_cli import PROBE, _cli, cli_env  # noqa: F401 - the module's CLI environment

# The watchers' round: -i 0 is raised to two of them (30 s). Shorter, and a loaded machine's gap between the
# provision task (which arms the watchers) and the sync task (11 s once in CI) stopped the nodes under the DAG.
CHECK_S = "15"


def _wait_for_statuses(cluster: str, expected: list[NodeStatus], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if [n.status for n in LocalCloud().nodes(cluster)] == expected:
            return
        time.sleep(0.5)
    raise AssertionError(f"{cluster}: {[n.status for n in LocalCloud().nodes(cluster)]} != {expected}")


def _wait_for_no_processes(cluster: str) -> None:
    deadline = time.monotonic() + 10
    while daemon.processes_with_marker(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert daemon.processes_with_marker(cluster) == []


def test_idle_minutes_with_down_leaves_the_cluster_to_end_itself_once_idle(
    cli_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    task = tmp_path / "probe.yaml"
    task.write_text(PROBE)
    env = {**cli_env, "AIRFLOW_SKY_AUTOSTOP_CHECK_S": CHECK_S}  # -i 0: stops 30 s (two rounds) after the job
    result = _cli(env, "launch", "-c", "idle-down", str(task), "-y", "-i", "0", "--down")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "hi there from rank 1 of 2" in result.stdout
    _wait_for_statuses("idle-down", [])  # no teardown ran: the nodes ended themselves
    _wait_for_no_processes("idle-down")
    assert "idle-down" not in LocalCloud().clusters()  # its node dirs went with the nodes
    # The fleet reader finds it gone and ends its ledger record, saying how.
    [ended] = [
        r for r in FleetReader(LocalCloud(), "local").read(ended_since=0) if r["cluster"] == "idle-down"
    ]
    assert ended["status"] == "TERMINATED" and "autodown" in ended["events"][-1][3], ended["events"]


def test_idle_minutes_without_down_stops_the_nodes_and_the_next_launch_starts_them_again(
    cli_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    task = tmp_path / "probe.yaml"
    task.write_text(PROBE.replace('echo "$GREETING', 'cat ~/mark 2>/dev/null; touch ~/mark; echo "$GREETING'))
    env = {**cli_env, "AIRFLOW_SKY_AUTOSTOP_CHECK_S": CHECK_S}
    first = _cli(env, "launch", "-c", "idle-stop", str(task), "-y", "-i", "0")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # The limit printed is the one the watchers apply: two of their 15 s rounds, not the 0 asked for.
    assert "its nodes stop themselves after 30 idle seconds (-i 0 is raised to the shortest" in first.stdout
    _wait_for_statuses("idle-stop", [NodeStatus.STOPPED, NodeStatus.STOPPED])
    assert "STOPPED" in _cli(env, "status", "idle-stop").stdout
    # An exec on the stopped cluster is pointed at `start` (its nodes keep their setup), not at a launch.
    refused = _cli(env, "exec", "idle-stop", str(task))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    error = next(line for line in refused.stderr.splitlines() if line.startswith("airflow-sky: error:"))
    assert "cluster 'idle-stop' is stopped" in error
    assert "airflow-sky start idle-stop" in error and "launch" not in error
    second = _cli(env, "launch", "-c", "idle-stop", str(task), "-y", "--down")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Reusing" in second.stdout or second.stdout.count("hi there") == 2
    assert LocalCloud().nodes("idle-stop") == []
    _wait_for_no_processes("idle-stop")
