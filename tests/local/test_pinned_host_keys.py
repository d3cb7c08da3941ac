"""Only a node's pinned host key opens it, on every transport (paramiko exec, SFTP, rsync's ssh, the ssh
config entries written for users), whatever the user's ~/.ssh/known_hosts says about its address."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import pytest

from airflow_sky.client import ssh_config
from airflow_sky.errors import RemoteError
from airflow_sky.node.client import NodeClient
from airflow_sky.node.record import Node
from airflow_sky.node.sync import sync_dir

REFUSED = r"refusing node rank 1 at .*presented host key .*not the key pinned in its record"


def _stale_user_known_hosts(home: Path, node: Node, other_key: str) -> None:
    """A ~/.ssh/known_hosts whose lines for the node's address hold another machine's key (a recycled IP)."""
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "known_hosts").write_text(
        f"[{node.ssh_host}]:{node.ssh_port} {other_key}\n{node.ssh_host} {other_key}\n"
    )


def _workdir(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir(parents=True)
    (source / "a.txt").write_text("a\n")
    return source


def test_a_stale_known_hosts_line_for_the_nodes_address_does_not_stop_exec_sftp_or_rsync(
    local_cluster, tmp_path, monkeypatch
):
    _, nodes, key = local_cluster(2)
    node, other = nodes[1], nodes[0]
    assert node.host_key != other.host_key
    home = tmp_path / "home"
    home.mkdir()
    _stale_user_known_hosts(home, node, str(other.host_key))
    monkeypatch.setenv("HOME", str(home))  # paramiko's ~/.ssh/known_hosts is this one now
    with NodeClient(node, key, conn_retry_attempts=1) as client:
        assert client.exec("echo ok")[:2] == (0, b"ok\n")
        client.put(_workdir(tmp_path) / "a.txt", "put.txt")
        assert client.read_file("put.txt") == b"a\n"
        assert sync_dir(client, _workdir(tmp_path / "r"), "~/synced", method="rsync").method == "rsync"
        assert sync_dir(client, _workdir(tmp_path / "s"), "~/synced-sftp", method="sftp").method == "sftp"
        assert client.exec("cat ~/synced/a.txt ~/synced-sftp/a.txt")[1] == b"a\na\n"


def test_a_node_presenting_another_key_is_refused_with_one_clear_line_on_every_transport(
    local_cluster, tmp_path
):
    _, nodes, key = local_cluster(2)
    # Rank 1's address, but the record pins rank 0's key: the machine there is not the one provisioned.
    impostor = dataclasses.replace(nodes[1], host_key=nodes[0].host_key)
    started = time.monotonic()
    with NodeClient(impostor, key) as client:
        with pytest.raises(RemoteError, match=REFUSED):
            client.exec("true")
        with pytest.raises(RemoteError, match=REFUSED):
            client.read_file("anything")
        with pytest.raises(RemoteError, match=REFUSED):
            sync_dir(client, _workdir(tmp_path), "~/synced", method="rsync")
    # A key mismatch is not retried as if the node were slow to come up (3 attempts would take 6 s or more).
    assert time.monotonic() - started < 30


def test_the_ssh_entries_written_for_users_trust_only_the_pinned_key(local_cluster, tmp_path):
    _, nodes, key = local_cluster(2)
    config = ssh_config.config_text("c", nodes, {n.rank: key for n in nodes}, tmp_path / "known_hosts")
    assert "StrictHostKeyChecking yes" in config and "GlobalKnownHostsFile /dev/null" in config
    (tmp_path / "config").write_text(config)

    def ssh(alias: str, pinned: list[Node]) -> subprocess.CompletedProcess[str]:
        (tmp_path / "known_hosts").write_text(ssh_config.known_hosts_text(pinned))
        return subprocess.run(
            ["ssh", "-F", str(tmp_path / "config"), "-o", "BatchMode=yes", alias, "echo ok"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert ssh("c-worker1", nodes).stdout == "ok\n"
    wrong = [dataclasses.replace(nodes[1], host_key=nodes[0].host_key)]
    refused = ssh("c-worker1", wrong)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_a_proxycommand_from_the_users_ssh_config_still_checks_only_the_pinned_key(
    local_cluster, tmp_path, monkeypatch
):
    _, nodes, key = local_cluster(2)
    home = tmp_path / "home"
    home.mkdir()
    _stale_user_known_hosts(home, nodes[1], str(nodes[0].host_key))
    # A relay through bash's /dev/tcp (a jump host stand-in); it records that it was used.
    relay = f"bash -c 'touch {tmp_path}/relayed; exec 3<>/dev/tcp/%h/{nodes[1].ssh_port}; cat <&3 & cat >&3'"
    (home / ".ssh" / "config").write_text(f"Host {nodes[1].ssh_host}\n  ProxyCommand {relay}\n")
    monkeypatch.setenv("HOME", str(home))
    with NodeClient(nodes[1], key, conn_retry_attempts=1) as client:
        assert client.exec("echo ok")[:2] == (0, b"ok\n")
    assert (tmp_path / "relayed").exists()
    impostor = dataclasses.replace(nodes[1], host_key=nodes[0].host_key)
    with NodeClient(impostor, key) as client, pytest.raises(RemoteError, match=REFUSED):
        client.exec("true")
