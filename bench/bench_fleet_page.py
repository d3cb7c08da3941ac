"""The Sky page with 200 clusters and 2,000 jobs in the stores: its answer and its drawing, each under 1 s.

    baseline  reading the same records raw: every ledger record and every job record of every cluster,
              json-parsed, nothing else (the least any page of them must do)
    ours      the page's API answer (gang.fleet.FleetReader: ledger, membership, job records and the running
              jobs' progress records; ui.fleet.shape for one user; the JSON) and, in headless Chromium, the
              page drawing that answer (fleet.js, its request answered with it)

The records live in real local state stores (the local infra's files). The nodes are not started (200
clusters of node processes is not what is measured): the membership read answers from the records, through
a cloud that is the local one but for `nodes` and `clusters`. 10% of the jobs run, with 2 ranks' progress.
Run: `.venv/bin/python bench/bench_fleet_page.py [--clusters 200 --jobs-per-cluster 10]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import header, private_homes, restored_env

ROUNDS = 5


def _populate(clusters: int, jobs_per_cluster: int) -> tuple[Any, list[str]]:
    from airflow_sky.gang import state as js
    from airflow_sky.gang.job import JobStatus
    from airflow_sky.gang.job_progress import RankProgress
    from airflow_sky.gang.progress_store import ProgressRecords
    from airflow_sky.infra import ledger
    from airflow_sky.infra.base import Node, NodeStatus
    from airflow_sky.infra.local.cloud import LocalCloud

    names = [f"bench-{i:03d}" for i in range(clusters)]

    class RecordedNodes(LocalCloud):
        """The local infra, whose membership answers from a list instead of node processes."""

        def nodes(self, cluster_name: str) -> list[Node]:
            index = int(cluster_name.rsplit("-", 1)[1])
            return [
                Node(
                    r,
                    f"127.1.{index % 250}.{r + 2}",
                    "127.0.0.1",
                    22,
                    "sky",
                    f"i-{index}-{r}",
                    NodeStatus.RUNNING,
                )
                for r in range(2)
            ]

        def clusters(self) -> Sequence[str]:
            return names

    cloud = RecordedNodes()
    fleet = ledger.Ledger(cloud.state_store(ledger.STORE))
    now = time.time()
    billing = ledger.catalog_billing("aws", "m6i.large", True, "us-east-1", None)
    for i, name in enumerate(names):
        owner = {"dag_id": f"dag_{i % 20}", "run_id": f"manual__{i}", "user": "alice", "via": "airflow"}
        fleet.provisioned(name, "local", {0: f"i-{i}-0", 1: f"i-{i}-1"}, owner, billing, "2 node(s)")
        fleet.event(name, "preempted", "rank 1 (i-x): PREEMPTED, without a notice", 1)
        store = cloud.state_store(name)
        progress = ProgressRecords(store)
        for j in range(1, jobs_per_cluster + 1):
            running = j == jobs_per_cluster  # one running job per cluster: 10% of them with 10 per cluster
            info = {
                "name": f"train-{j}",
                "submitted_at": "2026-12-01T10:00:00+00:00",
                "submit_key": f"dag_{i % 20}/manual__{i}/train.provision",
                "num_nodes": 2,
                "cluster_name": name,
                "infra": "local",
                **({} if running else {"ended_at": now - 60}),
            }
            status = JobStatus.RUNNING if running else JobStatus.SUCCEEDED
            state = js.JobState(job_id=j, status=status, info=info, recoveries=j % 2)
            store.put(js.JobStates.key(j), state.to_dict(), None)
            if running:
                for rank in range(2):
                    progress.write(j, RankProgress(rank, 0, 500 + rank, now - 5, 1000, {"loss": 1.5}))
    return cloud, names


def _baseline(cloud: Any, names: list[str]) -> float:
    """Every ledger and job record, read and parsed: nothing shaped."""
    from airflow_sky.infra import ledger

    started = time.perf_counter()
    store = cloud.state_store(ledger.STORE)
    records = [store.get(k) for k in store.keys(ledger.LIVE_PREFIX)]
    jobs = []
    for name in names:
        jstore = cloud.state_store(name)
        jobs += [jstore.get(k) for k in jstore.keys("jobs")]
    assert len(records) == len(names) and all(jobs)
    return time.perf_counter() - started


def _answer(cloud: Any) -> tuple[float, dict[str, Any]]:
    from airflow_sky.gang.fleet import FleetReader
    from airflow_sky.ui.fleet import shape

    started = time.perf_counter()
    rows = FleetReader(cloud, "local").read(ended_since=time.time() - 86400)
    answer = shape(rows, [], time.time(), lambda dag_id: dag_id is not None, "2026-12-01")
    body = json.dumps(answer)
    elapsed = time.perf_counter() - started
    return elapsed, json.loads(body)


def _draw(answer: dict[str, Any]) -> list[float]:
    """fleet.html drawing `answer` in headless Chromium: from navigation to every row drawn."""
    from importlib import resources

    from tests.ui.progress_page import chromium

    static = resources.files("airflow_sky.ui") / "static"
    base = "http://sky.test/airflow-sky"
    body = json.dumps(answer)
    times = []
    with chromium() as browser:
        page = browser.new_page()

        def serve(route: Any) -> None:
            url = route.request.url
            if url.endswith("/api/v1/fleet"):
                route.fulfill(status=200, content_type="application/json", body=body)
            elif "/static/" in url:
                name = url.rsplit("/", 1)[1]
                kind = "text/css" if name.endswith(".css") else "application/javascript"
                route.fulfill(status=200, content_type=kind, body=(static / name).read_text())
            else:
                route.fulfill(status=200, content_type="text/html", body=(static / "fleet.html").read_text())

        page.route("**/*", serve)
        expected = len(answer["clusters"])
        for _ in range(ROUNDS):
            started = time.perf_counter()
            page.goto(f"{base}/fleet")
            page.wait_for_function(
                f"document.querySelectorAll('tr.sky-cluster').length === {expected}", timeout=30_000
            )
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--jobs-per-cluster", type=int, default=10)
    args = parser.parse_args()
    header()
    saved = dict(__import__("os").environ)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, restored_env(saved):
        private_homes(Path(tmp))
        started = time.perf_counter()
        cloud, names = _populate(args.clusters, args.jobs_per_cluster)
        print(
            f"stores: {args.clusters} clusters, {args.clusters * args.jobs_per_cluster} jobs, written in "
            f"{time.perf_counter() - started:.1f}s"
        )
        baseline = statistics.median(_baseline(cloud, names) for _ in range(ROUNDS))
        answers = [_answer(cloud) for _ in range(ROUNDS)]
        answer_s = statistics.median(a[0] for a in answers)
        answer = answers[-1][1]
        assert len(answer["clusters"]) == args.clusters
        assert answer["totals"]["jobs"] == args.clusters * args.jobs_per_cluster
        draw_s = statistics.median(_draw(answer))
        print(f"baseline (raw records read):  {baseline * 1000:7.1f} ms")
        print(f"page answer (API):            {answer_s * 1000:7.1f} ms   ratio {answer_s / baseline:.2f}")
        print(f"page drawn (Chromium):        {draw_s * 1000:7.1f} ms")
        total = answer_s + draw_s
        verdict = "OK" if total < 1.0 else "OVER"
        print(f"answer + drawing:             {total * 1000:7.1f} ms   target < 1000 ms: {verdict}")


if __name__ == "__main__":
    main()
