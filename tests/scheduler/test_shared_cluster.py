"""Two runs of a DAG share one named cluster with `down=True`, under a real Airflow (`airflow standalone`,
see stack_driver.py): the first to finish does not tear the cluster down under the second, and the
cluster is gone after the last (SkyPilot's `--down`: the cluster goes once idle)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from tests.scheduler.stack import run_stack, terminate_clusters

# The stack's own deadline, not pytest's 600 s default, bounds it: run_stack waits up to 900 s,
# also on a loaded machine.
pytestmark = pytest.mark.timeout(1000)

CLUSTER = "shared-down"

# The first job to start its run on the cluster is short, the other long: the short run's teardown comes
# while the long job still runs on the same node.
RUN = r"""
if mkdir "$PROBE/first" 2>/dev/null; then role=short; sleep 2; else role=long; sleep 45; fi
echo "$role $SKYPILOT_TASK_ID" >> "$PROBE/done"
"""

DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

with DAG("shared_cluster_job", schedule=None) as dag:
    job = Task(name="shared", num_nodes=1, envs={{"PROBE": {probe!r}}}, run={run!r})
    sky_job(job, cluster_name={cluster!r}, down=True)
"""


def _time(ti: dict[str, str], field: str) -> datetime:
    return datetime.fromisoformat(ti[field])


def test_the_first_run_to_finish_keeps_a_shared_cluster_up_and_the_last_one_ends_it(tmp_path: Path):
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    probe = tmp_path / "probe"
    probe.mkdir()
    (home / "dags" / "shared_cluster_job.py").write_text(
        DAG.format(probe=str(probe), cluster=CLUSTER, run=RUN)
    )
    config = {"home": str(home), "batch": {"shared_cluster_job": 2}, "timeout_s": 600}
    try:
        report, log = run_stack(tmp_path, config, timeout_s=900)
        context = json.dumps(report, indent=1)[:8000] + "\n" + log[-6000:]
        assert "error" not in report, context
        runs = report["runs"]
        assert [run["state"] for run in runs] == ["success", "success"], context

        # Both jobs ran to their end on the one cluster: the short one's teardown did not end the long one.
        done = sorted(line.split()[0] for line in (probe / "done").read_text().splitlines())
        assert done == ["long", "short"], done
        tis = {
            run["run_id"]: {
                ti["task_id"].split(".")[-1]: ti for ti in run["task_instances"] if ti["map_index"] in (-1, 0)
            }
            for run in runs
        }
        first, last = sorted(tis.values(), key=lambda t: _time(t["teardown"], "end_date"))
        # The first teardown ended while the other run's job still ran.
        assert _time(first["teardown"], "end_date") < _time(last["run_follow"], "end_date"), context

        logs = {
            path.read_text(errors="replace")
            for path in (home / "logs" / "dag_id=shared_cluster_job").rglob("*.log")
            if "task_id=shared.teardown" in str(path)
        }
        kept = [text for text in logs if f"Keeping cluster {CLUSTER} up:" in text]
        ended = [text for text in logs if f"Tearing down cluster {CLUSTER}" in text]
        assert len(kept) == 1 and len(ended) == 1, logs
        assert "still uses it. Down is requested" in kept[0]

        # The cluster is gone after the last job, and nothing of it runs.
        assert CLUSTER not in LocalCloud().clusters() and LocalCloud().nodes(CLUSTER) == []
        assert daemon.processes_with_marker(CLUSTER) == []
    finally:
        terminate_clusters(CLUSTER)
