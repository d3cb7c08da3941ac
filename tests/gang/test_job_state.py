"""The job state's transitions, as a table, and compare-and-swap against the local infra's real store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_sky.gang import state as js
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.recovery import Action, Decision, RecoveryState, decide
from airflow_sky.gang.watch_lease import WatchHold
from airflow_sky.infra.local.state_store import LocalStateStore
from airflow_sky.task import JobRecovery

RESTART = Decision(Action.RESTART, "exit code 1, restarts left")
RECOVER = Decision(Action.RECOVER, "node of rank 1 lost")


def running(generation: int = 0, **changes) -> js.JobState:
    base = js.JobState(job_id=1, status=JobStatus.RUNNING, generation=generation, info={"num_nodes": 2})
    return js.dataclasses.replace(base, **changes)


# ---- the recovery decision table (what a fault leads to) ------------------------------------------------


@pytest.mark.parametrize(
    ("unhealthy", "code", "policy", "counts", "action"),
    [
        ([1], None, JobRecovery(), RecoveryState(), Action.RECOVER),  # a lost node: replace it
        ([1], 1, JobRecovery(), RecoveryState(), Action.RECOVER),  # a node lost while a rank failed
        ([1], None, JobRecovery(), RecoveryState(0, 3, 0), Action.FAIL),  # out of recoveries
        ([], None, JobRecovery(), RecoveryState(), Action.FAIL),  # a process vanished, every node up
        ([], 1, JobRecovery(), RecoveryState(), Action.FAIL),  # a user error, no restarts allowed
        ([], 1, JobRecovery(max_restarts_on_errors=2), RecoveryState(0, 0, 1), Action.RESTART),
        ([], 1, JobRecovery(max_restarts_on_errors=2), RecoveryState(0, 0, 2), Action.FAIL),
        ([], 42, JobRecovery(recover_on_exit_codes=(42,)), RecoveryState(0, 2, 0), Action.RESTART),
        ([], 42, JobRecovery(recover_on_exit_codes=(42,)), RecoveryState(0, 2, 1), Action.FAIL),
    ],
)
def test_recovery_decision_table(unhealthy, code, policy, counts, action):
    assert decide(unhealthy, code, policy, counts).action is action


# ---- transitions -------------------------------------------------------------------------------------


def test_the_first_failure_of_a_phase_is_its_cause_and_later_ones_change_nothing():
    failed = js.phase_failed(running(), "run", 0, 1, 3, "exit code 3", now=10.0)
    assert failed.status is JobStatus.FAILED and failed.info["ended_at"] == 10.0
    assert (failed.phase("run").failed_rank, failed.phase("run").failed_exit_code) == (1, 3)
    with pytest.raises(js.Unchanged):
        js.phase_failed(failed, "run", 0, 0, 137, "exit code 137", now=11.0)


def test_a_failed_setup_fails_the_job_as_failed_setup():
    state = js.dataclasses.replace(running(), status=JobStatus.SETTING_UP)
    assert js.phase_failed(state, "setup", 0, 0, 2, "exit code 2", 1.0).status is JobStatus.FAILED_SETUP


def test_a_phase_succeeds_only_when_every_rank_exited_zero_and_a_succeeded_run_is_a_succeeded_job():
    state = js.record_exits(running(), "run", 0, {0: 0})
    with pytest.raises(js.Unchanged):
        js.phase_succeeded(state, "run", 0, [0, 1], 1.0)
    state = js.record_exits(state, "run", 0, {1: 0})
    done = js.phase_succeeded(state, "run", 0, [0, 1], 1.0)
    assert done.phase("run").verdict == "SUCCEEDED" and done.status is JobStatus.SUCCEEDED


def test_a_recorded_exit_code_is_never_overwritten():
    state = js.record_exits(running(), "run", 0, {0: 1})
    with pytest.raises(js.Unchanged):
        js.record_exits(state, "run", 0, {0: 137})


def test_one_relaunch_claim_per_generation_whoever_saw_which_fault():
    claimed = js.claim_relaunch(running(), 0, RESTART, now=1.0)
    assert claimed.relaunch is not None and claimed.relaunch.target == 1 and claimed.relaunch.leader is None
    with pytest.raises(js.Unchanged):  # a follower that saw a lost node instead decides nothing now
        js.claim_relaunch(claimed, 0, RECOVER, now=1.5)
    with pytest.raises(js.Unchanged):  # a fault of an older generation
        js.claim_relaunch(running(generation=2), 1, RESTART, now=2.0)


def test_a_claim_has_one_leader_until_a_follower_saw_its_exact_lease_stand_still():
    claimed = js.claim_relaunch(running(), 0, RESTART, now=0.0)
    led = js.lead_relaunch(claimed, "a")
    assert led.relaunch.leader == "a" and led.relaunch.fence == 1 and led.fences == 1
    with pytest.raises(js.Unchanged):  # b has not watched a's lease stand still
        js.lead_relaunch(led, "b")
    resumed = js.lead_relaunch(led, "a")  # a retried leader resumes its own claim, with a newer token
    assert resumed.relaunch.leader == "a" and resumed.relaunch.fence == 2
    beat = js.fenced(led, 1)
    assert beat.relaunch.beat == led.relaunch.beat + 1
    with pytest.raises(js.Unchanged):  # b watched the lease as it was before a renewed it
        js.lead_relaunch(beat, "b", stale=led.relaunch.lease)
    taken = js.lead_relaunch(beat, "b", stale=beat.relaunch.lease)
    assert taken.relaunch.leader == "b" and taken.relaunch.fence == 2 and taken.fences == 2
    with pytest.raises(js.Unchanged):  # the old leader's next step is refused: a newer token exists
        js.fenced(taken, 1)
    with pytest.raises(js.Unchanged):
        js.relaunched(taken, 1, [], [], now=100.0)
    assert js.fenced(taken, 2).relaunch.beat == 1


def test_a_relaunch_moves_the_job_to_the_next_generation_and_counts_it():
    led = js.lead_relaunch(js.claim_relaunch(running(), 0, RESTART, now=0.0), "a")
    restarted = js.relaunched(led, led.relaunch.fence, [{"rank": 0}, {"rank": 1}], [], now=1.0)
    assert (restarted.generation, restarted.restarts, restarted.recoveries) == (1, 1, 0)
    assert restarted.relaunch is None and restarted.history[-1]["action"] == "RESTART"
    # A RESTART that had to replace a node anyway counts as a recovery, and the new node's setup is newer.
    led = js.lead_relaunch(js.claim_relaunch(restarted, 1, RESTART, now=2.0), "a")
    assert led.relaunch.fence == 2  # tokens only grow, over every relaunch of the job
    recovered = js.relaunched(led, 2, [{"rank": 0}, {"rank": 1}], [1], now=3.0)
    assert (recovered.generation, recovered.restarts, recovered.recoveries) == (2, 1, 1)
    assert recovered.setup_generation(1) == 2 and recovered.setup_generation(0) == 0


def test_a_cancelled_job_is_never_relaunched_and_fails_its_running_phases():
    claimed = js.claim_relaunch(running(), 0, RESTART, now=0.0)
    cancelled = js.cancel(claimed, "cancelled", now=1.0)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.relaunch is None and cancelled.cancelled
    assert cancelled.phase("run").failed_rank == js.CANCELLED_RANK
    for change in (
        lambda s: js.claim_relaunch(s, 0, RECOVER, now=2.0),
        lambda s: js.lead_relaunch(s, "a"),
        lambda s: js.cancel(s, "again", now=2.0),
    ):
        with pytest.raises(js.Unchanged):
            change(cancelled)


def test_a_finished_job_cannot_be_cancelled():
    done = js.dataclasses.replace(running(), status=JobStatus.SUCCEEDED)
    with pytest.raises(js.Unchanged):
        js.cancel(done, "too late", now=1.0)


def test_one_watcher_per_phase_whose_lease_lapses_to_another_follower():
    state = js.take_watch(running(), "run-0", "a")
    assert state.watcher("run-0") == "a" and state.watchers["run-0"] == ("a", 1)
    with pytest.raises(js.Unchanged):  # b has not watched a's lease stand still
        js.take_watch(state, "run-0", "b")
    renewed = js.take_watch(state, "run-0", "a")
    assert renewed.watchers["run-0"] == ("a", 2)
    with pytest.raises(js.Unchanged):  # b watched the lease as it was before a renewed it
        js.take_watch(renewed, "run-0", "b", stale=("a", 1))
    taken = js.take_watch(renewed, "run-0", "b", stale=("a", 2))
    assert taken.watcher("run-0") == "b"
    assert js.drop_watch(taken, "run-0", "b").watcher("run-0") is None


def test_a_watch_lease_lapses_on_the_observers_own_clock_only(tmp_path: Path):
    """WatchHold with mock clocks (a test of the rule: the two processes' clocks are a day apart)."""
    states = js.JobStates(LocalStateStore(tmp_path))
    state, _ = states.allocate("k", {"name": "x"})
    a_clock, b_clock = [86400.0], [0.0]
    a = WatchHold(states, state.job_id, "run-0", "a", lease_s=15.0, clock=lambda: a_clock[0])
    b = WatchHold(states, state.job_id, "run-0", "b", lease_s=15.0, clock=lambda: b_clock[0])
    assert a.hold(states.require(state.job_id))[1]
    for _ in range(10):  # a renews every 5 s of its clock; b looks every 5 s of its own: never lapsed
        a_clock[0] += 5.0
        b_clock[0] += 5.0
        assert a.hold(states.require(state.job_id))[1]
        assert not b.hold(states.require(state.job_id))[1]
    b_clock[0] += 10.0  # a stopped renewing (paused): after 15 s of b's clock, b takes over
    assert not b.hold(states.require(state.job_id))[1]
    b_clock[0] += 5.0
    assert b.hold(states.require(state.job_id))[1]
    a_clock[0] += 100.0
    assert not a.hold(states.require(state.job_id))[1]  # a, resumed, finds b holding it: it stops


def test_status_only_moves_forward():
    state = js.set_status(js.JobState(job_id=1, status=JobStatus.PENDING), JobStatus.SETTING_UP, 1.0)
    with pytest.raises(js.Unchanged):
        js.set_status(state, JobStatus.PENDING, 2.0)
    with pytest.raises(js.Unchanged):
        js.set_status(js.dataclasses.replace(state, status=JobStatus.FAILED), JobStatus.SUCCEEDED, 2.0)


def test_the_state_round_trips_through_json():
    led = js.lead_relaunch(js.claim_relaunch(running(), 0, RECOVER, now=0.0), "a")
    state = js.take_watch(js.record_exits(led, "run", 0, {1: 137}), "run-0", "a")
    assert js.JobState.from_dict(state.to_dict()) == state


# ---- the store -----------------------------------------------------------------------------------------


def test_compare_and_swap_lets_exactly_one_of_racing_writers_win(tmp_path: Path):
    store = LocalStateStore(tmp_path)
    assert store.put("jobs/1", {"n": 0}, None) is not None
    assert store.put("jobs/1", {"n": 9}, None) is None  # exists already
    first = store.get("jobs/1")
    assert first is not None
    wins: list[int] = []

    def writer(i: int) -> None:
        if store.put("jobs/1", {"n": i}, first.version) is not None:
            wins.append(i)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.get("jobs/1").data == {"n": wins[0]}


def test_concurrent_updates_all_land_and_two_followers_claim_one_relaunch(tmp_path: Path):
    states = js.JobStates(LocalStateStore(tmp_path))
    job, created = states.allocate("dag/run/provision", {"num_nodes": 8})
    assert created and job.job_id == 1
    states.update(1, lambda s: js.set_status(s, JobStatus.RUNNING, 0.0))

    def exit_code(rank: int) -> None:
        states.update(1, lambda s: js.record_exits(s, "run", 0, {rank: 0}))

    threads = [threading.Thread(target=exit_code, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert states.require(1).phase("run").exit_codes == dict.fromkeys(range(8), 0)

    # Two followers with different views of node health: one saw a restartable exit, one a lost node.
    results = [states.update(1, lambda s, d=d: js.claim_relaunch(s, 0, d, 1.0)) for d in (RESTART, RECOVER)]
    assert [won for _, won in results] == [True, False]
    assert states.require(1).relaunch.action is Action.RESTART


def test_a_retried_provision_gets_its_job_back_and_a_new_run_the_next_id(tmp_path: Path):
    states = js.JobStates(LocalStateStore(tmp_path))
    first, _ = states.allocate("dag/run-1/provision", {})
    again, created = states.allocate("dag/run-1/provision", {})
    other, _ = states.allocate("dag/run-2/provision", {})
    assert (first.job_id, again.job_id, created, other.job_id) == (1, 1, False, 2)
    assert [s.job_id for s in states.all()] == [1, 2]


def test_recovery_triage_counts_the_relaunches_the_job_state_recorded():
    from airflow_sky.gang.watcher import recovery_triage

    triage = recovery_triage(JobRecovery(max_restarts_on_errors=1))
    assert triage(running(), 0, 1, []).action is Action.RESTART
    assert triage(js.dataclasses.replace(running(), restarts=1), 0, 1, []).action is Action.FAIL
