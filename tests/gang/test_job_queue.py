"""The cluster's job queue: who waits for whom (pure rules as tables), and admission by compare-and-swap on
the real local state store (threads racing for the same nodes)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from airflow_sky.errors import JobFailed
from airflow_sky.gang import job_queue as jq
from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobStatus
from airflow_sky.infra.base import Node
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.task import Task

WHOLE_01 = jq.Demand((0, 1))


def claim(job_id: int, ranks: tuple[int, ...], gpus: float | None = None, admitted: bool = True) -> jq.Claim:
    return jq.Claim(job_id, jq.Demand(ranks, gpus), admitted)


@pytest.mark.parametrize(
    ("me", "others", "capacity", "expected"),
    [
        # a running job on the same nodes holds a whole-node job
        (claim(2, (0, 1), admitted=False), [claim(1, (0, 1))], {}, {1: (0, 1)}),
        # other nodes are free: a 1-node job beside a job on node 1
        (claim(2, (0,), admitted=False), [claim(1, (1,))], {}, {}),
        # FIFO: an earlier pending job on the same node holds a later one, even with the node idle
        (claim(3, (0,), admitted=False), [claim(2, (0, 1), admitted=False)], {}, {2: (0,)}),
        # a later pending job never holds an earlier one
        (claim(2, (0,), admitted=False), [claim(3, (0,), admitted=False)], {}, {}),
        # GPU fractions that fit together share the node
        (claim(2, (0,), 0.5, admitted=False), [claim(1, (0,), 0.5)], {0: 1.0}, {}),
        # ... and those that do not, wait
        (claim(2, (0,), 1.0, admitted=False), [claim(1, (0,), 0.5)], {0: 1.0}, {1: (0,)}),
        # a node without GPUs is never shared, whatever the jobs ask
        (claim(2, (0,), 0.5, admitted=False), [claim(1, (0,), 0.5)], {0: 0.0}, {1: (0,)}),
        # a whole-node job next to a GPU-fraction one waits
        (claim(2, (0,), None, admitted=False), [claim(1, (0,), 0.5)], {0: 4.0}, {1: (0,)}),
    ],
)
def test_conflicts_follow_nodes_gpu_fractions_and_submission_order(me, others, capacity, expected):
    assert jq.conflicts(me, others, capacity) == expected


def nodes(count: int, gpus: float = 0) -> list[Node]:
    return [Node(r, f"10.0.0.{r + 1}", "h", 22, "u", f"i-{r}", gpus=gpus) for r in range(count)]


def test_demand_is_the_run_nodes_or_every_node_with_setup_and_the_accelerator_count():
    task = Task(name="t", num_nodes=2, run="true", resources={"accelerators": {"L4": 0.5}})
    assert jq.demand_of(task, nodes(3), runs_setup=False) == jq.Demand((0, 1), 0.5)
    assert jq.demand_of(task, nodes(3), runs_setup=True) == jq.Demand((0, 1, 2), 0.5)
    assert jq.demand_of(Task(name="c", run="true"), nodes(3), runs_setup=False) == jq.Demand((0,), None)


def test_describe_wait_names_the_jobs_their_nodes_and_status():
    text = jq.describe_wait({1: (0, 1), 4: (3,)}, {1: "RUNNING", 4: "PENDING"})
    assert text == "waiting for job 1 to free nodes 0-1 (RUNNING); job 4 to free node 3 (PENDING)"


def test_live_claims_skip_ended_jobs_and_waiters_that_stopped_renewing():
    now = 10_000.0
    running = js.JobState(
        2, JobStatus.RUNNING, info={"num_nodes": 1}, nodes=tuple(n.to_dict() for n in nodes(2))
    )
    waiting = js.JobState(3, JobStatus.PENDING, info={jq.QUEUE_INFO_KEY: WHOLE_01.to_dict()})
    jobs = [
        (js.JobState(1, JobStatus.SUCCEEDED), now),
        (running, now - 5000),  # from before the queue: holds its run's nodes whole, however old its record
        (waiting, now - 5),
        (dataclasses.replace(waiting, job_id=4), now - jq.WAITING_STALE_S - 1),  # its waiter is gone
        (dataclasses.replace(waiting, job_id=5), now - jq.ADMITTED_STALE_S - 1),  # admitted, never started
        (dataclasses.replace(waiting, job_id=6), now - jq.WAITING_STALE_S - 1),  # admitted, starting
    ]
    admitted = {"5": WHOLE_01.to_dict(), "6": {"ranks": [1], "gpus": 0.5}}
    assert jq.live_claims(jobs, admitted, now) == [
        claim(2, (0,)),
        jq.Claim(3, WHOLE_01, admitted=False),
        claim(6, (1,), 0.5),
    ]


def registered(states: js.JobStates, key: str) -> int:
    """A job as a provision registers it (gang.phases.register_job): allocated, then PENDING."""
    state, _ = states.allocate(key, {"name": key})
    states.update(state.job_id, lambda s: dataclasses.replace(s, status=JobStatus.PENDING))
    return state.job_id


@pytest.mark.parametrize("attempt", range(10))
def test_two_jobs_racing_for_the_same_nodes_never_both_start(tmp_path: Path, attempt: int):
    states = js.JobStates(LocalStateStore(tmp_path))
    ids = [registered(states, f"run-{i}") for i in range(2)]
    results: dict[int, bool] = {}
    barrier = threading.Barrier(2)

    def queue_and_admit(job_id: int) -> None:
        barrier.wait()
        jq.enqueue(states, job_id, WHOLE_01)
        results[job_id] = jq.try_admit(states, job_id, {})[0]

    threads = [threading.Thread(target=queue_and_admit, args=(j,)) for j in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()) == [False, True], results
    first = next(j for j, admitted in results.items() if admitted)
    other = next(j for j in ids if j != first)
    admitted, blockers, _ = jq.try_admit(states, other, {})
    assert not admitted and blockers == {first: (0, 1)}
    states.update(first, lambda s: js.set_status(s, JobStatus.SUCCEEDED, 0.0))
    assert jq.try_admit(states, other, {})[0]
    index = states.index()
    assert index is not None and set(index.data[jq.ADMITTED_KEY]) == {str(other)}  # the ended one pruned


def test_a_waiter_tells_what_it_waits_for_and_a_cancel_while_pending_ends_it(tmp_path: Path):
    states = js.JobStates(LocalStateStore(tmp_path))
    first, second = registered(states, "a"), registered(states, "b")
    jq.enqueue(states, first, WHOLE_01)
    assert jq.try_admit(states, first, {})[0]
    said: list[str] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            jq.wait_for_turn(states, second, WHOLE_01, {}, said.append, poll_s=0.05)
        except BaseException as e:  # the test reads what ended the wait
            errors.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    while not said:
        waiter.join(0.05)
    state = states.require(second)
    assert jq.waiting_reason(state) == "waiting for job 1 to free nodes 0-1 (PENDING)"
    states.update(second, lambda s: js.cancel(s, "test", 0.0))
    waiter.join(60)
    assert not waiter.is_alive()
    assert said == ["job 2 is PENDING, waiting for job 1 to free nodes 0-1 (PENDING)"]
    assert isinstance(errors[0], JobFailed) and "never started" in str(errors[0])
    index = states.index()
    assert index is not None and str(second) not in index.data[jq.ADMITTED_KEY]
