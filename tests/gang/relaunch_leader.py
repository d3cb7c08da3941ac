"""A relaunch leader in a process of its own, for tests/gang/test_fencing.py.

    python -m tests.gang.relaunch_leader SPEC_JSON

SPEC: cluster, job handle, probe dir, owner, events file, and optionally
  pause_before_replace   stop this whole process (SIGSTOP to itself) when it is about to pass its fence
                         for a node replacement: a worker paused mid-relaunch (the test sends SIGCONT)
  clock_skew_s           a mock of a worker clock that is off: time.time in THIS process only is shifted
  slow_replace_s         sleep this long inside each replacement (a slow cloud), renewing the lead meanwhile
  heartbeat_s            how often the leader renews (gang.relaunch.HEARTBEAT_S)

Each event is one JSON line in the events file: {"event": "replace"|"done"|"lead-lost"|"error", ...}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from airflow_sky import Task
from airflow_sky.gang import relaunch
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import job_states
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.registry import open_cluster


def main(spec: dict[str, Any]) -> None:
    events = Path(spec["events"])

    def event(name: str, **fields: Any) -> None:
        with events.open("a") as f:
            f.write(json.dumps({"event": name, "pid": os.getpid(), **fields}) + "\n")

    if spec.get("clock_skew_s"):
        real_time = time.time
        skew = float(spec["clock_skew_s"])
        time.time = lambda: real_time() + skew  # type: ignore[assignment]  # the mock of a skewed clock
    relaunch.HEARTBEAT_S = float(spec.get("heartbeat_s", relaunch.HEARTBEAT_S))

    real_check = relaunch.Fence.check
    paused = False

    def check(self: relaunch.Fence, step: str) -> None:
        nonlocal paused
        if spec.get("pause_before_replace") and step.startswith("replace") and not paused:
            paused = True
            event("pausing", step=step, token=self.token)
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole process stops, heartbeat thread included
        real_check(self, step)

    relaunch.Fence.check = check  # type: ignore[method-assign]

    real_replace = Cluster.replace

    def replace(self: Cluster, rank: int) -> Any:
        event("replace", rank=rank)
        time.sleep(float(spec.get("slow_replace_s", 0)))
        node = real_replace(self, rank)
        event("replaced", rank=rank, instance_id=node.instance_id)
        return node

    Cluster.replace = replace  # type: ignore[method-assign]

    cluster = open_cluster(spec["cluster"], "local")
    task = Task(name="lead", num_nodes=2, envs={"PROBE": spec["probe"]}, run=spec["run"])
    handle = JobHandle.from_dict(spec["handle"])
    lines: list[str] = []
    try:
        state = relaunch.follow_relaunch(
            cluster, job_states(cluster), task, handle, 0, spec["owner"], lines.append
        )
        event("done", generation=state.generation, log=lines)
    except Exception as e:  # reported to the test, which asserts on it
        event("error", error=f"{type(e).__name__}: {e}", log=lines)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
