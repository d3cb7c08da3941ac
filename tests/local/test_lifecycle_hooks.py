"""Lifecycle hooks on real local nodes: every running node runs the event's hooks in order, with the task's
envs (its secrets only for the job that declared them), a failing or overlong hook is a warning, and what
each printed is kept (secrets hidden) for `logs --hook`."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_sky import Task
from airflow_sky.client.cli.hook_logs import print_hook_runs
from airflow_sky.gang.lifecycle import hook_runs, run_hooks
from airflow_sky.gang.phases import register_job
from airflow_sky.infra.registry import open_cluster

SECRET = "s3cr3t-value-42"


def _task(probe: Path) -> Task:
    return Task.from_dict(
        {
            "num_nodes": 2,
            "run": "echo run",
            "envs": {"PROBE": str(probe), "GREETING": "hello"},
            "secrets": {"MY_SECRET": SECRET},
            "config": {
                "hooks": [
                    {
                        "run": 'echo "$GREETING $AIRFLOW_SKY_HOOK_EVENT ${MY_SECRET:-none} $SKYPILOT_NUM_NODES" '
                        '> "$PROBE/first-$SKYPILOT_NODE_RANK"; echo "saved on $SKYPILOT_NODE_RANK with $MY_SECRET"',
                        "events": ["stop", "down"],
                    },
                    {
                        "run": 'echo "second" > "$PROBE/second-$SKYPILOT_NODE_RANK"; exit 3',
                        "events": ["down"],
                    },
                    {"run": "echo slow; sleep 60", "events": ["down"], "timeout": 2},
                    {"run": 'touch "$PROBE/preempted-$SKYPILOT_NODE_RANK"', "events": ["preemption"]},
                ]
            },
        }
    )


def test_down_hooks_run_in_order_on_every_node_and_failures_and_timeouts_are_warnings(
    local_cluster, tmp_path: Path
) -> None:
    name, nodes, _ = local_cluster(2)
    cluster = open_cluster(name, "local")
    task = _task(tmp_path)
    handle = register_job(cluster, task, nodes, submit_key="hooks")
    lines: list[str] = []
    started = time.monotonic()
    results = run_hooks(cluster, "down", lines.append, task, handle.job_id)
    took = time.monotonic() - started
    assert [(r.hook, r.rank) for r in results] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert [r.exit_code for r in results[:4]] == [0, 0, 3, 3]
    assert all(r.timed_out and not r.ok for r in results[4:]), results[4:]
    assert took < 30, (
        f"an overlong hook held the event {took:.0f} s"
    )  # 2 s limit, 5 s grace, per node in parallel
    for rank in (0, 1):
        assert (tmp_path / f"first-{rank}").read_text() == f"hello down {SECRET} 2\n"  # the job's secret too
        assert (tmp_path / f"second-{rank}").read_text() == "second\n"
        # Declaration order: the second hook ran after the first had ended.
        assert (tmp_path / f"first-{rank}").stat().st_mtime <= (tmp_path / f"second-{rank}").stat().st_mtime
    assert not list(tmp_path.glob("preempted-*"))  # not this event's
    text = "\n".join(lines)
    assert "(hook 1 down, rank 0) saved on 0 with <redacted>" in text and SECRET not in text
    assert "WARNING: hook 2 (down) on rank 1 exited 3" in text
    assert "WARNING: hook 3 (down) on rank 0 ran out of its time" in text
    (kept,) = hook_runs(cluster)
    assert kept["event"] == "down" and kept["job_id"] == handle.job_id and SECRET not in str(kept)
    assert kept["results"][0]["output"] == "saved on 0 with <redacted>\n"


def test_without_the_declaring_task_hooks_get_its_envs_but_never_its_secrets(
    local_cluster, tmp_path: Path, capsys
) -> None:
    name, nodes, _ = local_cluster(2)
    cluster = open_cluster(name, "local")
    task = _task(tmp_path)
    handle = register_job(cluster, task, nodes, submit_key="hooks")
    # `airflow-sky stop` has no task; an exec that declared no hooks hands in its own task: neither's secrets.
    later = register_job(cluster, Task(run="x", secrets={"MY_SECRET": "other"}), nodes, submit_key="later")
    assert later.job_id > handle.job_id
    for caller_task, job_id in ((None, None), (Task(run="x", secrets={"MY_SECRET": "other"}), later.job_id)):
        results = run_hooks(cluster, "stop", lambda line: None, caller_task, job_id)
        assert [r.hook for r in results] == [1, 1] and all(r.ok for r in results)
        assert (tmp_path / "first-1").read_text() == "hello stop none 2\n"
    assert print_hook_runs(hook_runs(cluster), name) == 0
    out = capsys.readouterr().out
    assert out.count(f"== stop hooks of job {handle.job_id},") == 2
    assert "(hook 1, rank 1) exited 0 after" in out and "(hook 1, rank 1) saved on 1 with \n" in out


def test_a_cluster_without_hooks_runs_none_and_says_so(local_cluster, capsys) -> None:
    name, nodes, _ = local_cluster(1)
    cluster = open_cluster(name, "local")
    register_job(cluster, Task(run="x"), nodes, submit_key="plain")
    lines: list[str] = []
    assert run_hooks(cluster, "down", lines.append) == [] and lines == []
    assert print_hook_runs(hook_runs(cluster), name) == 1
    assert "has run no lifecycle hook" in capsys.readouterr().out
