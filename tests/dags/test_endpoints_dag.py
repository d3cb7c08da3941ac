"""A DAG reads a job's endpoints: the provision task's `endpoints` XCom (`airflow dags test`, real local
nodes); the provision task's log names the fields that have no effect on its infra."""

from __future__ import annotations

import json

from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud


def _dag(cluster: str, probe: str) -> str:
    return f"""
from airflow.sdk import DAG, task
from airflow_sky import Resources, Task, sky_job

sky_task = Task(name="ep", num_nodes=2, resources=Resources(ports=[8080, "9000-9001"], disk_tier="best", labels={{"team": "ml"}}), run="echo up")
with DAG("endpoints", schedule=None) as dag:
    group = sky_job(sky_task, cluster_name={cluster!r}, down=False)

    @task
    def read_endpoints(ti=None):
        endpoints = ti.xcom_pull(task_ids="ep.provision", key="endpoints")
        open({probe!r}, "w").write(__import__("json").dumps(endpoints))

    group >> read_endpoints()
"""


def test_provision_pushes_each_ports_endpoint_on_the_head_and_logs_what_has_no_effect(run_dag, tmp_path):
    probe = tmp_path / "endpoints.json"
    try:
        result = run_dag("endpoints", _dag("ep-dag", str(probe)))
        assert result.returncode == 0, result.digest
        head = LocalCloud().nodes("ep-dag")[0].internal_ip
        assert json.loads(probe.read_text()) == {
            "8080": f"{head}:8080",
            "9000": f"{head}:9000",
            "9001": f"{head}:9001",
        }
        assert "ep.provision: no effect on local: resources.disk_tier, resources.labels (" in result.output
    finally:
        LocalCloud().terminate("ep-dag")
    assert daemon.processes_with_marker("ep-dag") == []
    assert not layout.cluster_dir("ep-dag").exists()
