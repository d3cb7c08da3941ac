"""A spot job on gcp acts on its preemption notice, end to end (`airflow dags test`; the GCE fake, local
nodes playing the VMs, tests/metadata_standin.py playing the metadata server): the warned node runs its
preemption hook and its job checkpoints on SIGTERM; GCE still says the VM runs, so the fault waits until
the VM is preempted, then the job recovers on a new VM with no step done twice."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from airflow_sky.infra.gcp import vms
from airflow_sky.infra.gcp.cloud import ENDPOINT_RESOLVER_ENV
from tests.aws.test_aws_notice_job import TRAIN
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.gcp.conftest import REGION
from tests.gcp.fake_gce import FakeGce
from tests.metadata_standin import metadata_standin, steps_by_generation, warn_a_rank
from tests.play_nodes import PLAY_ENV, play_node_index

REPO = Path(__file__).resolve().parents[2]


def test_a_spot_rank_warned_by_the_metadata_server_checkpoints_runs_its_hook_and_resumes_on_a_new_vm(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    gce: FakeGce,
    gplay: dict[str, Any],
) -> None:
    cluster = "gcp-notice"
    hook = 'touch "$PROBE/hook-$SKYPILOT_NODE_RANK"'
    spec = {
        "name": "noticejob",
        "num_nodes": 2,
        "resources": {"infra": f"gcp/{REGION}", "instance_type": "n2-standard-8", "use_spot": True},
        "envs": {"PROBE": str(tmp_path)},
        "run": TRAIN,
        "config": {"hooks": [{"run": hook, "events": ["preemption"], "timeout": 20}]},
    }
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task.from_dict({spec!r})
with DAG("gcp_notice_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=True)
"""
    env = {k: os.environ[k] for k in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", ENDPOINT_RESOLVER_ENV, PLAY_ENV)}
    env["PYTHONPATH"] = str(REPO)  # the resolver lives in the tests package
    warned: list[str] = []
    with metadata_standin() as standin:

        def preempt() -> None:
            rank = warn_a_rank(standin, tmp_path)
            if rank is None:
                return
            warned.append(rank)
            with gce.lock:
                name = next(
                    n
                    for n, vm in gce.instances.items()
                    if vm["labels"].get(vms.LABEL_CLUSTER) == cluster
                    and vm["labels"].get(vms.LABEL_RANK) == warned[0]
                )
            gce.preempt(name)  # then GCE takes the VM, and the machine playing it dies with it
            from airflow_sky.infra.local.cloud import LocalCloud

            LocalCloud().preempt(gplay["cluster"], play_node_index(name))

        thread = threading.Thread(target=preempt, daemon=True)
        thread.start()
        result = run_dag("gcp_notice_job", source, env={**env, "AIRFLOW__SKY__METADATA_URL": standin.url})
        thread.join(timeout=5)
        assert standin.told == 1
    assert result.returncode == 0, result.digest
    assert len(warned) == 1, warned
    rank, other = warned[0], "1" if warned[0] == "0" else "0"
    assert "after its node said a preemption notice came: waiting up to 60 s" in result.output, result.digest
    assert f"RECOVER: node of rank {rank} lost" in result.output
    assert (tmp_path / f"hook-{rank}").exists() and not (tmp_path / f"hook-{other}").exists()
    for r in "01":
        steps = steps_by_generation(tmp_path, int(r))
        assert steps["1"][0] == steps["0"][-1] + 1, (r, steps["0"][-3:], steps["1"][:3])
        assert steps["1"][-1] == 80
    assert gce.live(cluster) == []
