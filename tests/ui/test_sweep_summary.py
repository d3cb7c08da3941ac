"""The progress view's sweep summary (ui.sweeps.summarize): trial states from their tasks, the compared
metric, the best so far by mode, the total progress, and CANCELLED once the sweep was cancelled."""

from __future__ import annotations

from typing import Any

from airflow_sky.ui.sweeps import summarize, trial_state

MANIFEST = {
    "sweep": "s",
    "metric": "loss",
    "mode": "min",
    "pool": "p",
    "trials": [
        {"trial": i, "params": {"LR": lr}, "group": f"s.trial_{i}"} for i, lr in enumerate(("1", "2", "3"))
    ],
}


def _job(group: str, step: int, total: int, loss: float, history: list[list[Any]]) -> dict[str, Any]:
    return {
        "group": group,
        "cluster": "p-0",
        "job_id": 4,
        "progress": {
            "step": step,
            "total": total,
            "eta_s": 12.0,
            "metrics": {"loss": loss},
            "ranks": [{"rank": 0, "history": history}, {"rank": 1, "history": [[0, 5, 0, {"loss": 99.0}]]}],
        },
    }


def test_trial_states_come_from_the_trial_groups_tasks() -> None:
    assert trial_state({}, "s.trial_0") == "PENDING"
    assert trial_state({"s.trial_0.provision": "running"}, "s.trial_0") == "PENDING"  # waiting for a worker
    assert (
        trial_state({"s.trial_0.provision": "success", "s.trial_0.launch": "success"}, "s.trial_0")
        == "RUNNING"
    )
    assert (
        trial_state({"s.trial_0.provision": "success", "s.trial_0.collect": "success"}, "s.trial_0")
        == "SUCCEEDED"
    )
    assert (
        trial_state({"s.trial_0.provision": "success", "s.trial_0.collect": "upstream_failed"}, "s.trial_0")
        == "FAILED"
    )
    assert trial_state({"s.trial_0.provision": "skipped"}, "s.trial_0") == "CANCELLED"
    assert trial_state({"s.trial_10.collect": "success"}, "s.trial_1") == "PENDING"  # another trial's tasks


def test_the_best_trial_is_the_lowest_metric_and_the_total_counts_every_trials_steps() -> None:
    jobs = [
        _job("s.trial_0", 10, 40, 2.5, [[0, 5, 0, {"loss": 3.0}], [0, 10, 0, {"loss": 2.5}]]),
        _job("s.trial_1", 30, 40, 1.5, [[0, 30, 0, {"loss": 1.5}]]),
    ]
    states = {
        "s.trial_0.provision": "success",
        "s.trial_1.provision": "success",
        "s.trial_1.launch": "success",
    }
    summary = summarize(MANIFEST, jobs, states)
    assert [t["state"] for t in summary["trials"]] == ["RUNNING", "RUNNING", "PENDING"]
    assert [t["value"] for t in summary["trials"]] == [2.5, 1.5, None]
    assert summary["best"] == 1 and summary["finished"] == 0
    assert summary["percent"] == 50.0  # 40 of 80 steps of the trials that report a total
    assert summary["trials"][0]["history"] == [[5.0, 3.0], [10.0, 2.5]]  # the head rank's line only
    assert summarize({**MANIFEST, "mode": "max"}, jobs, states)["best"] == 0


def test_a_metric_only_in_the_result_counts_and_no_metric_means_no_best() -> None:
    states = {"s.trial_2.collect": "success"}
    summary = summarize(MANIFEST, [], states, results={"s.trial_2": {"loss": 0.5}})
    assert summary["best"] == 2 and summary["finished"] == 1
    assert summarize({**MANIFEST, "metric": None}, [], states)["best"] is None


def test_once_cancelled_the_trials_that_ended_without_success_show_cancelled() -> None:
    states = {
        "s.trial_0.provision": "success",
        "s.trial_0.collect": "success",
        "s.trial_1.provision": "success",
        "s.trial_1.collect": "upstream_failed",
        "s.trial_2.provision": "skipped",
    }
    summary = summarize(MANIFEST, [], states, cancelled="cancelled by admin")
    assert [t["state"] for t in summary["trials"]] == ["SUCCEEDED", "CANCELLED", "CANCELLED"]
    assert summary["finished"] == 3 and summary["cancelled"] == "cancelled by admin"
    running = {**states, "s.trial_1.collect": None, "s.trial_1.launch": "running"}
    assert summarize(MANIFEST, [], running, cancelled="x")["trials"][1]["state"] == "RUNNING"  # not over yet
