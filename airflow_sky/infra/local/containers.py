"""Removing local nodes' containers (`image_id: docker:...`) when their nodes end.

A local node's container is a child of the node's runtime, not of the node's server: killing the server
stops its processes (the server is their subreaper), but the runtime still holds the container. The nodes
share this machine, so the worker removes them here, one runtime call per runtime for a whole cluster,
before it kills the nodes' processes (a container whose monitor died with its node takes a second `rm`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from airflow_sky.node.container import LABEL, NAME_PREFIX, RUNTIMES, instance_container_name


def remove_containers(instance_ids: Iterable[str]) -> list[str]:
    """Remove the containers of these local instances, under whichever runtime holds them; returns the
    names removed. Machines without Docker or Podman cost nothing."""
    wanted = {instance_container_name(i) for i in instance_ids}
    removed: list[str] = []
    for runtime in RUNTIMES:
        binary = shutil.which(runtime)
        if binary is None or not wanted:
            continue
        listed = subprocess.run(
            [binary, "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if listed.returncode != 0:  # docker without its daemon: it holds none of ours
            continue
        names = sorted(wanted & {n.strip() for n in listed.stdout.split() if n.startswith(NAME_PREFIX)})
        if names:
            # Twice: a container whose node was killed lost its monitor (conmon), and the first `rm` only
            # marks it exited, after waiting for an exit status that never comes; the second removes it.
            for _ in range(2):
                done = subprocess.run(
                    [binary, "rm", "-f", *names], capture_output=True, timeout=300, check=False
                )
                if done.returncode == 0:
                    break
            removed += names
    return removed
