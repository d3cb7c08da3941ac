"""`ssh <cluster>` and `ssh <cluster>-worker<N>`: host entries for launched clusters, as SkyPilot writes them.

Each cluster gets `~/.airflow_sky/ssh/<cluster>.config` (with a known_hosts file pinning the nodes' host
keys); `~/.ssh/config` gets one `Include` line for all of them. `down` removes the cluster's entries.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_sky.client import record_files
from airflow_sky.infra.base import Node
from airflow_sky.infra.home import sky_home, user_ssh_config

_MARKER = "# Added by airflow-sky: host entries of launched clusters"
_ENTRIES_LOCK = "entries"  # ~/.airflow_sky/ssh/.entries.lock guards the per-cluster files


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
                    "  GlobalKnownHostsFile /dev/null",
                    "  StrictHostKeyChecking yes",
                    "  LogLevel ERROR",
                ]
            )
        )
    return f"# airflow-sky cluster {cluster_name}\n" + "\n\n".join(blocks) + "\n"


def write_entries(cluster_name: str, nodes: Sequence[Node], key_files: Mapping[int, str]) -> Path:
    """Write the cluster's host entries and make sure the user's ssh config includes them.

    Concurrent launches and downs each hold the entries' lock: a cluster's config and known_hosts files
    are replaced together, never one half of each writer's.
    """
    directory = config_dir()
    known_hosts = directory / f"{cluster_name}.known_hosts"
    path = directory / f"{cluster_name}.config"
    with record_files.locked(directory / _ENTRIES_LOCK, guards=[known_hosts, path]):
        record_files.replace_atomically(known_hosts, known_hosts_text(nodes), mode=0o600)
        record_files.replace_atomically(
            path, config_text(cluster_name, nodes, key_files, known_hosts), mode=0o600
        )
    _ensure_include(directory)
    return path


def remove_entries(cluster_name: str) -> None:
    directory = config_dir()
    with record_files.locked(directory / _ENTRIES_LOCK):
        for suffix in (".config", ".known_hosts"):
            record_files.remove(directory / f"{cluster_name}{suffix}")


def include_line(directory: Path) -> str:
    return f'Include "{directory}/*.config"'


def with_include(current: str, directory: Path) -> str | None:
    """The user's ssh config with the Include line at the top (Include must precede Host blocks);
    None when it has the line already."""
    include = include_line(directory)
    if any(line.strip() == include for line in current.splitlines()):
        return None
    return f"{_MARKER}\n{include}\n\n{current}"


def _ensure_include(directory: Path) -> None:
    """Add the Include line to the user's ssh config, keeping everything else in it, its mode, and a
    symlink to it (a dotfiles checkout) pointing where it did."""
    config = Path(os.path.realpath(user_config()))
    if (current := _read(config)) is not None and with_include(current, directory) is None:
        return  # there already: the usual case takes no lock
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with record_files.locked(config):
        current = _read(config)
        text = with_include(current or "", directory)
        if text is None:
            return
        mode = stat.S_IMODE(config.stat().st_mode) if current is not None else 0o600
        record_files.replace_atomically(config, text, mode=mode)


def _read(config: Path) -> str | None:
    try:
        return config.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None
