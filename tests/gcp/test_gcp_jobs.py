"""A whole sky_job on the gcp infra, through real Airflow (`airflow dags test`).

The google clients talk to fakes of GCE and GCS (no emulator exists: responses in the documented shapes);
local nodes play the VMs (tests/play_nodes.py, test-only). A spot preemption is what GCE does: the VM is
deleted with a `compute.instances.preempted` operation left behind, and the machine playing it dies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.cloud import ENDPOINT_RESOLVER_ENV
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.gcp.conftest import REGION
from tests.gcp.fake_gce import FakeGce
from tests.play_nodes import PLAY_ENV, lose_when_started

REPO = Path(__file__).resolve().parents[2]


def _preempt(gce: FakeGce, cluster: str) -> str:
    """A spot preemption as GCE does it: rank 1's VM is deleted, its preemption operation left behind."""
    with gce.lock:
        name = next(
            n
            for n, vm in gce.instances.items()
            if vm["labels"].get(vms.LABEL_CLUSTER) == cluster and vm["labels"].get(vms.LABEL_RANK) == "1"
        )
    gce.preempt(name)
    return name


def test_a_spot_job_on_gcp_runs_recovers_a_preempted_rank_and_leaves_no_vm(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    gce: FakeGce,
    gplay: dict[str, Any],
) -> None:
    cluster = "gcp-e2e"
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

task = Task(
    name="spotjob",
    num_nodes=2,
    resources=Resources(infra="gcp/{REGION}", instance_type="n2-standard-8", use_spot=True),
    envs={{"PROBE": {str(tmp_path)!r}}},
    setup='echo "$SKYPILOT_SETUP_NODE_RANK" >> "$PROBE/setups"',
    run='echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT $SKYPILOT_NUM_NODES" >> "$PROBE/starts"; '
        'echo "$SKYPILOT_CLUSTER_INFO" > "$PROBE/info-$SKYPILOT_NODE_RANK"; sleep 6',
)
with DAG("gcp_spot_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=True)
"""
    env = {k: os.environ[k] for k in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", ENDPOINT_RESOLVER_ENV, PLAY_ENV)}
    env["PYTHONPATH"] = str(REPO)  # the resolver lives in the tests package
    preempter = lose_when_started(tmp_path, gplay, lambda: _preempt(gce, cluster))
    result = run_dag("gcp_spot_job", source, env=env)
    preempter.join(timeout=1)
    assert result.returncode == 0, result.digest
    starts = [line.split() for line in (tmp_path / "starts").read_text().splitlines()]
    by_generation = {g: sorted(s[0] for s in starts if s[1] == g) for g in ("0", "1")}
    assert by_generation == {"0": ["0", "1"], "1": ["0", "1"]}, starts
    assert "RECOVER: node of rank 1 lost" in result.output
    assert sorted((tmp_path / "setups").read_text().split()).count("1") == 2  # the new VM was set up
    info = json.loads((tmp_path / "info-0").read_text())
    assert (info["cloud"], info["region"], info["cluster_name"]) == ("gcp", REGION, cluster)
    assert gce.live(cluster) == [] and vms.internal_firewall(cluster) not in gce.firewalls
