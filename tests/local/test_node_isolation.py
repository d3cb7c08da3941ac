"""Local nodes look like machines: their own processes and /tmp, a short home, their share of the GPUs.

The CI machine has no GPU: a fake `nvidia-smi` (eight L4s) on the launcher's PATH stands in for one, so the
detection the ssh infra uses on its hosts runs here unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.task import Resources

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


def _exec(node: object, key: str, command: str) -> str:
    with NodeClient(node, key) as client:  # type: ignore[arg-type]
        rc, out, err = client.exec(command)
    assert rc == 0, err
    return out.decode()


def test_a_node_sees_only_its_own_processes_and_tmp_where_the_os_allows(local_cluster) -> None:
    if os.geteuid() == 0:
        assert daemon.isolation() is not None, "as root, nodes run in their own PID and mount namespaces"
    _, nodes, key = local_cluster(2)
    first, second = nodes
    _exec(first, key, 'setsid sleep 300 < /dev/null > /dev/null 2>&1 & echo marker > "$TMPDIR/only-on-first"')
    on_second = _exec(second, key, 'ps -eo args; ls -a "$TMPDIR"')
    assert "sleep 300" not in on_second and "only-on-first" not in on_second
    if daemon.isolation() is not None:
        # The node's own /tmp: its file, and the software bound back where it is installed under /tmp (a
        # venv or checkout there, as in a CI clone), nothing else of the machine's /tmp.
        software = {Path(p).parts[2] for p in (sys.prefix, *sys.path) if Path(p).parts[:2] == ("/", "tmp")}
        listing = set(_exec(first, key, "ls /tmp").split())
        assert "only-on-first" in listing and listing - software == {"only-on-first"}, listing
        assert "sleep 300" in _exec(first, key, "ps -eo args")
        assert int(_exec(first, key, "ps -e --no-headers | wc -l")) < 10  # not the host's processes


def test_a_unix_socket_under_a_nodes_home_fits(local_cluster) -> None:
    _, nodes, key = local_cluster(1)
    # Ray's layout under `ray start --temp-dir=$HOME/ray`, which an ~65-character home pushed past 107 bytes.
    path = "$HOME/ray/session_2026-12-02_06-30-00_123456_12345/sockets/plasma_store"
    out = _exec(
        nodes[0],
        key,
        f'mkdir -p "$(dirname {path})" && python3 -c "import socket, sys; '
        f's = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); print(len(sys.argv[1]))" {path}',
    )
    assert int(out) <= 107


@pytest.fixture
def eight_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fake nvidia-smi reporting eight L4s, first on PATH (no GPU exists on a CI machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/bash\nfor i in 0 1 2 3 4 5 6 7; do echo 'NVIDIA L4, 8'; done\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield bin_dir


def test_each_local_node_gets_its_own_share_of_the_machines_gpus(eight_gpus: Path) -> None:
    cloud = LocalCloud()
    try:
        nodes = cloud.provision(ProvisionRequest("gpus", 2, Resources(accelerators="L4:4")))
        key = cloud.ssh_private_key("gpus")
        assert [n.gpus for n in nodes] == [4, 4]
        shares = [_exec(n, key, 'echo "$CUDA_VISIBLE_DEVICES"').strip() for n in nodes]
        assert shares == ["0,1,2,3", "4,5,6,7"]
        with pytest.raises(
            ClusterError,
            match=r"1 node\(s\) x 1 GPU\(s\) = 1 GPUs asked for, but this machine has 8 \(0 free",
        ):
            cloud.provision(ProvisionRequest("more", 1, Resources(accelerators="L4:1")))
        cpu = cloud.provision(ProvisionRequest("cpu", 1))
        assert _exec(cpu[0], cloud.ssh_private_key("cpu"), 'echo "[$CUDA_VISIBLE_DEVICES]"').strip() == "[]"
    finally:
        for name in ("gpus", "more", "cpu"):
            cloud.terminate(name)
    with pytest.raises(
        ClusterError, match=r"3 node\(s\) x 4 GPU\(s\) = 12 GPUs asked for, but this machine has 8"
    ):
        cloud.provision(ProvisionRequest("toomany", 3, Resources(accelerators="L4:4")))
    assert cloud.nodes("toomany") == []


def test_a_two_node_l4_task_runs_unchanged_on_one_gpu_box(eight_gpus: Path, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        """\
name: ddp-l4
num_nodes: 2
resources:
  accelerators: L4:4
run: echo "rank $SKYPILOT_NODE_RANK gpus=$SKYPILOT_NUM_GPUS_PER_NODE devices=$CUDA_VISIBLE_DEVICES"
"""
    )
    result = subprocess.run(
        [*CLI, "launch", "-c", "l4box", str(task), "-y", "--down"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0 gpus=4 devices=0,1,2,3" in result.stdout
    assert "rank 1 gpus=4 devices=4,5,6,7" in result.stdout
