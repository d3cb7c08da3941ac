"""A teardown with `down` ends its cluster only when no other job holds it (gang.cluster_down), on the real
local state store: the last job's teardown ends it, a crashed run holds it one lease at most, a teardown
never touches another job's record, and a job cannot join a cluster whose teardown is ending it."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky import Task
from airflow_sky.gang import state as js
from airflow_sky.gang.cluster_down import holders, release_cluster
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.phases import job_states, register_job
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.infra.registry import open_cluster


def _states(tmp_path: Path) -> js.JobStates:
    return js.JobStates(LocalStateStore(tmp_path / "state"))


def _job(states: js.JobStates, key: str, status: JobStatus) -> int:
    state, _ = states.allocate(key, {"name": key, "submit_key": key})
    states.update(state.job_id, lambda s: dataclasses.replace(s, status=status))
    return state.job_id


@contextlib.contextmanager
def _alive(states: js.JobStates, job_id: int, every_s: float = 0.2) -> Iterator[None]:
    """Job `job_id`'s record written every `every_s`, as a running job's watcher renews its lease."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(every_s):
            states.update(job_id, lambda s: js.take_watch(s, "run-0", "watcher"))

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_holders_are_the_other_unfinished_jobs_written_within_their_lease():
    def job(job_id: int, status: JobStatus) -> js.JobState:
        return js.JobState(job_id=job_id, status=status, info={"submit_key": f"dag/run-{job_id}/provision"})

    jobs = [
        (job(1, JobStatus.RUNNING), 990.0),  # the teardown's own job
        (job(2, JobStatus.RUNNING), 995.0),  # alive
        (job(3, JobStatus.SUCCEEDED), 999.0),  # ended
        (job(4, JobStatus.SETTING_UP), 100.0),  # silent for 900 s: a crashed run, past its lease
    ]
    index = {"keys": {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}}  # 5: allocated, its record not written yet
    found = holders(jobs, index, 998.0, own_job=1, now=1000.0, lease_s=600.0)
    assert [(h.job_id, h.status, h.idle_s) for h in found] == [(2, "RUNNING", 5.0), (5, "REGISTERING", 2.0)]
    assert found[0].describe() == "job 2 (RUNNING, dag/run-2/provision; last sign of life 5s ago)"
    assert holders(jobs, index, 100.0, own_job=1, now=1000.0, lease_s=600.0)[-1].job_id == 2


def test_a_down_on_a_cluster_another_job_holds_keeps_it_and_the_last_job_ends_it(tmp_path):
    states = _states(tmp_path)
    first = _job(states, "run-1", JobStatus.SUCCEEDED)
    second = _job(states, "run-2", JobStatus.RUNNING)
    before = states.store.get(f"jobs/{second}")
    log: list[str] = []

    with _alive(states, second):
        release = release_cluster(states, first, down=True, log=log.append, poll_s=0.1)
    assert not release.terminate and release.down_requested
    assert [h.job_id for h in release.holders] == [second]
    after = states.store.get(f"jobs/{second}")
    assert after is not None and before is not None
    assert after.data["status"] == before.data["status"] == "RUNNING"  # only its own watcher wrote it
    assert states.index().data["down_requested"] == [first]

    # The second job ends; its own teardown does not ask for down, but the standing request ends the cluster.
    states.update(second, lambda s: dataclasses.replace(s, status=JobStatus.SUCCEEDED))
    last = release_cluster(states, second, down=False, log=log.append)
    assert last.terminate and last.deferred == (first,)  # and it releases the first job's buckets
    with pytest.raises(js.ClusterClosing, match="being torn down by the teardown of job 2"):
        states.allocate("run-3", {"name": "late"})


def test_without_down_and_without_a_request_the_cluster_is_kept(tmp_path):
    states = _states(tmp_path)
    job = _job(states, "run-1", JobStatus.SUCCEEDED)
    release = release_cluster(states, job, down=False, log=print)
    assert not release.terminate and not release.down_requested and release.holders == ()
    assert "closing" not in states.index().data


def test_a_run_that_crashed_just_now_holds_the_cluster_one_lease_at_most(tmp_path):
    states = _states(tmp_path)
    done = _job(states, "run-1", JobStatus.SUCCEEDED)
    _job(states, "crashed-run", JobStatus.RUNNING)  # written a moment ago, never again: its worker died
    log: list[str] = []
    started = time.monotonic()
    release = release_cluster(states, done, down=True, log=log.append, lease_s=3.0, poll_s=0.2)
    assert release.terminate
    assert time.monotonic() - started >= 2.0  # it waited for the silent holder's lease to run out
    assert len(log) == 1 and "waiting for a sign of life of job 2 (RUNNING, crashed-run" in log[0]


def test_a_silent_holder_that_speaks_again_keeps_the_cluster(tmp_path):
    states = _states(tmp_path)
    done = _job(states, "run-1", JobStatus.SUCCEEDED)
    slow = _job(states, "slow-run", JobStatus.PENDING)  # uploading its workdir: no write for a while
    speaks = threading.Timer(
        1.5, lambda: states.update(slow, lambda s: js.set_status(s, JobStatus.SETTING_UP, 0.0))
    )
    speaks.start()
    release = release_cluster(states, done, down=True, log=print, lease_s=60.0, poll_s=0.2)
    speaks.join()
    assert not release.terminate and [h.job_id for h in release.holders] == [slow]


def test_a_worker_clock_a_day_ahead_does_not_expire_a_live_job(tmp_path, monkeypatch):
    states = _states(tmp_path)
    done = _job(states, "run-1", JobStatus.SUCCEEDED)
    live = _job(states, "run-2", JobStatus.RUNNING)
    # A mock of a skewed worker clock: time.time in this process runs a day ahead. Leases are read on the
    # store's clock (here the state files' mtimes), so the live job still holds the cluster.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86400.0)
    with _alive(states, live):
        release = release_cluster(states, done, down=True, log=print, lease_s=600.0, poll_s=0.1)
    assert not release.terminate and [h.job_id for h in release.holders] == [live]


def test_a_teardown_that_died_midway_does_not_close_the_cluster_forever(tmp_path, monkeypatch):
    states = _states(tmp_path)
    job = _job(states, "run-1", JobStatus.SUCCEEDED)
    assert release_cluster(states, job, down=True, log=print).terminate  # ... and its terminate never ran
    with pytest.raises(js.ClusterClosing):
        states.allocate("run-2", {"name": "next"})
    monkeypatch.setattr(js, "CLOSING_STALE_S", 0.0)
    state, created = states.allocate("run-2", {"name": "next"})
    assert created and state.job_id == 2 and "closing" not in states.index().data


def test_a_job_joining_a_cluster_its_teardown_is_ending_waits_for_it_and_provisions_again(local_cluster):
    name, nodes, _ = local_cluster(1)
    cluster = open_cluster(name, "local")
    task = Task(name="late", num_nodes=1, run="true")
    first = register_job(cluster, task, nodes, submit_key="run-1")
    states = job_states(cluster)
    states.update(first.job_id, lambda s: dataclasses.replace(s, status=JobStatus.SUCCEEDED))
    assert release_cluster(states, first.job_id, down=True, log=print).terminate
    ending = threading.Timer(1.0, cluster.terminate)  # the teardown ends the nodes a moment later
    ending.start()
    with pytest.raises(js.ClusterClosing, match="being torn down by the teardown of job 1"):
        register_job(cluster, task, nodes, submit_key="run-2")
    ending.join()
    assert states.index() is None and cluster.nodes() == []  # it waited for the teardown to finish
    # Nodes seen before the teardown ended them are refused, even with the closing mark gone with them.
    with pytest.raises(js.ClusterClosing, match="torn down since it was provisioned"):
        register_job(cluster, task, nodes, submit_key="run-2")
    fresh = cluster.provision(1)
    handle = register_job(cluster, task, fresh, submit_key="run-2")
    assert [n.instance_id for n in handle.nodes] == [n.instance_id for n in fresh]
