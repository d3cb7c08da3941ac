"""Ctrl-C in a launch: hand the job to a background process that drives it to its end (gang.detached).

The task (secrets included) reaches the background process on its stdin, never on a command line or in a
file. Its log goes to the launch's log file.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_sky.gang.job import PHASES, JobHandle
from airflow_sky.task import Task


def hand_over(task: Task, job: dict[str, Any], setup: bool, down: bool, log_file: Path) -> int:
    """Start the background driver of the job described by the launch's `job` event; returns its pid."""
    phases = [p for p in PHASES if setup or p != "setup"]
    payload = json.dumps(
        {"task": task.to_dict(), "base_dir": task.base_dir, "handle": job, "phases": phases, "down": down}
    ).encode()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_sky.client.detach"],
            stdin=subprocess.PIPE,
            stdout=fd,
            stderr=fd,
            start_new_session=True,  # the terminal's next Ctrl-C must not reach it
            close_fds=True,
        )
    finally:
        os.close(fd)
    assert proc.stdin is not None
    proc.stdin.write(payload)
    proc.stdin.close()
    return proc.pid


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s detached %(levelname)s %(message)s")
    spec = json.loads(sys.stdin.buffer.read())
    from airflow_sky.client import sdk
    from airflow_sky.gang.detached import drive
    from airflow_sky.infra.registry import open_cluster

    handle = JobHandle.from_dict(spec["handle"])
    task = Task.from_dict(spec["task"], base_dir=spec["base_dir"])
    cluster = open_cluster(handle.cluster_name, handle.infra)
    try:
        status = drive(cluster, task, handle, spec["phases"])
    finally:
        if spec["down"]:
            logging.info("Taking cluster %s down, as the launch asked (--down)", handle.cluster_name)
            sdk.down(handle.cluster_name)
            logging.info("Cluster %s is down", handle.cluster_name)
    return 0 if status.value == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
