"""A DAG run's `cost` XCom and `cost-report` on aws (moto): the catalog's price times the node-hours the fleet
ledger measured, for a spot and an on-demand job, through real Airflow (`airflow dags test`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_sky.infra import catalog
from tests.aws.conftest import REGION, boto, live_instances, play_dag_env
from tests.aws.test_aws_contract import TEST_IMAGE_PARAMETER, published_image  # noqa: F401 - fixture
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures

CLI = str(Path(sys.executable).parent / "airflow-sky")
INSTANCE_TYPE = "m6i.large"
RUN_S = 5


def _launch_times(endpoint: str, cluster: str) -> list[float]:
    ec2 = boto("ec2", endpoint)
    found = []
    for reservation in ec2.describe_instances(
        Filters=[{"Name": "tag:airflow-sky-cluster", "Values": [cluster]}]
    )["Reservations"]:
        found += [i["LaunchTime"].timestamp() for i in reservation["Instances"]]
    return found


def test_the_cost_xcom_and_cost_report_are_the_catalog_price_times_the_measured_node_hours(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    moto_endpoint: str,
    play: dict[str, Any],
    published_image: str,  # noqa: F811
) -> None:
    out = tmp_path / "costs.json"
    source = f"""
import json
from airflow.sdk import DAG, task
from airflow_sky import Resources, Task, sky_job

def job(name, spot):
    return Task(
        name=name,
        num_nodes=2,
        resources=Resources(
            infra="aws/{REGION}", instance_type="{INSTANCE_TYPE}", use_spot=spot,
            image_id="resolve:ssm:{TEST_IMAGE_PARAMETER}",
        ),
        run="sleep {RUN_S}",
    )

with DAG("aws_costs", schedule=None) as dag:
    spot = sky_job(job("spot", True), cluster_name="cost-spot", group_id="spot")
    demand = sky_job(job("demand", False), cluster_name="cost-demand", group_id="demand")

    @task
    def keep(ti=None):
        costs = {{g: ti.xcom_pull(task_ids=f"{{g}}.teardown", key="cost") for g in ("spot", "demand")}}
        open({str(out)!r}, "w").write(json.dumps(costs))

    spot >> demand >> keep()
"""
    started = time.time()
    result = run_dag("aws_costs", source, env=play_dag_env())
    ended = time.time()
    assert result.returncode == 0, result.digest
    costs = json.loads(out.read_text())
    assert "Cost: $" in result.output and f"node-hours of {INSTANCE_TYPE} spot" in result.output

    env = {**os.environ, **play_dag_env(), "AIRFLOW_SKY_HOME": str(tmp_path / "cli-home")}
    report = subprocess.run(
        [CLI, "cost-report", "--infra", "aws", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stdout + report.stderr
    rows = {r["cluster"]: r for r in json.loads(report.stdout)["clusters"]}

    for group, cluster, spot in (("spot", "cost-spot", True), ("demand", "cost-demand", False)):
        cost = costs[group]
        row = rows[cluster]
        assert row["status"] == "TERMINATED" and live_instances(moto_endpoint, cluster) == []
        zone = row["billing"]["zone"]
        offering = next(
            o for o in catalog.offerings("aws") if o.instance_type == INSTANCE_TYPE and o.zone == zone
        )
        price = offering.spot_price if spot else offering.price
        assert price is not None and price > 0
        assert (cost["instance_type"], cost["use_spot"], cost["hourly_per_node"]) == (
            INSTANCE_TYPE,
            spot,
            price,
        )
        assert row["billing"]["hourly"] == price and row["billing"]["use_spot"] is spot
        # What was measured: both nodes billed from the provision that brought them up to the teardown that
        # ended them, so at least the run's length each, and never more than the whole test run.
        launched = _launch_times(moto_endpoint, cluster)
        assert len(launched) == 2
        node_hours = cost["node_hours"]
        assert 2 * RUN_S / 3600 <= node_hours <= 2 * (ended - started) / 3600, cost
        assert abs(cost["cost"] - price * node_hours) < 1e-6, cost
        # The report reckons the same cluster the same way (the run's window holds the cluster's whole life).
        assert abs(row["cost"] - cost["cost"]) < 1e-5, (row, cost)
        spans = [e for e in row["events"] if e[1] in ("provisioned", "torn down")]
        assert [e[1] for e in spans] == ["provisioned", "torn down"], row["events"]
        # Each span starts once EC2 launched its instance.
        assert row["launched_at"] >= min(launched) - 1
    assert json.loads(report.stdout)["catalog_as_of"] == catalog.meta()["as_of"]
