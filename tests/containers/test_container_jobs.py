"""`image_id: docker:<image>` on the local infra, end to end, on real parts: Podman on this machine (the
nodes' runtime), an image with PyTorch pulled from Debian's docker-registry on loopback with a password
(SkyPilot's SKYPILOT_DOCKER_* envs, the password a secret), moto's S3 for a MOUNT_CACHED bucket, real
Airflow (`airflow dags test`) and the real CLI.

- A 2-node job: setup and run execute inside the image on both ranks with SkyPilot's env, the workdir and the
  bucket are visible inside, torch.distributed (gloo) from the image rendezvouses across the two containers;
  rank 1 is preempted, and its replacement pulls the image and the job succeeds in generation 1.
- An `exec` on the kept cluster, of a task that names no image, runs in the same containers (a file the first
  job left outside its mounts is there); `down` leaves no container.
- A wrong password, a tag the registry does not have, an image without bash and a node without a runtime
  are one clear error each, naming the image, and leave no container and no node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from tests.containers import images
from tests.dags.conftest import airflow_home, run_dag  # noqa: F401 - `airflow dags test` fixtures
from tests.ports import free_port
from tests.s3server import S3Server

pytestmark = pytest.mark.timeout(1500)  # the image is built once per machine (debootstrap, PyTorch)

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
CLUSTER = "ctr-kept"
BUCKET = "ctr-ckpt"

# Each rank: SkyPilot's env, where it runs, the workdir's file, the setup's file, a gloo all-reduce over
# SKYPILOT_NODE_IPS, then its generation into the bucket (which tells the test when to preempt rank 1).
RUN = r"""
set -e
R=$SKYPILOT_NODE_RANK
G=$AIRFLOW_SKY_RECOVERY_COUNT
echo "probe rank=$R gen=$G nodes=$SKYPILOT_NUM_NODES ips=$(echo "$SKYPILOT_NODE_IPS" | tr '\n' ,)"
[ -f /run/.containerenv ] && echo "probe rank=$R gen=$G in-container debian=$(cat /etc/debian_version)"
echo "probe rank=$R gen=$G workdir=$(cat marker.txt) setup=$(cat /opt/left-by-setup)"
touch /opt/left-by-run
python3 - <<'PY'
import datetime, os
import torch
import torch.distributed as dist
ips = os.environ["SKYPILOT_NODE_IPS"].split()
rank, gen = int(os.environ["SKYPILOT_NODE_RANK"]), int(os.environ["AIRFLOW_SKY_RECOVERY_COUNT"])
port = int(os.environ["RDZV_PORT"]) + gen
dist.init_process_group("gloo", init_method=f"tcp://{ips[0]}:{port}", rank=rank, world_size=len(ips),
                        timeout=datetime.timedelta(seconds=300))
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"probe rank={rank} gen={gen} allreduce={t.item()} torch={torch.__version__}", flush=True)
with open(f"/ckpt/allreduce-{rank}-{gen}", "w") as f:  # rank 0's generation-0 line may not be collected
    f.write(str(t.item()))
dist.destroy_process_group()
PY
echo "gen $G" > "/ckpt/rank-$R"
if [ "$G" = 0 ]; then sleep 900; fi  # generation 0 waits to be preempted
"""

# No image_id: a later job on a kept cluster runs in the cluster's container (SkyPilot's semantics).
EXEC = r"""
name: ctr-exec
num_nodes: 2
run: |
  [ -f /run/.containerenv ] && [ -f /opt/left-by-run ] && echo "exec rank=$SKYPILOT_NODE_RANK found-the-first-job's-file"
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[images.Registry, str]]:
    image = images.torch_image()
    with images.Registry(tmp_path_factory.mktemp("registry")) as reg:
        reference = reg.push(image, "sky/torch:1")
        images.remove_pulled(reference)  # the nodes pull it
        yield reg, reference
        images.remove_pulled(reference)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("sky-home")
    env = {k: v for k, v in os.environ.items() if k not in ("AIRFLOW_HOME", "AIRFLOW_SKY_AIRFLOW_HOME")}
    env.update(
        AIRFLOW_SKY_HOME=str(home),
        AIRFLOW_SKY_SSH_CONFIG=str(home / "ssh_config"),
        AIRFLOW__SKY__DOCKER_RUN_OPTIONS=images.RUN_OPTIONS,
    )
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _object(s3: S3Server, key: str) -> str | None:
    try:
        return str(s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode())
    except Exception:
        return None


def _generation(s3: S3Server, rank: int) -> int | None:
    body = _object(s3, f"rank-{rank}")
    return None if body is None else int(body.split()[1])


def _dag(registry: tuple[images.Registry, str], workdir: Path) -> str:
    reg, reference = registry
    task: dict[str, Any] = {
        "name": "ctr",
        "num_nodes": 2,
        "workdir": str(workdir),
        "resources": {"image_id": f"docker:{reference}"},
        "envs": {
            "SKYPILOT_DOCKER_USERNAME": reg.USER,
            "SKYPILOT_DOCKER_SERVER": reg.host,
            "RDZV_PORT": str(free_port()),
            "GLOO_SOCKET_IFNAME": "lo",
        },
        "secrets": {"SKYPILOT_DOCKER_PASSWORD": reg.password},
        "file_mounts": {"/ckpt": {"name": BUCKET, "store": "s3", "mode": "MOUNT_CACHED"}},
        "setup": "echo set-up > /opt/left-by-setup",
        "run": RUN,
    }
    return f"""
import json

from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task.from_dict(json.loads({json.dumps(task)!r}))
with DAG("ctr", schedule=None) as dag:
    sky_job(task, cluster_name={CLUSTER!r}, down=False)
"""


def test_a_two_node_job_runs_in_a_private_image_rendezvouses_and_its_preempted_rank_pulls_it_again(
    run_dag: Any,  # noqa: F811
    registry: tuple[images.Registry, str],
    s3: S3Server,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    reg, reference = registry
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "marker.txt").write_text("from-the-workdir\n")
    preempted: list[float] = []

    def preempt_rank_1_once_it_reduced() -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not preempted:
            # Both ranks' generation-0 files are uploaded: the preemption cannot cut rank 0's upload.
            if _generation(s3, 0) == 0 and _generation(s3, 1) == 0:
                LocalCloud().preempt(CLUSTER, 1)
                preempted.append(time.monotonic())
            time.sleep(0.5)

    threading.Thread(target=preempt_rank_1_once_it_reduced, daemon=True).start()
    env = {
        "AIRFLOW_CONN_AWS_DEFAULT": s3.connection,
        "AIRFLOW_CONN_SKY_NODES_AWS": s3.connection,
        "AIRFLOW__SKY__DOCKER_RUN_OPTIONS": images.RUN_OPTIONS,
    }
    try:
        result = run_dag("ctr", _dag(registry, workdir), env=env, timeout=1200)
        out = result.output
        assert result.returncode == 0, result.digest
        assert preempted, "the ranks never reported their generation-0 all-reduce"
        assert reg.password not in out  # a secret: never in a log
        for rank in (0, 1):
            assert f"probe rank={rank} gen=1 nodes=2 ips=127." in out, out[-6000:]
            assert f"probe rank={rank} gen=1 in-container debian=12" in out
            assert f"probe rank={rank} gen=1 workdir=from-the-workdir setup=set-up" in out
            # torch.distributed from the image, across the two containers.
            assert f"probe rank={rank} gen=1 allreduce=3.0" in out
        # Generation 0 reduced across both containers too. Its log lines may not be collected: the
        # recovery ends rank 0's run right after the preemption, so its sum is read from the bucket.
        assert _object(s3, "allreduce-0-0") == "3.0"
        for rank in (0, 1):
            assert _generation(s3, rank) == 1  # the MOUNT_CACHED bucket, written from inside the container
        assert "RECOVER: node of rank 1 lost" in out, out[-6000:]
        # Rank 1's replacement is a new node: it logged in and pulled the image again.
        assert out.count(f"rank 1: pulled {reference} with podman") == 2, out[-6000:]
        assert out.count(f"rank 0: pulled {reference} with podman") == 1

        # Later jobs on the kept cluster run in the same containers.
        task = tmp_path / "exec.yaml"
        task.write_text(EXEC)
        execd = _cli(cli_env, "exec", CLUSTER, str(task))  # the container is there: no login needed
        assert execd.returncode == 0, execd.stdout + execd.stderr
        for rank in (0, 1):
            assert f"exec rank={rank} found-the-first-job's-file" in execd.stdout, execd.stdout
    finally:
        down = _cli(cli_env, "down", CLUSTER, "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert daemon.processes_with_marker(CLUSTER) == []
    assert images.node_containers(CLUSTER) == [], "a container outlived its cluster"


ERRORS = """\
name: {name}
resources:
  image_id: docker:{image}
run: echo never
"""


def test_a_bad_password_a_missing_tag_an_image_without_bash_and_no_runtime_are_one_clear_error_each(
    registry: tuple[images.Registry, str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    reg, reference = registry
    nobash = images.image_without_bash()
    login = {"SKYPILOT_DOCKER_USERNAME": reg.USER, "SKYPILOT_DOCKER_SERVER": reg.host}
    cases: dict[str, tuple[str, dict[str, str], dict[str, str], str]] = {
        # name: (image, envs, secrets, what the error says)
        "ctr-badpw": (reference, login, {"SKYPILOT_DOCKER_PASSWORD": "wrong"}, f"login to {reg.host} as"),
        "ctr-notag": (
            f"{reg.host}/sky/torch:no-such-tag",
            login,
            {"SKYPILOT_DOCKER_PASSWORD": reg.password},
            "pull failed",
        ),
        "ctr-nobash": (nobash, {}, {}, "has no /bin/bash"),
        "ctr-nort": (reference, login, {"SKYPILOT_DOCKER_PASSWORD": reg.password}, "no container runtime"),
    }
    procs = {}
    for name, (image, envs, secrets, _) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(ERRORS.format(name=name, image=image))
        args = [*CLI, "launch", "-c", name, str(path), "-y", "--down"]
        for key, value in envs.items():
            args += ["--env", f"{key}={value}"]
        env = dict(cli_env)
        for key, value in secrets.items():
            args += ["--secret", key]  # its value from the environment: never on a command line
            env[key] = value
        if name == "ctr-nort":  # Docker's CLI is here, its daemon is not: no runtime for this node
            env["AIRFLOW__SKY__CONTAINER_RUNTIME"] = "docker"
        procs[name] = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    outputs = {name: proc.communicate(timeout=900)[0] for name, proc in procs.items()}
    for name, (image, _, _, says) in cases.items():
        out = outputs[name]
        assert procs[name].returncode != 0, out
        failed = [line for line in out.splitlines() if "CANCELLED" in line or "FAILED" in line]
        assert failed and says in failed[-1] and f"container image {image}" in failed[-1], out
        assert "Traceback" not in out and reg.password not in out
        assert daemon.processes_with_marker(name) == [], name  # no node left
    assert not [n for name in cases for n in images.node_containers(name)], "a failed start left a container"
