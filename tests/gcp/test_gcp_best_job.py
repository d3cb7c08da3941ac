"""A `network_tier: best` sky_job on the gcp infra, through real Airflow (`airflow dags test`).

In a module of its own: its VMs are played by fresh local nodes, as GCE gives fresh machines (a play node
that already ran another cluster's job 1 keeps that job's record in its home). The google clients talk to
fakes of GCE and GCS (no emulator exists: responses in the documented shapes).
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
from tests.play_nodes import PLAY_ENV

REPO = Path(__file__).resolve().parents[2]


def test_a_best_network_job_on_a3_highgpu_gives_every_rank_the_tcpx_nccl_env_and_leaves_nothing(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    gce: FakeGce,
    gplay: dict[str, Any],
) -> None:
    """A 4-node H100:8 job with `network_tier: best` and ports: every rank's setup and run see the NCCL
    settings of the GPU NICs the cluster got; `down` removes the VMs, the placement policy and the rules."""
    cluster = "gcp-best"
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

task = Task(
    name="besttask",
    num_nodes=4,
    resources=Resources(
        infra="gcp/{REGION}", instance_type="a3-highgpu-8g", network_tier="best", ports=[6006, 8265],
        disk_tier="high", labels={{"team": "ml"}},
    ),
    envs={{"PROBE": {str(tmp_path)!r}}},
    setup='echo "$NCCL_GPUDIRECTTCPX_CTRL_DEV" > "$PROBE/setup-$SKYPILOT_SETUP_NODE_RANK"',
    run='echo "$NCCL_GPUDIRECTTCPX_SOCKET_IFNAME $NCCL_SOCKET_IFNAME" > "$PROBE/run-$SKYPILOT_NODE_RANK"',
)
with DAG("gcp_best_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=True)
"""
    conn = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    conn["extra"]["airflow_sky"]["gpu_networks"] = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    env = {k: os.environ[k] for k in (ENDPOINT_RESOLVER_ENV, PLAY_ENV)}
    env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(conn)
    env["PYTHONPATH"] = str(REPO)
    inserts = len(gce.inserts)
    result = run_dag("gcp_best_job", source, env=env)
    assert result.returncode == 0, result.digest
    probes = {p.name: p.read_text().split() for p in tmp_path.iterdir()}
    tcpx = ["eth1,eth2,eth3,eth4", "eth0"]
    assert probes == {f"setup-{r}": ["eth0"] for r in range(4)} | {f"run-{r}": tcpx for r in range(4)}, (
        probes,
        result.output[-6000:],
    )
    made = gce.inserts[inserts:]
    assert len(made) == 4 and all(n.startswith(f"{cluster}-") for n in made)
    assert gce.live(cluster) == [] and not [p for p in gce.policy_links() if f"/sky-{cluster}-" in p]
    assert vms.ports_firewall(cluster) not in gce.firewalls
