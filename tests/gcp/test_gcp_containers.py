"""Container tasks (`image_id: docker:<image>`) on gcp: VMs of the default image (the fake GCE) whose
startup script is the container prep (Docker installed where missing, the image pulled at boot; no registry
secret in the metadata), its record in the provision log, and the Artifact Registry login through the VM's
service account, chosen only without a username and password (`_json_key` goes through the normal login).
`--dryrun`'s container line: tests/aws/test_aws_containers.py (both clouds).
The identity login is shell: run here for real, with a stand-in for gcloud and docker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.gcp import vms
from airflow_sky.node import container
from airflow_sky.node.container_login import identity_login
from airflow_sky.task.container import ContainerSpec, RegistryLogin
from tests.aws.test_aws_containers import _DOCKER, _path_with, _Recording, assert_container_prep_logged
from tests.gcp.conftest import REGION
from tests.gcp.fake_gce import FakeGce
from tests.gcp.test_gcp_cloud import N2, cluster  # noqa: F401 - the module's cluster fixture
from tests.gcp.test_gcp_contract import FastGcpCloud

AR = "us-central1-docker.pkg.dev"
IMAGE = f"{AR}/team/images/train:1"


def _metadata(gce: FakeGce, name: str) -> dict[str, str]:
    return {i["key"]: i["value"] for i in gce.instances[name]["metadata"]["items"]}


def test_a_docker_task_gets_vms_of_the_default_image_whose_startup_script_prepares_docker_and_pulls(
    gce: FakeGce,
    cluster: str,  # noqa: F811
) -> None:
    handle = Cluster(cluster, f"gcp/{REGION}", FastGcpCloud(REGION))
    nodes = handle.provision(2, N2.copy(image_id=f"docker:{IMAGE}"))
    record = FastGcpCloud(REGION)._record(cluster) or {}
    assert record["image"] == vms.DEFAULT_IMAGE and record["container"] == f"docker:{IMAGE}"  # it has Docker
    for node in nodes:
        metadata = _metadata(gce, node.instance_id)
        assert metadata["ssh-keys"].startswith("gcpuser:ssh-")  # the SSH key part is as before
        assert metadata["enable-guest-attributes"] == "TRUE"
        script = metadata["startup-script"]
        assert "apt-get install -y -q docker.io" in script and f"image={IMAGE}" in script
        assert "docker pull" in script and "gcloud auth print-access-token" in script  # AR as the VM
        assert "SKYPILOT_DOCKER" not in json.dumps(metadata)  # no registry secret in the metadata
    assert_container_prep_logged(handle, IMAGE, nodes)

    new = FastGcpCloud(REGION).replace(cluster, 1)  # a replacement's boot pulls the image too
    assert f"image={IMAGE}" in _metadata(gce, new.instance_id)["startup-script"]


def test_a_vm_without_a_container_gets_no_startup_script() -> None:
    vm: dict[str, Any] = dict(name="c-0-x", zone="us-central1-a", machine_type="n2-standard-8", spot=False)
    net: dict[str, Any] = dict(network="default", labels={}, tags=[], external_ip=True, self_delete=False)
    ssh: dict[str, Any] = dict(ssh_user="gcpuser", public_key="ssh-ed25519 AAAA")
    body = vms.instance_body(**vm, **net, **ssh, accelerator=None, accelerator_count=0, image="i", disk_gb=9)
    keys = [i["key"] for i in body["metadata"]["items"]]
    assert keys == ["ssh-keys", "enable-guest-attributes", "install-nvidia-driver"]


def test_the_artifact_registry_login_takes_the_vm_service_accounts_token_through_stdin(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls"
    gcloud = 'echo "gcloud $*" >> "$CALLS"; echo ya29.sa-token'
    env = _path_with(tmp_path, {"gcloud": gcloud, "docker": _DOCKER}) | {"CALLS": str(calls)}
    run = f"rt=docker; user=; tmp=$(mktemp -d)\n{identity_login(IMAGE)}\necho token=$token"
    done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert set(calls.read_text().splitlines()) == {
        "gcloud auth print-access-token",
        f"docker login --username oauth2accesstoken --password-stdin {AR}",  # no token on a command line
        "login-stdin ya29.sa-token",
    }
    assert done.stdout.strip() == "token="  # not kept in the step's shell afterwards

    # no service account (gcloud has no token, no metadata server): no login, the pull goes anonymous
    calls.unlink()
    no_sa = _path_with(tmp_path, {"gcloud": "echo 'no credentialed accounts' >&2; exit 1"})
    done = subprocess.run(
        ["bash", "-c", run], env=no_sa | {"CALLS": str(calls)}, capture_output=True, text=True
    )
    assert done.returncode == 0 and not calls.exists()


def test_a_json_key_login_goes_through_the_normal_stdin_login_not_the_service_account() -> None:
    client = _Recording()
    container.ensure_container(client, ContainerSpec(IMAGE), None, lambda _: None)  # type: ignore[arg-type]
    assert "gcloud auth print-access-token" in client.command
    key = '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----x"}'
    login = RegistryLogin("_json_key", key, AR)
    container.ensure_container(client, ContainerSpec(IMAGE), login, lambda _: None)  # type: ignore[arg-type]
    assert "print-access-token" not in client.command and "private_key" not in client.command
    assert client.stdin.decode().splitlines() == ["_json_key", key, AR]
