"""Jobs that go on without their launcher: Ctrl-C in a launch hands the job to a background process that
drives it to its end (gang.detached); `exec --detach-run` on a busy cluster leaves a background engine
that waits for the job's turn in the cluster's queue and then runs it (queue_in_background).

The task (secrets included) reaches the background process on its stdin, never on a command line or in a
file. Its log goes to the launch's log file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_sky.client import events
from airflow_sky.client.engine import JobOutcome, LaunchOptions, private_airflow_home
from airflow_sky.errors import SkyError
from airflow_sky.gang.job import PHASES, JobHandle
from airflow_sky.task import Task
from airflow_sky.task.launch import Launch

QUEUED_FLAG = "--queued"


def hand_over(launch: Launch, job: dict[str, Any], log_file: Path) -> int:
    """Start the background driver of the job described by the launch's `job` event; returns its pid."""
    payload = json.dumps({"launch": launch.to_json(), "handle": job}).encode()
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


def queue_in_background(task: Task, options: LaunchOptions, listener: events.Listener) -> JobOutcome:
    """Run the launch in a background engine that outlives this process; return once its job is queued
    (PENDING, a `queued` event) or admitted (the `job` event). The engine follows the job to its end."""
    log_dir = private_airflow_home() / "logs" / "launch"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{options.cluster_name}-{time.strftime('%Y%m%d-%H%M%S')}-queued-{os.getpid()}.log"
    payload = Launch(task, dataclasses.replace(options, follow=True)).to_json()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_sky.client.detach", QUEUED_FLAG],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            text=True,
            start_new_session=True,  # the terminal's Ctrl-C must not reach it
            close_fds=True,
        )
    finally:
        os.close(fd)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)
    proc.stdin.close()
    job_id: int | None = None
    for line in proc.stdout:
        event = events.Event(**json.loads(line))
        listener(event)
        if event.kind in ("queued", "job"):
            job_id = int(event.data["job_id"])
            break
    proc.stdout.close()  # the engine goes on; what it would tell us now is dropped
    if job_id is None:
        proc.wait()
        raise SkyError(
            f"the background engine ended (exit code {proc.returncode}) before its job was queued; "
            f"its log: {log_file}"
        )
    return JobOutcome(
        succeeded=True,
        state="queued",
        cluster_name=options.cluster_name,
        job_id=job_id,
        log_file=log_file,
        step_times={},
        exit_codes={"setup": {}, "run": {}},
        failures=[],
    )


def _run_queued() -> int:
    """The background engine of queue_in_background: the launch's events go out as JSON lines while the
    launcher reads them (it stops reading once the job is queued)."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)

    def send(event: events.Event) -> None:
        with contextlib.suppress(OSError, ValueError):  # the launcher returned: nobody reads any more
            out.write(json.dumps(dataclasses.asdict(event)) + "\n")

    launch = Launch.from_json(sys.stdin.read())
    from airflow_sky.client.engine import run_job

    outcome = run_job(launch, listener=send)
    return 0 if outcome.succeeded else 1


def main() -> int:
    if sys.argv[1:] == [QUEUED_FLAG]:
        return _run_queued()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s detached %(levelname)s %(message)s")
    spec = json.loads(sys.stdin.buffer.read())
    from airflow_sky.client.cluster_lookup import forget
    from airflow_sky.gang.detached import drive
    from airflow_sky.gang.lifecycle import run_hooks
    from airflow_sky.infra.registry import open_cluster

    handle = JobHandle.from_dict(spec["handle"])
    launch = Launch.from_json(spec["launch"])
    phases = [p for p in PHASES if launch.options.setup or p != "setup"]
    cluster = open_cluster(handle.cluster_name, handle.infra)
    try:
        status = drive(cluster, launch.task, handle, phases)
    finally:
        if launch.options.down:
            logging.info("Taking cluster %s down, as the launch asked (--down)", handle.cluster_name)
            run_hooks(cluster, "down", logging.info, launch.task, handle.job_id)
            cluster.terminate()
            forget(handle.cluster_name)
            logging.info("Cluster %s is down", handle.cluster_name)
    return 0 if status.value == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
