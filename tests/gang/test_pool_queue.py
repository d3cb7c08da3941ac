"""A pool's queue (gang.pool) on real state stores (the local infra's files): one job per worker, in ticket
order, a worker free again once its job ends, and nothing held by a job that died."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.gang import pool as gp
from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobStatus
from airflow_sky.infra.local import layout
from airflow_sky.infra.local.state_store import LocalStateStore

WORKERS = ("p-0", "p-1")


class Pool:
    """A pool's queue over state stores under `root`, and a way to put jobs on its workers' clusters."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.queue = gp.PoolQueue(LocalStateStore(root / "pool"), self.jobs)
        gp.write_pool(self.queue.store, gp.PoolRecord("p", "local", WORKERS, 1, {}, 0.0))

    def jobs(self, worker: str) -> js.JobStates:
        return js.JobStates(LocalStateStore(self.root / worker))

    def register(self, worker: str, key: str) -> int:
        """A job registered on the worker's cluster (what provision does once it has the worker)."""
        state, _ = self.jobs(worker).allocate(key, {"name": key})
        self.jobs(worker).update(state.job_id, lambda s: js.set_status(s, JobStatus.RUNNING, time.time()))
        return state.job_id

    def finish(self, worker: str, job_id: int) -> None:
        self.jobs(worker).update(job_id, lambda s: js.set_status(s, JobStatus.SUCCEEDED, time.time()))


def _no_sleep(_: float) -> None:
    raise AssertionError("a free worker was there: the job must not wait")


def test_jobs_take_distinct_free_workers_then_wait_until_one_is_handed_back(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    said: list[str] = []
    first, t1 = pool.queue.wait_for_worker("a", "a", WORKERS, said.append, sleep=_no_sleep)
    job_a = pool.register(first, "a")
    pool.queue.hand_over(first, t1)
    second, t2 = pool.queue.wait_for_worker("b", "b", WORKERS, said.append, sleep=_no_sleep)
    assert {first, second} == set(WORKERS)  # taken, not yet registered: still not offered to a third job

    ticket = pool.queue.take_ticket("c", "c")
    now = pool.queue.store.now()
    assert pool.queue.try_take(ticket, "c", WORKERS, now) is None  # both busy
    pool.register(second, "b")
    pool.queue.hand_over(second, t2)
    assert pool.queue.try_take(ticket, "c", WORKERS, pool.queue.store.now()) is None  # b's job runs
    pool.finish(first, job_a)  # the job's end frees its worker, whoever ended it
    assert pool.queue.try_take(ticket, "c", WORKERS, pool.queue.store.now()) == first


def test_a_later_ticket_never_takes_the_only_free_worker_before_an_earlier_live_one(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    busy, t0 = pool.queue.wait_for_worker("x", "x", WORKERS, print, sleep=_no_sleep)
    pool.register(busy, "x")
    pool.queue.hand_over(busy, t0)
    early = pool.queue.take_ticket("early", "early")
    late = pool.queue.take_ticket("late", "late")
    now = pool.queue.store.now()
    free = [w for w in WORKERS if w != busy]
    # One worker free, two waiting: the earlier ticket gets it, the later one waits.
    assert pool.queue.try_take(late, "late", WORKERS, now) is None
    assert pool.queue.try_take(early, "early", WORKERS, now) == free[0]


def test_a_waiter_that_stopped_renewing_no_longer_holds_the_line(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    gone = pool.queue.take_ticket("gone", "gone")  # its waiter died without giving up
    later = pool.queue.take_ticket("later", "later")
    now = pool.queue.store.now()
    assert [t for t, _ in pool.queue.waiting(now)] == [gone, later]
    # The dead waiter's last renewal is older than the staleness bound (the store's clock: the file's mtime).
    record = tmp_path / "pool" / "waiting" / f"{gone}.json"
    os.utime(record, (now - gp.WAITING_STALE_S - 5, now - gp.WAITING_STALE_S - 5))
    assert [t for t, _ in pool.queue.waiting(now)] == [later]
    # With one worker, the later ticket takes it.
    assert pool.queue.try_take(later, "later", WORKERS[:1], now) == WORKERS[0]


def test_a_taking_whose_job_never_registered_expires(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    worker, _ = pool.queue.wait_for_worker("dies", "dies", WORKERS[:1], print, sleep=_no_sleep)
    ticket = pool.queue.take_ticket("next", "next")
    now = pool.queue.store.now()
    assert pool.queue.try_take(ticket, "next", WORKERS[:1], now) is None
    assert pool.queue.try_take(ticket, "next", WORKERS[:1], now + gp.ASSIGNED_STALE_S + 1) == worker


def test_giving_up_frees_the_place_and_the_worker(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    worker, ticket = pool.queue.wait_for_worker("a", "a", WORKERS[:1], print, sleep=_no_sleep)
    pool.queue.give_up(ticket, worker)  # its provision failed before the job registered
    other, _ = pool.queue.wait_for_worker("b", "b", WORKERS[:1], print, sleep=_no_sleep)
    assert other == worker


def test_many_jobs_at_once_never_share_a_worker(tmp_path: Path) -> None:
    """Eight waiters in threads on two workers: each job holds its worker for a moment, then ends; at no
    time do two jobs hold one worker, and every job ran."""
    pool = Pool(tmp_path)
    holding: dict[str, str] = {}
    overlaps: list[str] = []
    ran: list[str] = []
    lock = threading.Lock()

    def job(key: str) -> None:
        worker, ticket = pool.queue.wait_for_worker(
            key, key, WORKERS, lambda _: None, sleep=lambda _: time.sleep(0.05)
        )
        with lock:
            if worker in holding:
                overlaps.append(f"{key} and {holding[worker]} on {worker}")
            holding[worker] = key
        job_id = pool.register(worker, key)
        pool.queue.hand_over(worker, ticket)
        time.sleep(0.1)
        with lock:
            del holding[worker]
            ran.append(key)
        pool.finish(worker, job_id)

    threads = [threading.Thread(target=job, args=(f"job-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not overlaps
    assert sorted(ran) == sorted(f"job-{i}" for i in range(8))


def test_a_job_waiting_when_the_pool_is_taken_down_fails_saying_so(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    worker, _ = pool.queue.wait_for_worker("a", "a", WORKERS[:1], print, sleep=_no_sleep)
    pool.register(worker, "a")

    def pool_down(_: float) -> None:  # `jobs pool down` while the second job waits
        gp.write_pool(pool.queue.store, None)

    with pytest.raises(ClusterError, match="the pool was taken down while this job waited for a worker"):
        pool.queue.wait_for_worker("b", "b", WORKERS[:1], print, sleep=pool_down)
    assert pool.queue.waiting(pool.queue.store.now()) == []  # its ticket is not left in line


def test_place_in_line_and_free_workers_rules() -> None:
    assert gp.place_in_line(5, [2, 5, 7]) == 1
    assert gp.free_workers(["a", "b", "c"], lambda w: w == "b", {"c": {}}) == ["a"]
    asked: list[str] = []
    assert gp.free_workers(["a", "b", "c"], lambda w: asked.append(w) is not None, {}, enough=1) == ["a"]
    assert asked == ["a"]  # a waiter first in line reads no worker past the first free one
    fresh = gp.fresh_assignments({"a": {"at": 1000.0}, "b": {"at": 0.0}}, 1000.0 + 1)
    assert list(fresh) == ["a"]


def test_the_pool_record_round_trips_and_forgets(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    record = gp.PoolRecord("p", "local", WORKERS, 2, {"setup": "echo hi"}, 1.0)
    gp.write_pool(store, record)
    assert gp.read_pool(store) == dataclasses.replace(record)
    gp.write_pool(store, None)
    assert gp.read_pool(store) is None


def test_a_pool_that_is_not_there_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path))
    with pytest.raises(
        ClusterError, match=r"no such pool on local; create it with `airflow-sky jobs pool apply -p nope"
    ):
        gp.open_pool("nope", "local")
