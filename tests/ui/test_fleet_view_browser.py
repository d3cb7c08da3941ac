"""The Sky page under a real Airflow (scheduler, triggerer, API server; fleet_driver.py) with clusters on
local, an ssh node pool of real sshd hosts and aws (moto), watched in headless Chromium:

- the plugin's nav entry is registered and Airflow's page for it frames the Sky page;
- the page lists each cluster with its owner (the DAG run, the user who triggered it), node count, status,
  cost per hour (aws's spot price from the catalog; nothing for local and ssh) and events; the local
  cluster's preempted and replaced rank 1 shows as two events;
- a viewer sees it read-only and the down API refuses them (403); the admin downs the idle local cluster
  from the page, which then shows it torn down, and the infra no longer has it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from airflow_sky.infra import catalog
from tests.scheduler.stack import run_in_private_network, terminate_clusters

pytest.importorskip("playwright")

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fleet-view")
    probe = tmp / "probe"
    probe.mkdir()
    home = tmp / "airflow"
    (home / "dags").mkdir(parents=True)
    config = {"home": str(home), "probe": str(probe), "pool": "fleetpool", "timeout_s": 420}
    try:
        driver, report_path = run_in_private_network(
            [sys.executable, "-m", "tests.ui.fleet_driver"], tmp, config, timeout_s=1100
        )
        log_path = home / "standalone.log"
        log = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
        assert driver.returncode == 0 and report_path.exists(), driver.stdout + driver.stderr[-5000:] + log
        report: dict[str, Any] = json.loads(report_path.read_text())
        report["context"] = json.dumps(report, indent=1)[-12000:] + "\n--- standalone.log\n" + log
        return report
    finally:
        terminate_clusters("fleet")  # a failed run leaves its local clusters (and play nodes) up


def _row(view: dict[str, Any], cluster: str) -> dict[str, Any]:
    return next(c for c in view["clusters"] if c["cluster"] == cluster)


def test_the_nav_entry_opens_the_sky_page(fleet: dict[str, Any]) -> None:
    assert "error" not in fleet, fleet["context"]
    assert [v["name"] for v in fleet["plugin"]] == ["Sky"], fleet["plugin"]
    assert fleet["nav"] is not None and "/airflow-sky/fleet" in fleet["nav"], (
        fleet.get("nav_frames"),
        fleet.get("nav_iframes"),
        fleet.get("nav_pages"),
    )


def test_the_page_lists_each_infras_cluster_with_owner_nodes_status_cost_and_events(
    fleet: dict[str, Any],
) -> None:
    assert fleet["runs"] == {"fleet_local": "success", "fleet_ssh": "success", "fleet_aws": "success"}, fleet[
        "context"
    ]
    view = fleet["admin_view"]
    local, ssh, aws = (_row(view, c) for c in ("fleet-local", "fleet-ssh", "fleet-aws"))
    assert (local["infra"], ssh["infra"], aws["infra"]) == ("local", "ssh/fleetpool", "aws/us-east-1")
    for row, dag_id in ((local, "fleet_local"), (ssh, "fleet_ssh"), (aws, "fleet_aws")):
        assert row["status"] == "UP" and dag_id in row["cells"]["owner"] and "admin" in row["cells"]["owner"]
        assert row["events"][0]["kind"] == "provisioned"
    assert local["cells"]["nodes"] == "2" and ssh["cells"]["nodes"] == "2"
    assert aws["cells"]["nodes"] == "1 \u00d7 m6i.large (spot)"
    assert local["cells"]["cost_per_hour"] == "$0.00" and ssh["cells"]["cost_per_hour"] == "$0.00"
    spot = [o.spot_price for o in catalog.offerings("aws") if o.instance_type == "m6i.large" and o.spot_price]
    shown = float(aws["cells"]["cost_per_hour"].lstrip("$"))
    assert any(abs(shown - price) < 0.01 for price in spot), aws["cells"]
    # Rank 1 of the local cluster: preempted, then replaced (two events).
    rank_1 = [e["kind"] for e in local["events"] if e["rank"] == "1"]
    assert rank_1 == ["preempted", "replaced"], local["events"]
    assert "without a notice" in next(e["text"] for e in local["events"] if e["kind"] == "preempted")
    assert local["actions"] == ["stop", "down"] and local["cells"]["idle"] != "\u2013"
    assert catalog.meta()["as_of"] in view["catalog"]
    assert {(j["cluster"], j["status"]) for j in view["jobs"]} >= {("fleet-local", "SUCCEEDED")}


def test_a_viewer_sees_it_read_only_and_may_not_down_it(fleet: dict[str, Any]) -> None:
    local = _row(fleet["viewer_view"], "fleet-local")
    assert local["actions"] == [] and local["readonly"], local
    assert fleet["viewer_down"]["status"] == 403, fleet["viewer_down"]
    assert "edit access" in fleet["viewer_down"]["body"]
    assert fleet["unconfirmed_down"] == 400


def test_the_owner_downs_the_idle_cluster_from_the_page(fleet: dict[str, Any]) -> None:
    local = _row(fleet["after_down"], "fleet-local")
    assert local["status"] == "TERMINATED" and [e["kind"] for e in local["events"]][-2:] == [
        "down",
        "torn down",
    ]
    assert "down requested by admin" in local["events"][-2]["text"]
    assert "fleet-local" not in fleet["local_clusters"]
    assert fleet["cleanup"] == {"fleet-ssh": 200, "fleet-aws": 200}, fleet["context"]
    assert fleet["leftover_processes"] == [], fleet["leftover_processes"]
