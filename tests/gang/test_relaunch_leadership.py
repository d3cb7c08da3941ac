"""Who leads a relaunch, on real local nodes: one leader whatever each follower believes, takeover of a dead
leader, a retried leader resuming its own claim, and a cancel that ends a relaunch midway."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from airflow_sky import Task
from airflow_sky.errors import JobFailed
from airflow_sky.gang import state as js
from airflow_sky.gang.cluster_jobs import ClusterJobs
from airflow_sky.gang.follow import Wake
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.phases import job_states, register_job, start_rank
from airflow_sky.gang.recovery import Action, Decision
from airflow_sky.gang.relaunch import follow_relaunch
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import jobs as node_jobs
from airflow_sky.task import JobRecovery, Resources


def _job(local_cluster, probe: Path, run: str, num_nodes: int = 2, **task_fields):
    name, nodes, _ = local_cluster(num_nodes)
    cluster = open_cluster(name, "local")
    task = Task(name="lead", num_nodes=num_nodes, envs={"PROBE": str(probe)}, run=run, **task_fields)
    handle = register_job(cluster, task, nodes, submit_key="test")
    for node in nodes:
        assert start_rank(cluster, task, handle, "run", node.rank).started
    return cluster, task, handle, job_states(cluster)


def _starts(probe: Path) -> list[str]:
    path = probe / "starts"
    return path.read_text().splitlines() if path.exists() else []


def _starts_once_written(probe: Path, count: int, timeout_s: float = 60.0) -> list[str]:
    """The recorded starts, sorted, once `count` lines are there: a relaunch returns once it started every
    rank's script detached, before each script has run its first line (a loaded machine delays that)."""
    deadline = time.monotonic() + timeout_s
    while len(_starts(probe)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a start recorded twice would show up now
    return sorted(_starts(probe))


RECORD_START = 'echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> "$PROBE/starts"; '


def test_two_followers_with_different_health_views_relaunch_the_job_once(local_cluster, tmp_path):
    run = (
        RECORD_START
        + '[ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ] && [ "$SKYPILOT_NODE_RANK" = 1 ] && exit 1; sleep 2'
    )
    cluster, task, handle, states = _job(local_cluster, tmp_path, run)

    # Follower A believes rank 1's node is lost (RECOVER); follower B sees a plain error (RESTART).
    views = {
        0: lambda state, rank, code, unhealthy: Decision(Action.RECOVER, "A: node of rank 1 lost"),
        1: lambda state, rank, code, unhealthy: Decision(Action.RESTART, "B: exit code 1, restart 1"),
    }
    logs: dict[int, list[str]] = {0: [], 1: []}
    outcomes: dict[int, object] = {}

    def follow(rank: int) -> None:
        follower = GangJob(cluster, handle.job_id, states=states).follower(
            "run",
            0,
            rank,
            list(handle.nodes),
            f"owner-{rank}",
            emit=logs[rank].append,
            triage=views[rank],
            state_interval_s=0.1,
        )
        # Both watch (their leases are forced free each round): each writes the fault as it sees it.
        step = None
        while step is None:
            states.update(handle.job_id, lambda s: js.dataclasses.replace(s, watchers={}))
            step = follower.step()
            time.sleep(0.05)
        follower.close()
        assert step.wake is Wake.RELAUNCH, step
        outcomes[rank] = follow_relaunch(cluster, states, task, handle, 0, f"owner-{rank}", logs[rank].append)

    threads = [threading.Thread(target=follow, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    state = states.require(handle.job_id)
    assert state.generation == 1 and state.relaunch is None
    leaders = [r for r in (0, 1) if any("Relaunching job" in line for line in logs[r])]
    assert len(leaders) == 1, logs
    assert state.recoveries + state.restarts == 1
    assert _starts_once_written(tmp_path, 4) == ["0 0", "0 1", "1 0", "1 1"]  # each rank once per generation
    assert [n["instance_id"] for n in state.nodes] == [n.instance_id for n in handle.nodes]  # none replaced


def test_a_leader_that_dies_after_its_claim_is_taken_over(local_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(js, "LEADER_LEASE_S", 3.0)
    cluster, task, handle, states = _job(local_cluster, tmp_path, RECORD_START + "sleep 30")
    decision = Decision(Action.RESTART, "exit code 1")
    states.update(handle.job_id, lambda s: js.claim_relaunch(s, 0, decision, time.time()))
    # A leader claims and is killed before it did anything (its task's worker died): no heartbeat follows.
    states.update(handle.job_id, lambda s: js.lead_relaunch(s, "dead-worker"))
    started = time.monotonic()
    log: list[str] = []
    state = follow_relaunch(cluster, states, task, handle, 0, "survivor", log.append)
    assert 2.5 < time.monotonic() - started < 60
    assert state.generation == 1 and state.history[-1]["action"] == "RESTART"
    assert any("Relaunching job" in line for line in log)
    assert _starts_once_written(tmp_path, 4) == ["0 0", "0 1", "1 0", "1 1"]
    ClusterJobs(cluster).cancel([handle.job_id])


def test_a_retried_leader_task_resumes_its_own_claim_at_once(local_cluster, tmp_path):
    cluster, task, handle, states = _job(local_cluster, tmp_path, RECORD_START + "sleep 30")
    states.update(
        handle.job_id, lambda s: js.claim_relaunch(s, 0, Decision(Action.RESTART, "x"), time.time())
    )
    states.update(handle.job_id, lambda s: js.lead_relaunch(s, "dag/run/run_follow/0"))
    # Airflow cleared the try's XComs on retry; the claim lives in the job state, under the task's name.
    started = time.monotonic()
    state = follow_relaunch(cluster, states, task, handle, 0, "dag/run/run_follow/0", lambda line: None)
    assert time.monotonic() - started < js.LEADER_LEASE_S / 2
    assert state.generation == 1
    ClusterJobs(cluster).cancel([handle.job_id])


def _claimed_job(local_cluster, probe: Path):
    """A running 2-node job with a relaunch claimed and no leader yet."""
    cluster, task, handle, states = _job(local_cluster, probe, RECORD_START + "sleep 30")
    states.update(
        handle.job_id, lambda s: js.claim_relaunch(s, 0, Decision(Action.RESTART, "x"), time.time())
    )
    return cluster, task, handle, states


def test_an_ssh_error_during_the_relaunch_is_tried_again_and_the_job_relaunches_once(
    local_cluster, tmp_path, monkeypatch
):
    from airflow_sky.errors import RemoteError
    from airflow_sky.gang import relaunch

    monkeypatch.setattr(relaunch, "RELAUNCH_RETRY_DELAY_S", 0.1)
    cluster, task, handle, states = _claimed_job(local_cluster, tmp_path)
    # Fault injection (no real node drops a connection on cue): the first start of the new generation fails
    # as an SSH error does; the real start runs after it.
    real_start, failures = node_jobs.start_job, []

    def flaky_start(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise RemoteError("command on node rank 1 timed out after 120s")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(node_jobs, "start_job", flaky_start)
    log: list[str] = []
    state = follow_relaunch(cluster, states, task, handle, 0, "leader", log.append)
    assert state.generation == 1 and state.relaunch is None
    assert any("The relaunch failed (try 1 of 3): command on node rank 1 timed out" in line for line in log)
    assert _starts_once_written(tmp_path, 4) == ["0 0", "0 1", "1 0", "1 1"]  # each rank once per generation
    ClusterJobs(cluster).cancel([handle.job_id])


def test_a_relaunch_that_keeps_failing_fails_the_job_with_the_error_instead_of_leaving_its_claim(
    local_cluster, tmp_path, monkeypatch
):
    from airflow_sky.errors import RemoteError
    from airflow_sky.gang import relaunch

    monkeypatch.setattr(relaunch, "RELAUNCH_RETRY_DELAY_S", 0.1)
    cluster, task, handle, states = _claimed_job(local_cluster, tmp_path)

    def broken_start(*args, **kwargs):  # fault injection: every start fails as a dead SSH session does
        raise RemoteError("connection reset")

    monkeypatch.setattr(node_jobs, "start_job", broken_start)
    with pytest.raises(JobFailed, match="the relaunch failed 3 times, last: connection reset"):
        follow_relaunch(cluster, states, task, handle, 0, "leader", lambda line: None)
    state = states.require(handle.job_id)
    assert state.status is JobStatus.FAILED and state.relaunch is None
    assert "connection reset" in (state.phases[js.phase_key("run", 0)].reason or "")
    ClusterJobs(cluster).cancel([handle.job_id])


def test_a_cancel_during_a_recovery_ends_the_job_and_nothing_of_the_new_generation_runs(
    local_cluster, tmp_path
):
    # The replacement node's setup takes a while: the cancel lands while the leader waits for it.
    cluster, task, handle, states = _job(
        local_cluster,
        tmp_path,
        RECORD_START + "sleep 60",
        setup='touch "$PROBE/setup-$SKYPILOT_SETUP_NODE_RANK"; sleep 6',
    )
    LocalCloud().preempt(cluster.name, 1)
    decision = Decision(Action.RECOVER, "node of rank 1 lost")
    states.update(handle.job_id, lambda s: js.claim_relaunch(s, 0, decision, time.time()))
    errors: list[BaseException] = []

    def lead() -> None:
        try:
            follow_relaunch(cluster, states, task, handle, 0, "leader", print)
        except BaseException as e:
            errors.append(e)

    leader = threading.Thread(target=lead)
    leader.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "setup-1").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "setup-1").exists(), f"the replacement's setup never started: {errors}"
    assert ClusterJobs(cluster).cancel([handle.job_id]) == [handle.job_id]
    leader.join(timeout=60)
    assert errors and isinstance(errors[0], JobFailed) and errors[0].status == "CANCELLED"
    state = states.require(handle.job_id)
    assert state.status is JobStatus.CANCELLED and state.generation == 0 and state.relaunch is None
    assert "0 1" not in _starts(tmp_path) and "1 1" not in _starts(tmp_path)
    # A cancelled job is never relaunched, whatever a follower sees next.
    with pytest.raises(js.Unchanged):
        js.claim_relaunch(state, 0, decision, time.time())


def _rank_0_step(cluster, states, handle, operator):
    """What rank 0's follower wakes up to next."""
    follower = GangJob(cluster, handle.job_id, states=states).follower(
        "run",
        0,
        0,
        list(handle.nodes),
        "rank-0",
        emit=lambda line: None,
        triage=operator._triage(),
        state_interval_s=0.1,
    )
    try:
        return follower.run(0.1)
    finally:
        follower.close()


def test_on_kill_of_one_rank_cancels_the_job_even_with_restarts_allowed(local_cluster, tmp_path):
    from airflow_sky.operators.phase import SkyFollowOperator

    cluster, task, handle, states = _job(
        local_cluster,
        tmp_path,
        RECORD_START + "sleep 60",
        resources=Resources(job_recovery=JobRecovery(max_restarts_on_errors=3)),
    )
    operator = SkyFollowOperator(
        task_id="run_follow", sky_task=task, phase="run", node={"rank": 1}, cluster=handle.to_dict()
    )
    operator._following = (cluster, list(handle.nodes), 0, states, handle.job_id)
    operator.on_kill()  # the UI marked rank 1's task failed, or it ran past its execution_timeout
    step = _rank_0_step(cluster, states, handle, operator)
    assert step.wake is Wake.FAILED and step.error is not None and step.error.status == "CANCELLED"
    state = states.require(handle.job_id)
    assert state.status is JobStatus.CANCELLED and state.generation == 0
    assert state.phase("run").killed  # the watcher stopped every rank
    assert sorted(_starts(tmp_path)) == ["0 0", "1 0"]  # never relaunched


class _TaskInstanceAnswering:
    """Stands in for the task instance in the context: answers get_ti_count as Airflow's execution API
    would (the deployment test, tests/deploy, runs the real one under a real scheduler)."""

    dag_id, task_id, run_id = "d", "job.run_follow", "r"

    def __init__(self, failed: int) -> None:
        self.failed = failed
        self.asked: list[dict[str, object]] = []

    def get_ti_count(self, **query: object) -> int:
        self.asked.append(query)
        if self.failed < 0:
            raise ConnectionError("the API server did not answer")
        return self.failed


def test_a_follow_task_that_sees_a_failed_sibling_cancels_the_job_and_names_why(local_cluster, tmp_path):
    """A task marked failed before it ran had no on_kill to call: its siblings must stop the job."""
    from airflow_sky.operators.phase import SkyFollowOperator

    cluster, task, handle, states = _job(local_cluster, tmp_path, RECORD_START + "sleep 60")
    operator = SkyFollowOperator(
        task_id="run_follow", sky_task=task, phase="run", node={"rank": 0}, cluster=handle.to_dict()
    )
    healthy = _TaskInstanceAnswering(failed=0)
    operator._cancel_if_a_sibling_failed({"ti": healthy}, states, handle.job_id)
    assert states.require(handle.job_id).status is JobStatus.RUNNING  # no failed sibling: nothing happens
    assert healthy.asked == [
        {"dag_id": "d", "task_ids": ["job.run_follow"], "run_ids": ["r"], "states": ["failed"]}
    ]
    operator._cancel_if_a_sibling_failed({"ti": _TaskInstanceAnswering(failed=-1)}, states, handle.job_id)
    assert states.require(handle.job_id).status is JobStatus.RUNNING  # no answer: following goes on

    operator._cancel_if_a_sibling_failed({"ti": _TaskInstanceAnswering(failed=1)}, states, handle.job_id)
    step = _rank_0_step(cluster, states, handle, operator)
    assert step.wake is Wake.FAILED and step.error is not None and step.error.status == "CANCELLED"
    assert "a follow task of the job was failed in Airflow" in str(step.error)
    assert states.require(handle.job_id).status is JobStatus.CANCELLED
