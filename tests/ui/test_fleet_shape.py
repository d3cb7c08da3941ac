"""The Sky page's answer for one user (ui.fleet.shape, pure): who may act on what, totals, bounded job list."""

from __future__ import annotations

from typing import Any

from airflow_sky.ui import fleet


def _row(name: str, owner: dict[str, Any] | None, jobs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "cluster": name,
        "infra": "local",
        "status": "UP",
        "nodes": 2,
        "billing": None,
        "owner": owner,
        "launched_at": 1000.0,
        "ended_at": None,
        "idle_since": 1500.0,
        "autostop": None,
        "cost_per_hour": 0.5,
        "cost": 1.25,
        "events": [[1000.0, "provisioned", None, "2 node(s)"]],
        "events_dropped": 0,
        "jobs": jobs,
        **extra,
    }


def _job(job_id: int, dag_id: str | None, status: str, submitted: str = "2026-12-01") -> dict[str, Any]:
    return {"job_id": job_id, "dag_id": dag_id, "run_id": "r1", "status": status, "submitted_at": submitted}


def test_actions_follow_edit_access_to_the_owning_dag_and_a_cli_cluster_needs_every_dag() -> None:
    rows = [
        _row(
            "mine",
            {"dag_id": "train", "run_id": "r1", "user": "a", "via": "airflow"},
            [_job(1, "train", "RUNNING")],
        ),
        _row(
            "theirs",
            {"dag_id": "other", "run_id": "r2", "user": "b", "via": "airflow"},
            [_job(1, "other", "RUNNING")],
        ),
        _row("laptop", {"dag_id": "sky-launch", "run_id": "x", "user": "c", "via": "cli"}, []),
    ]
    asked: list[str | None] = []

    def may_edit(dag_id: str | None) -> bool:
        asked.append(dag_id)
        return dag_id == "train"

    answer = fleet.shape(rows, [("ssh/p", "state host down")], 2000.0, may_edit, "2026-12-01")
    by_name = {c["cluster"]: c for c in answer["clusters"]}
    assert by_name["mine"]["editable"] and not by_name["theirs"]["editable"]
    assert not by_name["laptop"]["editable"] and by_name["laptop"]["owner_url"] is None
    assert by_name["mine"]["owner_url"].endswith("/dags/train/runs/r1")
    assert by_name["mine"]["idle_s"] == 500.0 and by_name["mine"]["age_s"] == 1000.0
    assert {(j["cluster"], j["editable"]) for j in answer["jobs"]} == {("mine", True), ("theirs", False)}
    assert sorted(asked, key=str) == sorted(["train", "other", None], key=str)  # each DAG asked once
    assert answer["totals"] == {
        "clusters": 3,
        "nodes": 6,
        "cost_per_hour": 1.5,
        "cost": 3.75,
        "jobs_running": 2,
        "jobs": 2,
    }
    assert answer["notes"] == [{"infra": "ssh/p", "why": "state host down"}]


def test_a_torn_down_cluster_is_never_editable_and_ended_jobs_are_bounded() -> None:
    ended = [_job(i, "train", "SUCCEEDED", f"2026-12-01T{i // 60:02d}:{i % 60:02d}") for i in range(150)]
    rows = [
        _row("gone", {"dag_id": "train", "via": "airflow"}, [], ended_at=1800.0, status="TERMINATED"),
        _row(
            "busy",
            {"dag_id": "train", "via": "airflow"},
            [*ended, _job(999, "train", "RUNNING", "2026-11-01")],
        ),
    ]
    answer = fleet.shape(rows, [], 2000.0, lambda dag_id: True, None)
    by_name = {c["cluster"]: c for c in answer["clusters"]}
    assert not by_name["gone"]["editable"] and by_name["gone"]["age_s"] is None
    assert answer["clusters"][-1]["cluster"] == "gone"  # torn-down clusters after the live ones
    jobs = answer["jobs"]
    assert jobs[0]["job_id"] == 999  # every live job first, however old
    assert len(jobs) == 1 + fleet.ENDED_JOBS_SHOWN and answer["jobs_hidden"] == 50
    assert jobs[1]["job_id"] == 149  # then the newest ended ones


def test_what_the_dags_a_user_may_not_read_own_is_left_out_but_cli_clusters_are_everyones() -> None:
    rows = [
        _row(
            "mine",
            {"dag_id": "train", "via": "airflow"},
            [_job(1, "train", "RUNNING"), _job(2, "secret", "RUNNING")],
        ),
        _row("hidden", {"dag_id": "secret", "via": "airflow"}, [_job(1, "secret", "RUNNING")]),
        _row("laptop", {"dag_id": "sky-launch-1", "via": "cli"}, [_job(1, "sky-launch-1", "RUNNING")]),
    ]
    answer = fleet.shape(rows, [], 2000.0, lambda dag_id: False, None, readable={"train"}.__contains__)
    assert [c["cluster"] for c in answer["clusters"]] == ["laptop", "mine"]
    assert sorted((j["cluster"], j["dag_id"]) for j in answer["jobs"]) == [
        ("laptop", "sky-launch-1"),
        ("mine", "train"),
    ]
