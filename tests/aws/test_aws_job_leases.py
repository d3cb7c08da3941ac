"""Fencing and the teardown's job lease on the aws state store: DynamoDB (moto's server, over real HTTP).

Two leaders race for a relaunch through the same table from two store clients (two workers); the deposed
one's steps are refused. A teardown keeps a cluster another job holds, judged on DynamoDB's clock.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid

from airflow_sky.gang import state as js
from airflow_sky.gang.cluster_down import release_cluster
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.recovery import Action, Decision
from airflow_sky.infra.aws.state_store import DynamoDbStateStore
from tests.aws.conftest import boto


def _states(endpoint: str, table: str, cluster: str) -> js.JobStates:
    """One worker's view of the cluster's job states: its own DynamoDB client."""
    return js.JobStates(DynamoDbStateStore(boto("dynamodb", endpoint), table, cluster))


def test_two_workers_racing_for_a_relaunch_get_one_leader_and_the_deposed_one_is_refused(moto_endpoint):
    table, cluster = f"sky-state-{uuid.uuid4().hex[:6]}", "fence"
    worker_a, worker_b = (_states(moto_endpoint, table, cluster) for _ in range(2))
    state, _ = worker_a.allocate("run", {"name": "job"})
    job = state.job_id
    worker_a.update(job, lambda s: dataclasses.replace(s, status=JobStatus.RUNNING))
    worker_a.update(job, lambda s: js.claim_relaunch(s, 0, Decision(Action.RESTART, "exit 1"), 0.0))

    won: dict[str, bool] = {}

    def lead(name: str, states: js.JobStates) -> None:
        won[name] = states.update(job, lambda s: js.lead_relaunch(s, name))[1]

    threads = [threading.Thread(target=lead, args=(n, s)) for n, s in (("a", worker_a), ("b", worker_b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won.values()) == [False, True]  # exactly one took the lead
    leader = next(name for name, ok in won.items() if ok)
    other, other_states = ("b", worker_b) if leader == "a" else ("a", worker_a)
    claim = worker_a.require(job).relaunch
    assert claim is not None and claim.leader == leader and claim.fence == 1

    # The leader went quiet; the other watched (leader, token, beat) stand still and takes over.
    state, took = other_states.update(job, lambda s: js.lead_relaunch(s, other, stale=claim.lease))
    assert took and state.relaunch is not None and state.relaunch.fence == 2
    leader_states = worker_a if leader == "a" else worker_b
    assert not leader_states.update(job, lambda s: js.fenced(s, 1))[1]  # the deposed leader's step: refused
    assert not leader_states.update(job, lambda s: js.relaunched(s, 1, [], [], 0.0))[1]
    assert other_states.update(job, lambda s: js.fenced(s, 2))[1]


def test_a_teardown_keeps_a_cluster_another_job_holds_on_dynamodbs_clock(moto_endpoint):
    table, cluster = f"sky-state-{uuid.uuid4().hex[:6]}", "shared"
    states = _states(moto_endpoint, table, cluster)
    done, _ = states.allocate("run-1", {"name": "first", "submit_key": "run-1"})
    running, _ = states.allocate("run-2", {"name": "second", "submit_key": "run-2"})
    states.update(done.job_id, lambda s: dataclasses.replace(s, status=JobStatus.SUCCEEDED))
    states.update(running.job_id, lambda s: dataclasses.replace(s, status=JobStatus.RUNNING))
    stop = threading.Event()

    def watcher() -> None:  # the running job's watcher renews its lease (writes its record) every second
        other = _states(moto_endpoint, table, cluster)
        while not stop.wait(1.0):
            other.update(running.job_id, lambda s: js.take_watch(s, "run-0", "w"))

    renewing = threading.Thread(target=watcher)
    renewing.start()
    try:
        release = release_cluster(states, done.job_id, down=True, log=print, poll_s=0.5)
    finally:
        stop.set()
        renewing.join()
    assert not release.terminate and release.down_requested
    assert [h.job_id for h in release.holders] == [running.job_id]
    assert states.index().data["down_requested"] == [done.job_id]
