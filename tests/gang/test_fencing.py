"""Fencing of relaunch leaders: two real leaders (one in a process of its own, tests/gang/relaunch_leader.py)
race over the real local state store, on real local nodes.

A leader paused mid-relaunch (SIGSTOP: its heartbeats stop too) is taken over by a follower that watched its
lease stand still on its own monotonic clock; once resumed, its next step is refused by the job state and it
never replaces a node. A leader on a clock an hour off (time.time mocked in its process only) keeps its lead
for as long as it renews.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_sky import Task
from airflow_sky.gang import state as js
from airflow_sky.gang.cluster_jobs import ClusterJobs
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import job_states, register_job, start_rank
from airflow_sky.gang.recovery import Action, Decision
from airflow_sky.gang.relaunch import follow_relaunch
from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.registry import open_cluster

REPO = Path(__file__).resolve().parents[2]
RUN = 'echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> "$PROBE/starts"; sleep 60'


def _recovering_job(local_cluster, probe: Path) -> tuple[Cluster, Task, JobHandle, js.JobStates]:
    """A running 2-node job whose rank 1 node was preempted, with the relaunch claimed and nobody leading."""
    name, nodes, _ = local_cluster(2)
    cluster = open_cluster(name, "local")
    task = Task(name="lead", num_nodes=2, envs={"PROBE": str(probe)}, run=RUN)
    handle = register_job(cluster, task, nodes, submit_key="test")
    for node in nodes:
        assert start_rank(cluster, task, handle, "run", node.rank).started
    states = job_states(cluster)
    LocalCloud().preempt(name, 1)
    decision = Decision(Action.RECOVER, "node of rank 1 lost")
    states.update(handle.job_id, lambda s: js.claim_relaunch(s, 0, decision, time.time()))
    return cluster, task, handle, states


def _leader_process(
    cluster: Cluster, handle: JobHandle, probe: Path, owner: str, **options: Any
) -> tuple[subprocess.Popen[bytes], Path]:
    events = probe / f"events-{owner}.jsonl"
    spec = {
        "cluster": cluster.name,
        "handle": handle.to_dict(),
        "probe": str(probe),
        "run": RUN,
        "owner": owner,
        "events": str(events),
        **options,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.gang.relaunch_leader", json.dumps(spec)], cwd=REPO
    )
    return process, events


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(what: str, check: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _starts(probe: Path, count: int) -> list[str]:
    path = probe / "starts"
    _wait_for(f"{count} starts", lambda: path.exists() and len(path.read_text().splitlines()) >= count, 60)
    time.sleep(0.5)  # a start recorded twice would show up now
    return sorted(path.read_text().splitlines())


def test_a_paused_leader_is_taken_over_and_its_replace_is_refused_once_it_resumes(
    local_cluster, tmp_path, monkeypatch
):
    monkeypatch.setattr(js, "LEADER_LEASE_S", 3.0)
    cluster, task, handle, states = _recovering_job(local_cluster, tmp_path)
    leader_a, events_a = _leader_process(cluster, handle, tmp_path, "leader-a", pause_before_replace=True)
    try:
        # A took the lead (token 1), stopped the old generation and is about to replace rank 1: paused.
        _wait_for("leader A to pause", lambda: any(e["event"] == "pausing" for e in _events(events_a)))
        _wait_for("leader A to be stopped", lambda: _stopped(leader_a.pid))
        assert states.require(handle.job_id).relaunch.leader == "leader-a"

        log: list[str] = []
        state = follow_relaunch(cluster, states, task, handle, 0, "leader-b", log.append)
        assert any("Taking over the relaunch from leader-a" in line for line in log), log
        assert state.generation == 1 and state.fences == 2
        rank_1 = next(n for n in state.nodes if n["rank"] == 1)

        os.kill(leader_a.pid, signal.SIGCONT)
        assert leader_a.wait(timeout=120) == 0
    finally:
        if leader_a.poll() is None:
            os.kill(leader_a.pid, signal.SIGCONT)
            leader_a.kill()
    events = _events(events_a)
    assert [e["event"] for e in events] == ["pausing", "done"], events  # A never called replace
    assert events[-1]["generation"] == 1
    assert any("Refused to replace the node of rank 1" in line for line in events[-1]["log"]), events
    live = {n.rank: n for n in cluster.nodes()}
    assert live[1].instance_id == rank_1["instance_id"] and live[1].status is NodeStatus.RUNNING
    assert _starts(tmp_path, 4) == ["0 0", "0 1", "1 0", "1 1"]  # each rank once per generation
    final = states.require(handle.job_id)
    assert (final.generation, final.recoveries, len(final.history)) == (1, 1, 1)
    ClusterJobs(cluster).cancel([handle.job_id])


def test_a_leader_on_a_clock_an_hour_behind_keeps_its_lead_while_it_renews(
    local_cluster, tmp_path, monkeypatch
):
    monkeypatch.setattr(js, "LEADER_LEASE_S", 3.0)
    cluster, task, handle, states = _recovering_job(local_cluster, tmp_path)
    # Its replacement takes three leases' time; its clock (mocked in its process only) is an hour behind.
    leader_a, events_a = _leader_process(
        cluster, handle, tmp_path, "leader-a", clock_skew_s=-3600, slow_replace_s=9, heartbeat_s=0.5
    )
    try:
        _wait_for("leader A to replace", lambda: any(e["event"] == "replace" for e in _events(events_a)))
        log: list[str] = []
        state = follow_relaunch(cluster, states, task, handle, 0, "follower-b", log.append)
        assert leader_a.wait(timeout=120) == 0
    finally:
        if leader_a.poll() is None:
            leader_a.kill()
    assert not any("Taking over" in line for line in log), log
    assert any("Waiting for the relaunch led by leader-a" in line for line in log), log
    events = _events(events_a)
    assert [e["event"] for e in events] == ["replace", "replaced", "done"], events
    assert state.generation == 1 and state.fences == 1  # one leader, one token
    assert state.nodes[1]["instance_id"] == events[1]["instance_id"]
    assert _starts(tmp_path, 4) == ["0 0", "0 1", "1 0", "1 1"]
    ClusterJobs(cluster).cancel([handle.job_id])
