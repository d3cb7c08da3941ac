"""Where the cloud's API does not report a notice (EC2, GCE), a rank that ends on a node that says it got one
waits for the infra: the node taken within the window is a recovery with notice; a node still up after it
means the job's own `notice` file decided nothing (real local nodes, playing a cloud that reports a noticed
node RUNNING; the detached driver's watcher)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from airflow_sky import Task
from airflow_sky.gang import notice_claims
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import JobHandle, JobStatus
from airflow_sky.gang.phases import register_job
from airflow_sky.gang.state import JobState
from airflow_sky.gang.watcher import recovery_triage
from airflow_sky.infra.base import Node, NodeStatus
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.local.cloud import LocalCloud


class _ApiWithoutNotices(LocalCloud):
    """A cloud whose API reports a noticed node RUNNING until it is gone, as EC2's and GCE's do."""

    notice_window_s = 6.0
    reports_notices = False

    def nodes(self, cluster_name: str) -> list[Node]:
        return [
            Node(**{**n.__dict__, "status": NodeStatus.RUNNING, "preempt_at": None})
            if n.status is NodeStatus.PREEMPTING
            else n
            for n in super().nodes(cluster_name)
        ]


TRAIN = """\
trap 'echo saved > "$PROBE/saved-$SKYPILOT_NODE_RANK"; exit 143' TERM
touch "$PROBE/up-$SKYPILOT_NODE_RANK"
while :; do sleep 0.2; done
"""


def _watch_run(cluster: Cluster, task: Task, handle: JobHandle, timeout: float = 120) -> JobState:
    """Start every rank and watch the run as a follow task does (the task's recovery policy), until the
    watch claims a relaunch or the run has a verdict."""
    job = GangJob.of(cluster, handle)
    for node in handle.run_nodes:
        assert job.start(task, "run", node.rank).started
    watch = job.watch("run", 0, list(handle.run_nodes), "test", recovery_triage(task.job_recovery))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            state, _ = watch.round(job.require())
            if state.relaunch is not None or state.phase("run", 0).killed or state.status.is_terminal:
                return state
            time.sleep(0.2)
    finally:
        watch.close()
    raise AssertionError("no verdict and no relaunch in time")


def _when(condition, act) -> threading.Thread:  # type: ignore[no-untyped-def]
    def run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not condition():
            time.sleep(0.1)
        act()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_noticed_rank_waits_for_the_cloud_to_take_its_node_then_recovers(
    local_cluster, tmp_path: Path
) -> None:
    name, nodes, _ = local_cluster(2)
    cloud = _ApiWithoutNotices()
    cluster = Cluster(name, "local", cloud)
    task = Task(run=TRAIN, num_nodes=2, envs={"PROBE": str(tmp_path)})
    handle = register_job(cluster, task, nodes, submit_key="claims")
    old = nodes[1].instance_id

    def notice_then_preempt() -> None:
        cloud.notify_preemption(name, 1, window_s=30)
        while not (tmp_path / "saved-1").exists():
            time.sleep(0.1)
        time.sleep(2)  # the watcher holds the fault meanwhile: the node still says RUNNING
        cloud.preempt_instance(name, old)

    thread = _when(lambda: (tmp_path / "up-0").exists() and (tmp_path / "up-1").exists(), notice_then_preempt)
    state = _watch_run(cluster, task, handle)
    thread.join(timeout=30)
    assert state.relaunch is not None, state
    assert state.relaunch.action.value == "RECOVER"
    assert state.relaunch.reason == "preemption notice for rank 1" or "lost" in state.relaunch.reason
    (notice,) = state.info["notices"]
    assert (notice["rank"], notice["generation"]) == (1, 0) and notice["seen_at"] <= notice["preempt_at"]


def test_a_job_that_writes_its_own_notice_and_exits_only_delays_its_failure(
    local_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notice_claims, "GRACE_S", 1.0)
    name, nodes, _ = local_cluster(2)
    cluster = Cluster(name, "local", _ApiWithoutNotices())
    fake = 'if [ "$SKYPILOT_NODE_RANK" = 1 ]; then echo "{}" > "$AIRFLOW_SKY_JOB_DIR/notice"; exit 143; fi; sleep 60'
    task = Task(run=fake, num_nodes=2)
    handle = register_job(cluster, task, nodes, submit_key="claims")
    started = time.monotonic()
    state = _watch_run(cluster, task, handle)
    took = time.monotonic() - started
    assert state.status is JobStatus.FAILED, state
    assert state.relaunch is None and "notices" not in state.info
    run = state.phase("run", 0)
    assert (run.failed_rank, run.failed_exit_code) == (1, 143)
    assert 6 <= took < 40, took  # held for the window (6 s) and the grace, never longer
