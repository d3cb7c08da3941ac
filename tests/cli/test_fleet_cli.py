"""The fleet on the local infra, through the real CLI and the fleet reader the Sky page uses: a cluster's
owner, idle time and cost columns in `status`, a job cancelled and an idle cluster downed as the page does,
nodes that stopped themselves found and taken off the bill, and `cost-report` with the torn-down cluster."""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.gang import fleet
from airflow_sky.infra import ledger
from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from tests.cli.test_launch_cli import _cli, cli_env  # noqa: F401 - the module's CLI environment

LONG = """\
name: long
num_nodes: 2
run: |
  echo "rank $SKYPILOT_NODE_RANK up"; sleep 600
"""


def _view(name: str) -> dict:
    [row] = [r for r in fleet.FleetReader(LocalCloud(), "local").read(ended_since=0) if r["cluster"] == name]
    return row


def _wait(check, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_the_fleet_shows_owner_jobs_idle_and_cost_and_its_actions_cancel_stop_and_down(
    cli_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    task = tmp_path / "long.yaml"
    task.write_text(LONG)
    launched = _cli(cli_env, "launch", "-c", "fleet-a", str(task), "-y", "--detach-run")
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    cluster = Cluster("fleet-a", "local", LocalCloud())

    row = _view("fleet-a")
    assert row["status"] == "UP" and row["nodes"] == 2 and row["billing"] is None
    assert row["owner"]["user"] == getpass.getuser() and row["owner"]["via"] == "cli"
    assert [e[1] for e in row["events"]] == ["provisioned"]
    [job] = row["jobs"]
    assert (job["job_id"], job["name"], job["status"]) == (1, "long", "RUNNING")
    assert row["idle_since"] is None and row["cost"] == 0.0

    status = _cli(cli_env, "status", "fleet-a")
    assert status.returncode == 0, status.stderr
    header = next(line for line in status.stdout.splitlines() if "NAME" in line)
    assert all(column in header for column in ("COST/HR", "IDLE", "OWNER"))
    line = next(line for line in status.stdout.splitlines() if "fleet-a" in line)
    assert "$0.00" in line and getpass.getuser() in line

    # The page's down refuses a cluster with a live job; its cancel stops the job.
    with pytest.raises(ClusterError, match="not idle: job"):
        fleet.down_idle(cluster, print, "alice")
    assert fleet.job_dag(cluster, 1) is not None
    assert fleet.cancel_job(cluster, 1, "alice") is True
    _wait(lambda: _view("fleet-a")["jobs"][0]["status"] == "CANCELLED", "the job was cancelled")
    row = _view("fleet-a")
    assert row["idle_since"] is not None and [e[1] for e in row["events"]][-1] == "job cancelled"

    # Nodes whose autostop watcher stopped them: the reader finds them and takes them off the bill.
    cluster.record_autostop({"idle_minutes": 1, "down": False})
    action = LocalCloud().autostop_action("fleet-a", down=False)
    for node in cluster.nodes():
        with cluster.client(node) as client:
            client.exec(f"nohup sh -c 'sleep 1; {action}' >/dev/null 2>&1 &", timeout=30)
    _wait(lambda: all(n.status is NodeStatus.STOPPED for n in cluster.nodes()), "the nodes stopped")
    row = _view("fleet-a")
    assert row["events"][-1][1] == "autostopped" and row["cost_per_hour"] == 0.0
    assert ledger.open_ranks(cluster.ledger_record() or {}) == {}

    # An idle cluster downed as the page does it: its down hooks, then the nodes, then the record is ended.
    _cli(cli_env, "start", "-y", "fleet-a")
    fleet.down_idle(cluster, print, "alice")
    assert "fleet-a" not in LocalCloud().clusters() and daemon.processes_with_marker("fleet-a") == []

    report = _cli(cli_env, "cost-report", "--infra", "local", "--json")
    assert report.returncode == 0, report.stderr
    [ended] = [r for r in json.loads(report.stdout)["clusters"] if r["cluster"] == "fleet-a"]
    assert ended["status"] == "TERMINATED" and ended["cost"] == 0.0
    kinds = [e[1] for e in ended["events"]]
    assert kinds == ["provisioned", "job cancelled", "autostopped", "started", "down", "torn down"], kinds
    table = _cli(cli_env, "cost-report")
    assert table.returncode == 0 and "fleet-a" in table.stdout and "Total: $0.00" in table.stdout
