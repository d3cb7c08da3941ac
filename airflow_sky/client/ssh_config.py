"""`ssh <cluster>` and `ssh <cluster>-worker<N>`: host entries for launched clusters, as SkyPilot writes them.

Each cluster gets `~/.airflow_sky/ssh/<cluster>.config` (with a known_hosts file pinning the nodes' host
keys); `~/.ssh/config` gets one `Include` line for all of them. `down` removes the cluster's entries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_sky.infra.base import Node
from airflow_sky.infra.home import sky_home, user_ssh_config

_MARKER = "# Added by airflow-sky: host entries of launched clusters"


def config_dir() -> Path:
    return sky_home() / "ssh"


def user_config() -> Path:
    return user_ssh_config()


def host_alias(cluster_name: str, rank: int) -> str:
    return cluster_name if rank == 0 else f"{cluster_name}-worker{rank}"


def known_hosts_text(nodes: Sequence[Node]) -> str:
    return "".join(f"{line}\n" for node in nodes if (line := node.known_hosts_line))


def config_text(
    cluster_name: str, nodes: Sequence[Node], key_files: Mapping[int, str], known_hosts: Path
) -> str:
    """Host entries; `key_files` maps each rank to its private key (pool hosts may each have their own)."""
    blocks = []
    for node in nodes:
        blocks.append(
            "\n".join(
                [
                    f"Host {host_alias(cluster_name, node.rank)}",
                    f"  HostName {node.ssh_host}",
                    f"  Port {node.ssh_port}",
                    f"  User {node.ssh_user}",
                    f'  IdentityFile "{key_files[node.rank]}"',
                    "  IdentitiesOnly yes",
                    f'  UserKnownHostsFile "{known_hosts}"',
                    "  StrictHostKeyChecking yes",
                    "  LogLevel ERROR",
                ]
            )
        )
    return f"# airflow-sky cluster {cluster_name}\n" + "\n\n".join(blocks) + "\n"


def write_entries(cluster_name: str, nodes: Sequence[Node], key_files: Mapping[int, str]) -> Path:
    """Write the cluster's host entries and make sure the user's ssh config includes them."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    known_hosts = directory / f"{cluster_name}.known_hosts"
    known_hosts.write_text(known_hosts_text(nodes))
    path = directory / f"{cluster_name}.config"
    path.write_text(config_text(cluster_name, nodes, key_files, known_hosts))
    _ensure_include(directory)
    return path


def remove_entries(cluster_name: str) -> None:
    for suffix in (".config", ".known_hosts"):
        (config_dir() / f"{cluster_name}{suffix}").unlink(missing_ok=True)


def _ensure_include(directory: Path) -> None:
    """Add `Include <dir>/*.config` at the top of the user's ssh config (Include must precede Host blocks)."""
    config = user_config()
    include = f'Include "{directory}/*.config"'
    current = config.read_text() if config.exists() else ""
    if include in current:
        return
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    config.write_text(f"{_MARKER}\n{include}\n\n{current}")
    os.chmod(config, 0o600)
