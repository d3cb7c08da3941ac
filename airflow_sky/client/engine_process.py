"""The engine in a process of its own, for callers that already run Airflow (an SDK launch from a task).

The in-process engine needs Airflow configured for the private home before Airflow is imported. In a
process that imported Airflow already (an Airflow worker running a task that calls `airflow_sky.launch`),
Airflow is bound to the caller's home: its DB and its dags folder, where a launch DAG must never be
written. So the launch runs in a child process with the private home; its events come back as JSON lines
and reach the caller's listener as if the engine ran in-process. The task (secrets included) goes to the
child on its stdin, never on a command line or in a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_sky.client import events
from airflow_sky.client.engine import AIRFLOW_HOME_ENV, KEPT_SETTINGS_PREFIX, JobOutcome, private_airflow_home
from airflow_sky.errors import SkyError
from airflow_sky.gang.job import JobHandle
from airflow_sky.task.launch import Launch


def caller_runs_airflow() -> bool:
    """Airflow is imported and configured for another home than the private one."""
    return "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(private_airflow_home())


def child_environment(parent: dict[str, str]) -> dict[str, str]:
    """The parent's environment without its Airflow configuration (the child configures the private one),
    but with airflow-sky's own `[sky]` settings."""
    env = {
        k: v
        for k, v in parent.items()
        if (not k.startswith("AIRFLOW__") or k.startswith(KEPT_SETTINGS_PREFIX)) and k != "AIRFLOW_HOME"
    }
    env[AIRFLOW_HOME_ENV] = str(private_airflow_home())
    return env


def run_job_in_child(launch: Launch, listener: events.Listener | None = None) -> JobOutcome:
    payload = launch.to_json()
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_sky.client.engine_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_environment(dict(os.environ)),
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)
    proc.stdin.close()
    outcome: JobOutcome | None = None
    error = ""
    try:
        for line in proc.stdout:
            message = json.loads(line)
            if message["type"] == "event" and listener is not None:
                listener(events.Event(**message["event"]))
            elif message["type"] == "outcome":
                outcome = _outcome_from_dict(message["outcome"])
            elif message["type"] == "error":
                error = message["error"]
    finally:
        proc.wait()
    if outcome is None:
        raise SkyError(error or f"the launch process ended with exit code {proc.returncode} and no outcome")
    return outcome


def _outcome_to_dict(outcome: JobOutcome) -> dict[str, Any]:
    data = dataclasses.asdict(outcome)
    data["log_file"] = str(outcome.log_file)
    data["handle"] = outcome.handle.to_dict() if outcome.handle else None
    return data


def _outcome_from_dict(data: dict[str, Any]) -> JobOutcome:
    data = dict(data)
    data["log_file"] = Path(data["log_file"])
    data["handle"] = JobHandle.from_dict(data["handle"]) if data.get("handle") else None
    data["step_times"] = {k: tuple(v) for k, v in data["step_times"].items()}
    data["exit_codes"] = {p: {int(r): c for r, c in codes.items()} for p, codes in data["exit_codes"].items()}
    return JobOutcome(**data)


def main() -> int:
    # While the DAG runs, the engine sends fd 1 to the launch log: messages go out on a copy of it.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")

    launch = Launch.from_json(sys.stdin.read())
    from airflow_sky.client.engine import run_job

    try:
        outcome = run_job(
            launch,
            listener=lambda event: send({"type": "event", "event": dataclasses.asdict(event)}),
        )
    except SkyError as e:
        send({"type": "error", "error": str(e)})
        return 1
    send({"type": "outcome", "outcome": _outcome_to_dict(outcome)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
