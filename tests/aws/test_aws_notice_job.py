"""A spot job on aws acts on its interruption notice, end to end (`airflow dags test`; moto plays EC2, local
nodes play the instances, tests/metadata_standin.py plays the instance metadata service): the node that got
the notice runs its preemption hook and its job checkpoints on SIGTERM; EC2 still says the instance runs,
so the fault waits until the instance is terminated, then the job recovers on a new instance with no step
done twice."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from tests.aws.conftest import REGION, boto, live_instances, play_dag_env
from tests.aws.test_aws_contract import TEST_IMAGE_PARAMETER, published_image  # noqa: F401 - fixture
from tests.aws.test_aws_jobs import _rank_instance
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.metadata_standin import metadata_standin, steps_by_generation, warn_a_rank
from tests.play_nodes import play_node_index

# Steps every 0.2 s to 80; a checkpoint per rank in the probe dir on SIGTERM (and every 20 steps); resumes.
TRAIN = """\
python3 - <<'EOF'
import json, os, signal, sys, time
rank, gen = os.environ["SKYPILOT_NODE_RANK"], os.environ["AIRFLOW_SKY_RECOVERY_COUNT"]
probe = os.environ["PROBE"]
path = f"{probe}/ckpt-{rank}.json"
step = json.load(open(path))["step"] if os.path.exists(path) else 0
print(f"rank {rank} generation {gen} from step {step}", flush=True)
def save(*_):
    json.dump({"step": step}, open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
def stop(*_):
    save()
    open(f"{probe}/sigterm-{rank}-{gen}", "w").write(str(step))
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(f"{probe}/up-{rank}-{gen}", "w").close()
while step < 80:
    step += 1
    open(f"{probe}/steps-{rank}", "a").write(f"{gen} {step}\\n")
    if step % 20 == 0:
        save()
    time.sleep(0.2)
save()
EOF
"""


def test_a_spot_rank_warned_by_imds_checkpoints_runs_its_hook_and_resumes_on_a_new_instance(
    run_dag: Any,  # noqa: F811
    tmp_path: Path,
    moto_endpoint: str,
    play: dict[str, Any],
    published_image: str,  # noqa: F811
) -> None:
    cluster = "aws-notice"
    hook = 'touch "$PROBE/hook-$SKYPILOT_NODE_RANK"; echo "hook on rank $SKYPILOT_NODE_RANK"'
    spec = {
        "name": "noticejob",
        "num_nodes": 2,
        "resources": {
            "infra": f"aws/{REGION}",
            "instance_type": "m6i.2xlarge",
            "use_spot": True,
            "image_id": f"resolve:ssm:{TEST_IMAGE_PARAMETER}",
        },
        "envs": {"PROBE": str(tmp_path)},
        "run": TRAIN,
        "config": {"hooks": [{"run": hook, "events": ["preemption"], "timeout": 30}]},
    }
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task.from_dict({spec!r})
with DAG("aws_notice_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=True)
"""
    warned: list[str] = []
    with metadata_standin() as standin:

        def interrupt() -> None:
            rank = warn_a_rank(standin, tmp_path)
            if rank is None:
                return
            warned.append(rank)
            # Then AWS takes the instance (and the machine playing it dies with it).
            instance = _rank_instance(moto_endpoint, cluster, int(warned[0]))
            assert instance is not None
            boto("ec2", moto_endpoint).terminate_instances(InstanceIds=[instance])
            from airflow_sky.infra.local.cloud import LocalCloud

            LocalCloud().preempt(play["cluster"], play_node_index(instance))

        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        result = run_dag(
            "aws_notice_job", source, env={**play_dag_env(), "AIRFLOW__SKY__METADATA_URL": standin.url}
        )
        thread.join(timeout=5)
        assert standin.told == 1
    assert result.returncode == 0, result.digest
    assert len(warned) == 1, warned
    rank = warned[0]
    other = "1" if rank == "0" else "0"
    assert "after its node said a preemption notice came: waiting up to 150 s" in result.output, result.digest
    assert f"RECOVER: node of rank {rank} lost" in result.output
    assert (tmp_path / f"hook-{rank}").exists() and not (tmp_path / f"hook-{other}").exists()
    # Both ranks checkpointed on SIGTERM (the warned one on its notice, the other on the relaunch) and the
    # new generation started at the next step: no step done twice.
    for r in "01":
        steps = steps_by_generation(tmp_path, int(r))
        assert steps["1"][0] == steps["0"][-1] + 1, (r, steps["0"][-3:], steps["1"][:3])
        assert steps["1"][-1] == 80
    assert re.search(rf"rank {rank} generation 1 from step [1-9]", result.output)
    assert live_instances(moto_endpoint, cluster) == []
