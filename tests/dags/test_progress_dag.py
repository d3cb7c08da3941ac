"""A job's progress through a real Airflow run (`airflow dags test`, real local nodes), its follow tasks
blocking or deferred (the trigger, run inline by `dags test`, collects): their logs show each rank's compact
progress line, never a report line; each rank's record holds its steps,
the final metrics are in XCom (collect's, the head follow task's, and `job_progress(group)` downstream), and
with StatsD on the job's gauges reach a real UDP socket standing in for the StatsD server."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_sky.gang.gang_job import GangJob
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.registry import open_cluster
from tests.dags.conftest import DagRunResult

# Each rank reports steps 1..4 (loss = 10 * step + rank), one a second, among plain lines, stamped with the
# time as airflow_sky.progress.report() does (a follow task that starts late reads them all at once).
RUN = (
    "for i in 1 2 3 4; do "
    'echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"total\\":4,\\"time\\":$(date +%s.%N),'
    '\\"metrics\\":{\\"loss\\":$((i * 10 + SKYPILOT_NODE_RANK)),\\"tokens/s\\":100}}"; '
    'echo "plain $i"; sleep 1; done'
)


def _dag(dag_id: str, cluster: str, deferrable: bool, probe: Path) -> str:
    return f"""
from airflow.sdk import DAG, task
from airflow_sky import Task, sky_job
from airflow_sky.dags.results import job_progress

sky_task = Task(name="prog", num_nodes=2, run={RUN!r})
with DAG({dag_id!r}, schedule=None) as dag:
    group = sky_job(
        sky_task, cluster_name={cluster!r}, down=False,
        deferrable={deferrable!r}, defer_after_s=0, trigger_min_wait_s=0,
    )

    @task
    def keep(progress):
        open({str(probe)!r}, "w").write(__import__("json").dumps(progress))

    keep(job_progress(group))
"""


def _gauges(sock: socket.socket) -> list[str]:
    lines: list[str] = []
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            lines += sock.recv(65536).decode().splitlines()
    return [line for line in lines if "airflow_sky.job." in line]


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferred"])
def test_each_ranks_steps_are_recorded_the_final_metrics_are_in_xcom_and_statsd_gets_the_gauges(
    run_dag: Callable[..., DagRunResult], airflow_home: dict[str, str], tmp_path: Path, deferrable: bool
) -> None:
    dag_id = "progress_deferred" if deferrable else "progress"
    cluster = "progress-d" if deferrable else "progress-c"
    probe = tmp_path / "progress.json"
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    statsd.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # tags in the line, where a test can read them
    }
    try:
        result = run_dag(dag_id, _dag(dag_id, cluster, deferrable, probe), env=env)
        assert result.returncode == 0, result.digest
        # The follow tasks' logs show the ranks' plain lines and each rank's compact progress line, never
        # a report line.
        assert "plain 4" in result.output and "@@airflow-sky-progress" not in result.output, result.digest
        for rank, role in ((0, "head"), (1, "worker1")):
            line = f"({role}, rank={rank}, "
            shown = [x for x in result.output.splitlines() if line in x and ") progress: step 4/4 100%" in x]
            assert shown and f"loss={40 + rank} · tokens/s=100" in shown[-1], result.digest
        job = GangJob(open_cluster(cluster, "local"), 1)
        doc = job.progress()
        assert doc is not None, result.digest
        for row in doc["ranks"]:
            assert [point[1] for point in row["history"]] == [1, 2, 3, 4], row
        gauges = _gauges(statsd)
    finally:
        statsd.close()
        LocalCloud().terminate(cluster)
    expected_ranks = [
        {"rank": r, "step": 4, "metrics": {"loss": 40.0 + r, "tokens/s": 100.0}} for r in (0, 1)
    ]
    final = json.loads(probe.read_text())
    assert final["step"] == 4 and final["total"] == 4 and final["ranks"] == expected_ranks, final
    db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT task_id, map_index, value FROM xcom WHERE dag_id = ? AND key = 'progress'", (dag_id,)
        ).fetchall()
    pushed = {(task_id, index): json.loads(value) for task_id, index, value in rows}
    assert set(pushed) == {("prog.collect", -1), ("prog.run_follow", 0)}, rows
    assert pushed["prog.collect", -1] == final
    # The head's follow task ended first (`airflow dags test` runs rank 1's follow after): its own rank's
    # last step at least.
    assert pushed["prog.run_follow", 0]["ranks"][0] == expected_ranks[0]
    # The gauges, from the follower holding the run's watch: names, tags and the last values.
    tags = f",dag_id={dag_id},cluster={cluster},sky_job=1"
    for name in (
        "step",
        "percent",
        "eta_seconds",
        "steps_per_second",
        "recoveries",
        "metric.loss",
        "metric.tokens_s",
    ):
        assert any(line.startswith(f"airflow.airflow_sky.job.{name}{tags}:") for line in gauges), (
            name,
            gauges,
        )
    assert f"airflow.airflow_sky.job.step{tags}:4|g" in gauges, gauges
    assert f"airflow.airflow_sky.job.step.{dag_id}.{cluster}.1:4|g" in gauges, gauges  # the legacy name
    assert daemon.processes_with_marker(cluster) == []


def test_a_failed_job_keeps_the_heads_last_metrics_in_xcom(
    run_dag: Callable[..., DagRunResult], airflow_home: dict[str, str]
) -> None:
    # Rank 0 reports steps 1 and 2 and trains on; rank 1 fails: every rank is killed, the run fails.
    run = (
        'for i in 1 2; do echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"metrics\\":{\\"loss\\":$i}}"; done; '
        'if [ "$SKYPILOT_NODE_RANK" = 1 ]; then sleep 2; exit 3; fi; sleep 3600'
    )
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

with DAG("progress_failed", schedule=None) as dag:
    sky_job(Task(name="prog", num_nodes=2, run={run!r}), cluster_name="progress-f")
"""
    result = run_dag("progress_failed", source)
    assert result.returncode != 0 and "rank 1 failed with exit code 3" in result.output, result.digest
    db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT task_id, map_index, value FROM xcom WHERE dag_id = 'progress_failed' AND key = 'progress'"
        ).fetchall()
    assert [(task_id, index) for task_id, index, _ in rows] == [("prog.run_follow", 0)], rows
    final = json.loads(rows[0][2])
    assert final["ranks"][0] == {"rank": 0, "step": 2, "metrics": {"loss": 2.0}}, final
    assert daemon.processes_with_marker("progress-f") == []
