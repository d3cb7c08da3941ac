"""Node containers (`image_id: docker:`) on an ssh pool host, with real OpenSSH servers and rootless Podman.

The pool's login user keeps its images where the pool's admin put them (a storage.conf in the user's
~/.config, present when the host's baseline was taken, pointing the store outside the home), so a container
the runtime still lists would outlive the host's reset: teardown removes the node's container through its
runtime before the sweep, and the next cluster on the host finds none, while the admin's image stays.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.client.cli import main
from airflow_sky.infra.base import Node, ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container import container_name, ensure_container
from airflow_sky.node.jobs import read_job, start_job
from airflow_sky.task.container import ContainerSpec
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdHost, SshdPool

POOL_SIZE = 1  # every cluster gets the same host
SUBNET = 2
IMAGE = "localhost/airflow-sky-ssh-tiny:1"
# What this machine's sandbox needs from Podman (the deployment's `[sky] docker_run_options`).
RUN_OPTIONS = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def _tiny_rootfs(tar: Path) -> None:
    """A root filesystem of this machine's bash and sleep with their libraries: all a node's container
    needs (bash for its shell, sleep while no job runs)."""
    files: set[str] = set()
    for binary in ("bash", "sleep"):
        path = os.path.realpath(shutil.which(binary) or binary)
        files.add(path)
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        files |= {word for word in ldd.split() if word.startswith("/")}
    with tarfile.open(tar, "w") as archive:
        for path in sorted(files):
            archive.add(os.path.realpath(path), arcname=path.lstrip("/"))
        for binary in ("bash", "sleep"):  # where scripts look for them
            real = os.path.realpath(shutil.which(binary) or binary)
            if real != f"/bin/{binary}":
                archive.add(real, arcname=f"bin/{binary}")
        for directory in ("tmp", "root"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o700
            archive.addfile(info)


def _as_user(host: SshdHost, *argv: str, check: bool = True) -> str:
    """Run a command on this machine as the host's login user, as its sshd sessions do (no systemd)."""
    env = {"HOME": str(host.home), "USER": host.user, "LOGNAME": host.user, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["runuser", "-u", host.user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        cwd=host.home,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{argv} as {host.user}: {proc.stderr[-1500:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def host(sshd_pool: SshdPool) -> Iterator[SshdHost]:
    """The pool's host, its user's Podman store outside the home and the image loaded (before any
    cluster took the host: its baseline has the storage.conf)."""
    host = sshd_pool.hosts[0]
    store = sshd_pool.root / "containers-store"
    store.mkdir()
    config = host.home / ".config" / "containers"
    config.mkdir(parents=True)
    (config / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{store}/graph"\nrunroot = "{store}/run"\n'
    )
    user = pwd.getpwnam(host.user)
    for path in (store, host.home / ".config", config, config / "storage.conf"):
        os.chown(path, user.pw_uid, user.pw_gid)
    tar = sshd_pool.root / "tiny.tar"
    _tiny_rootfs(tar)
    os.chmod(tar, 0o644)
    _as_user(host, "podman", "import", str(tar), IMAGE)
    try:
        yield host
    finally:
        _as_user(host, "podman", "rm", "-af", "-t", "0", check=False)
        _as_user(host, "podman", "system", "reset", "-f", check=False)  # the store's files are the user's
        for pid in _as_user(host, "pgrep", "-u", host.user, "-x", "catatonit", check=False).split():
            os.kill(int(pid), 9)  # the user's Podman pause process, which these last calls started
        shutil.rmtree(f"/tmp/podman-run-{pwd.getpwnam(host.user).pw_uid}", ignore_errors=True)


@pytest.fixture
def cloud(sshd_pool: SshdPool, host: SshdHost) -> Iterator[SshCloud]:
    driver = SshCloud(POOL)
    try:
        yield driver
    finally:
        for cluster in driver.clusters():  # what a failed test left held
            driver.terminate(cluster)


def _containers(cloud: SshCloud, cluster: str, node: Node) -> list[str]:
    """The containers the host's login user has, as a job of the cluster sees them."""
    with NodeClient(node, cloud.key_file_for(cluster, node)) as client:
        rc, out, err = client.exec("podman ps -a --format '{{.Names}}'", timeout=120)
    assert rc == 0, err.decode(errors="replace")
    return out.decode().split()


def test_a_clusters_container_on_a_pool_host_is_removed_when_the_cluster_is_downed(
    cloud: SshCloud, host: SshdHost, sshd_pool: SshdPool
) -> None:
    (a,) = cloud.provision(ProvisionRequest("ctr-a", 1))
    with NodeClient(a, cloud.key_file_for("ctr-a", a)) as client:
        runtime = ensure_container(
            client, ContainerSpec(IMAGE), None, lambda line: None, deployment_options=RUN_OPTIONS
        )
    assert runtime == "podman"
    assert _containers(cloud, "ctr-a", a) == [container_name(a)]

    cloud.terminate("ctr-a")

    assert sshd_pool.leftover_processes() == []  # no conmon, catatonit or idle shell of the container
    assert _as_user(host, "podman", "ps", "-a", "--format", "{{.Names}}").split() == []
    (b,) = cloud.provision(ProvisionRequest("ctr-b", 1))
    assert b.instance_id != a.instance_id
    assert _containers(cloud, "ctr-b", b) == []
    with NodeClient(b, cloud.key_file_for("ctr-b", b)) as client:
        rc, _, _ = client.exec(f"podman image exists {IMAGE}", timeout=120)
    assert rc == 0  # the image the pool's admin loaded is still there
    cloud.terminate("ctr-b")


WHERE = "[ -e /etc/debian_version ] && echo on-the-host || echo in-the-container"  # the image has no /etc/debian_version


def _cli_ssh(tmp_path: Path, cluster: str, *command: str) -> str:
    """`airflow-sky ssh <cluster> COMMAND` as a user runs it (it replaces itself with OpenSSH)."""
    env = {
        **os.environ,
        "AIRFLOW_SKY_HOME": str(tmp_path / "sky"),
        "AIRFLOW_SKY_AIRFLOW_HOME": str(tmp_path / "af"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "ssh", cluster, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_ssh_to_a_cluster_lands_in_its_nodes_container_once_its_jobs_run_there(
    cloud: SshCloud, host: SshdHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sky.client import cluster_index

    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    (a,) = cloud.provision(ProvisionRequest("ctr-ssh", 1))
    cluster_index.remember("ctr-ssh", f"ssh/{POOL}")
    assert _cli_ssh(tmp_path, "ctr-ssh", WHERE) == "on-the-host"  # no job ran in a container yet
    with NodeClient(a, cloud.key_file_for("ctr-ssh", a)) as client:
        ensure_container(
            client, ContainerSpec(IMAGE), None, lambda line: None, deployment_options=RUN_OPTIONS
        )
        assert start_job(
            client, "1-run", "echo job > $HOME/from-the-job", {}, container=container_name(a)
        ).started
        deadline = time.monotonic() + 120
        while (state := read_job(client, "1-run", 0, 0)).exit_code is None:
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.2)
        assert state.exit_code == 0, state
    assert _cli_ssh(tmp_path, "ctr-ssh", WHERE) == "in-the-container"
    assert _cli_ssh(tmp_path, "ctr-ssh", "read -r line < $HOME/from-the-job; echo $line") == "job"
    cloud.terminate("ctr-ssh")


def test_ssh_check_names_each_hosts_container_runtime(
    host: SshdHost, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["ssh", "check", POOL])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"Container runtime (image_id: docker:): podman on {host.alias}" in out, out
