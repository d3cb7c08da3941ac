"""Progress is collected where a rank's log is read anyway: the log reader hands each report on (only a line
with the marker is parsed), the run follower keeps its rank's record, a follower started over counts no step
twice, the watch holder hands the job's document to the metrics sink, and the detached driver collects
without any follow task. Real local node servers over SSH; the store is the local infra's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_sky import Task
from airflow_sky.gang import detached
from airflow_sky.gang.follow import Wake
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import JobStatus
from airflow_sky.gang.phases import register_job
from airflow_sky.gang.progress_store import ProgressRecords
from airflow_sky.infra.base import Node
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import log_tail
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import start_job
from airflow_sky.progress import Report

LocalCluster = Callable[[int], tuple[str, list[Node], str]]
REPORTS = """\
for i in 1 2 3; do
  echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"total\\":3,\\"metrics\\":{\\"loss\\":$((i * 10 + SKYPILOT_NODE_RANK))}}"
  echo "plain line $i"
  sleep 0.3
done
"""


def _steps(records: ProgressRecords, job_id: int, rank: int) -> list[int]:
    progress = records.read(job_id, rank)
    assert progress is not None, f"rank {rank} has no progress record"
    return [p.step for p in progress.history]


def test_a_report_split_across_two_reads_is_parsed_once_shown_only_raw_and_plain_lines_are_never_parsed(
    local_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real_parse = log_tail.parse_line

    def counting_parse(line: str | bytes) -> Report | None:  # a spy on the real parser
        parsed.append(str(line))
        return real_parse(line)

    monkeypatch.setattr(log_tail, "parse_line", counting_parse)
    _, (node,), key = local_cluster(1)
    release = tmp_path / "release"
    script = (
        'echo "plain before"; printf \'@@airflow-sky-progress/1 {"step":7,"met\'; '
        f"while [ ! -f {release} ]; do sleep 0.05; done; "
        'printf \'rics":{"loss":0.5}}\\nplain after\\n\''
    )
    client = NodeClient(node, key)
    try:
        assert start_job(client, "9-run", script, {}, 0).started
        reports: list[Report] = []
        lines: list[str] = []
        tail = log_tail.LogTail(
            client, "9-run", 0, False, lines.append, wait_for_start=True, on_report=reports.append
        )
        while tail.line_offset == tail.offset:  # until the half report is read (and held back)
            tail.poll()
        assert [line.rsplit(" ", 2)[-2:] for line in lines] == [["plain", "before"]] and not reports
        release.touch()
        while not tail.ended:
            tail.poll()
        raw_lines: list[str] = []  # `logs --raw`: the log as written, the report line included
        raw = log_tail.LogTail(client, "9-run", 0, False, raw_lines.append, raw=True)
        while not raw.ended:
            raw.poll()
    finally:
        client.close()
    assert reports == [Report(step=7, metrics={"loss": 0.5})]
    assert len(parsed) == 2 and "plain" not in parsed[0] and parsed[0] == parsed[1]
    # The report line reaches on_report only, never the lines shown (a task log, the CLI).
    assert [line.split(") ", 1)[1] for line in lines] == ["plain before", "plain after"]
    assert [line.split(") ", 1)[1] for line in raw_lines] == [
        "plain before",
        '@@airflow-sky-progress/1 {"step":7,"metrics":{"loss":0.5}}',
        "plain after",
    ]


def test_run_followers_keep_each_ranks_steps_and_a_follower_started_over_counts_none_twice(
    local_cluster: LocalCluster,
) -> None:
    name, nodes, key = local_cluster(2)
    cluster = open_cluster(name, "local")
    handle = register_job(cluster, Task(run=REPORTS, num_nodes=2), nodes, submit_key="test")
    job = GangJob.of(cluster, handle)
    clients = [NodeClient(n, key) for n in nodes]
    sunk: list[dict[str, Any]] = []
    try:
        for client in clients:
            env = {"SKYPILOT_NODE_RANK": str(client.node.rank)}
            assert start_job(client, f"{handle.job_id}-run", REPORTS, env, 0).started
        for rank in (1, 0):
            follower = job.follower(
                "run", 0, rank, nodes, f"task-{rank}", emit=lambda line: None, on_progress=sunk.append
            )
            try:
                assert follower.run(0.1).wake is Wake.DONE
            finally:
                follower.close()
        records = ProgressRecords(job.states.store)
        assert _steps(records, handle.job_id, 0) == [1, 2, 3]
        assert _steps(records, handle.job_id, 1) == [1, 2, 3]
        # A retried follow task reads rank 1's log again from 0: the record keeps one point per step.
        again = job.follower("run", 0, 1, nodes, "task-1", emit=lambda line: None)
        try:
            assert again.run(0.1).wake is Wake.DONE
        finally:
            again.close()
        assert _steps(records, handle.job_id, 1) == [1, 2, 3]
        doc = job.progress(with_history=False)
        assert doc is not None and doc["step"] == 3 and doc["total"] == 3 and doc["percent"] == 100.0
        assert {r["rank"]: r["metrics"] for r in doc["ranks"]} == {0: {"loss": 30.0}, 1: {"loss": 31.0}}
    finally:
        for client in clients:
            client.close()
    # The watch holder handed the job's document (no histories) to the metrics sink.
    assert sunk and all(
        d["job_id"] == handle.job_id and "history" not in d["ranks"][0] for d in sunk if d["ranks"]
    )


def test_the_detached_driver_collects_every_ranks_progress(local_cluster: LocalCluster) -> None:
    name, nodes, _ = local_cluster(2)
    cluster = open_cluster(name, "local")
    task = Task(run=REPORTS, num_nodes=2)
    handle = register_job(cluster, task, nodes, submit_key="test")
    assert detached.drive(cluster, task, handle, ["run"], poll_interval_s=0.2) is JobStatus.SUCCEEDED
    records = ProgressRecords(GangJob.of(cluster, handle).states.store)
    for rank in (0, 1):
        assert _steps(records, handle.job_id, rank) == [1, 2, 3]
        progress = records.read(handle.job_id, rank)
        assert progress is not None and progress.metrics == {"loss": 30.0 + rank}
