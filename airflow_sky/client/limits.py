"""The process's own resource limits, raised to what a launch needs instead of asking users for `ulimit -n`."""

from __future__ import annotations

import resource

# Per node a launch holds one SSH connection (a socket, and paramiko's pipes), an rsync now and then, and
# its share of Airflow's own files; with the headroom Airflow and Python need for themselves.
FILES_PER_NODE = 8
BASE_FILES = 1024


def open_files_needed(num_nodes: int) -> int:
    return BASE_FILES + FILES_PER_NODE * max(1, num_nodes)


def raise_open_file_limit(num_nodes: int) -> int:
    """Raise the soft RLIMIT_NOFILE to what `num_nodes` need (up to the hard limit); returns the soft limit.

    Only ever raises: a limit set higher by the user is kept.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = open_files_needed(num_nodes)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    return soft
