"""Container tasks (`image_id: docker:<image>`) on aws: launched on the default image (moto), with user data
that keeps the launch's host key and adds the container prep (Docker installed where missing, the image
pulled at boot; no registry secret), its record in the provision log, and the ECR login through the
instance's identity, chosen only when no username and password are given. The boot prep and the identity
login are shell: they are run here for real, with stand-ins for the commands only a cloud VM has (docker's
daemon, apt-get, the aws CLI), on a PATH without this machine's own ones."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from rich.console import Console

from airflow_sky.infra import provision_log
from airflow_sky.infra.aws import pinning
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.provisioning import image_for
from airflow_sky.node import container
from airflow_sky.node.container_login import (
    PREP_STARTED,
    boot_prep_script,
    identity_login,
    identity_registry,
    prep_report_command,
)
from airflow_sky.node.record import Node
from airflow_sky.task import Task
from airflow_sky.task.container import ContainerSpec, RegistryLogin
from tests.aws.conftest import REGION, boto
from tests.aws.test_aws_cloud import M6I, _instances_of, cluster  # noqa: F401 - the module's cluster fixture
from tests.aws.test_aws_contract import MotoAwsCloud, published_image  # noqa: F401 - module fixture

IMAGE = "ubuntu:22.04"
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
_TOOLS = ["bash", "sh", "cat", "date", "mktemp", "tail", "tr", "seq", "sleep", "touch", "chmod", "rm", "awk"]
_TOOLS += ["id", "timeout", "mkdir", "grep"]


def _user_data(endpoint: str, instance_id: str) -> dict[str, Any]:
    answer = boto("ec2", endpoint).describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    text = base64.b64decode(answer["UserData"]["Value"]).decode()
    assert text.startswith("#cloud-config\n")
    return dict(json.loads(text.split("\n", 1)[1]))


def _prep_of(config: dict[str, Any]) -> str:
    (written,) = [f for f in config["write_files"] if f["path"] == pinning.PREP_SCRIPT]
    return str(written["content"])


def assert_container_prep_logged(handle: Cluster, image: str, nodes: list[Node]) -> None:
    """The provision log names the container and says each node's boot prep record: the play nodes ran no
    boot script, which is said, not hidden."""
    lines: list[str] = []
    provision_log.show(handle.state_store(), lines.append, follow=False)
    text = "\n".join(lines)
    assert f"container: {image} (Docker on the default image" in text
    for node in nodes:
        assert f"rank {node.rank}: no container prep record on this node yet" in text


def test_a_docker_task_launches_on_the_default_image_with_user_data_that_prepares_docker_and_pulls(
    moto_endpoint: str,
    published_image: str,  # noqa: F811
    cluster: str,  # noqa: F811
) -> None:
    handle = Cluster(cluster, f"aws/{REGION}", MotoAwsCloud(REGION))
    nodes = handle.provision(2, M6I.copy(image_id=f"docker:{IMAGE}"))
    found = _instances_of(moto_endpoint, cluster)
    assert {i["ImageId"] for i in found} == {published_image}  # the default image: it has Docker
    for instance in found:
        config = _user_data(moto_endpoint, instance["InstanceId"])
        keys = config["ssh_keys"]  # the host key part is as before: a key pair the launch made
        private = serialization.load_ssh_private_key(keys["ed25519_private"].encode(), None)
        public = private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        assert keys["ed25519_public"] == public.decode()
        assert config["ssh_deletekeys"] is True and config["ssh_genkeytypes"] == []
        script = _prep_of(config)
        assert "apt-get install -y -q docker.io" in script and f"image={IMAGE}" in script
        assert "docker pull" in script
        assert "SKYPILOT_DOCKER" not in json.dumps(config)  # no registry secret in user data
        assert config["runcmd"] == [["sh", "-c", f"nohup /bin/bash {pinning.PREP_SCRIPT} >/dev/null 2>&1 &"]]
    assert_container_prep_logged(handle, IMAGE, nodes)

    # a replacement gets the same container prep (its boot pulls the image too)
    new = MotoAwsCloud(REGION).replace(cluster, 1)
    assert f"image={IMAGE}" in _prep_of(_user_data(moto_endpoint, new.instance_id))


def test_a_task_without_a_container_keeps_the_user_data_it_had() -> None:
    seed = pinning.new_host_key()
    config = json.loads(pinning.user_data(seed).split("\n", 1)[1])
    assert set(config) == {"ssh_deletekeys", "ssh_genkeytypes", "ssh_keys"}
    assert image_for(M6I.copy(image_id="ami-0123"), REGION, "aws", "an AMI") == "ami-0123"
    assert image_for(M6I.copy(image_id=f"docker:{IMAGE}"), REGION, "aws", "an AMI") is None  # not refused


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_dryrun_names_the_container_image(cloud: str) -> None:
    from airflow_sky.client.cli.dryrun import print_plan

    resources = {"infra": cloud, "cpus": 4, "image_id": f"docker:{IMAGE}"}
    out = io.StringIO()
    print_plan(Task.from_dict({"run": "true", "resources": resources}), cloud, Console(file=out, width=200))
    assert f"container: {IMAGE} (Docker on the default image" in out.getvalue()


def _path_with(tmp: Path, stubs: dict[str, str]) -> dict[str, str]:
    """A PATH of the plain tools the scripts use plus `stubs` (name -> bash body): none of this machine's
    own docker, apt-get or aws."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in _TOOLS:
        for where in ("/usr/bin", "/bin"):
            if os.path.exists(f"{where}/{tool}") and not (bin_dir / tool).exists():
                (bin_dir / tool).symlink_to(f"{where}/{tool}")
    for name, body in stubs.items():
        stub = bin_dir / name
        stub.write_text(f"#!/bin/bash\n{body}\n")
        stub.chmod(0o755)
    return {"PATH": str(bin_dir), "HOME": str(tmp)}


_DOCKER = """echo "docker $*" >> "$CALLS"
case "$1" in
  info) exit 0;;
  pull) sleep 1; exit 0;;
  login) read -r token && [ -n "$token" ] || { echo "Error: password required" >&2; exit 1; }
         echo "login-stdin $token" >> "$CALLS"; exit 0;;
esac"""


def _report(env: dict[str, str], log: Path, running: Path) -> str:
    """What the provisioning's report prints of a node's boot prep (waiting 5 s at most)."""
    command = prep_report_command(5, log=str(log), running=str(running))
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60).stdout


def test_the_boot_prep_installs_docker_where_the_image_has_none_pulls_and_reports_the_pull_time(
    tmp_path: Path,
) -> None:
    calls, log, running = tmp_path / "calls", tmp_path / "prep.log", tmp_path / "prep.running"
    # apt-get "installs" Docker: it puts the docker stand-in on the PATH
    install = f'echo "apt-get $*" >> "$CALLS"; [ "$1" = install ] && cat > {tmp_path}/bin/docker <<\'EOF\'\n#!/bin/bash\n{_DOCKER}\nEOF\nchmod 755 {tmp_path}/bin/docker; exit 0'
    env = _path_with(tmp_path, {"apt-get": install, "systemctl": "exit 0", "usermod": "exit 0"})
    env["CALLS"] = str(calls)
    script = boot_prep_script(IMAGE, "nobody", log=str(log), running=str(running))
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    made = calls.read_text().splitlines()
    assert "apt-get install -y -q docker.io" in made and f"docker pull {IMAGE}" in made
    assert not running.exists()  # the sync's ensure no longer waits
    report = _report(env, log, running)
    assert PREP_STARTED in report and "Docker is not on this VM image: installing it" in report
    assert f"pulled {IMAGE} in " in report  # the pull time, for the provision log

    # on an image that has Docker, a second boot installs nothing; the report shows only this boot
    calls.unlink()
    subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert not any(c.startswith("apt-get") for c in calls.read_text().splitlines())
    report = _report(env, log, running)
    assert report.count(PREP_STARTED) == 1 and "installing" not in report


def test_the_ecr_identity_login_goes_through_stdin_from_the_instance_identity(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    aws = 'echo "aws $*" >> "$CALLS"; echo ecr-token-123'
    env = _path_with(tmp_path, {"aws": aws, "docker": _DOCKER}) | {"CALLS": str(calls)}
    snippet = identity_login(f"{ECR}/team/train:1")
    run = f'rt=docker; user=; tmp=$(mktemp -d)\n{snippet}\necho "config=$DOCKER_CONFIG"'
    done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = set(calls.read_text().splitlines())  # a pipe: the two sides' order is not fixed
    assert made == {
        "aws ecr get-login-password --region us-west-2",
        f"docker login --username AWS --password-stdin {ECR}",  # the token is on no command line
        "login-stdin ecr-token-123",
    }
    assert done.stdout.strip().startswith("config=/")  # the login lands in the step's temporary dir

    # no instance identity (the CLI fails): one clear error naming the registry, the ensure's login code
    env_fail = _path_with(tmp_path, {"aws": "echo 'Unable to locate credentials' >&2; exit 255"})
    failed = subprocess.run(
        ["bash", "-c", run], env=env_fail | {"CALLS": str(calls)}, capture_output=True, text=True
    )
    assert failed.returncode == 4
    assert f"login to {ECR} with this node's instance identity" in failed.stderr
    assert "Unable to locate credentials" in failed.stderr and "iam_instance_profile" in failed.stderr


class _Recording:
    """Stands in for a NodeClient: keeps the ensure command and its stdin (what the node would run)."""

    def __init__(self) -> None:
        self.node = Node(0, "127.0.0.1", "127.0.0.1", 22, "u", "i-0123")
        self.command, self.stdin = "", b""

    def exec(self, command: str, stdin: bytes = b"", timeout: float = 0) -> tuple[int, bytes, bytes]:
        self.command, self.stdin = command, stdin
        return 0, b"started docker 3\n", b""


def test_the_identity_login_is_chosen_only_for_a_cloud_registry_without_a_username_and_password() -> None:
    assert identity_registry(f"{ECR}/team/train:1") == ("aws", ECR, "us-west-2")
    assert identity_registry("us-central1-docker.pkg.dev/p/r/img:1") == (
        "gcp",
        "us-central1-docker.pkg.dev",
        "",
    )
    assert identity_registry("gcr.io/p/img") == ("gcp", "gcr.io", "")
    assert (
        identity_registry("nvcr.io/nvidia/pytorch:24.10-py3") is None and identity_login("ubuntu:22.04") == ""
    )
    spec = ContainerSpec(f"{ECR}/team/train:1")
    client = _Recording()
    container.ensure_container(client, spec, None, lambda _: None)  # type: ignore[arg-type]
    assert "aws ecr get-login-password --region us-west-2" in client.command
    login = RegistryLogin("AWS", "s3cret-password", ECR)
    container.ensure_container(client, spec, login, lambda _: None)  # type: ignore[arg-type]
    assert "get-login-password" not in client.command  # the given login, through stdin
    assert "s3cret-password" not in client.command and b"s3cret-password" in client.stdin
