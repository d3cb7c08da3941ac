"""The CLI sees every node's log live although a sequential runner follows one rank at a time."""

from __future__ import annotations

import threading
from pathlib import Path

from airflow_sky import Task
from airflow_sky.client.events import Event
from airflow_sky.client.live import NodeLogs
from airflow_sky.gang.follow import RankFollower, Wake
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.phases import register_job
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node.client import CONNECTIONS, NodeClient
from airflow_sky.node.jobs import start_job

SCRIPT = """\
echo "hello from $SKYPILOT_NODE_RANK"
echo "second line from $SKYPILOT_NODE_RANK"
if [ "$SKYPILOT_NODE_RANK" = 1 ]; then
  while [ ! -f "$RELEASE" ]; do sleep 0.1; done
  echo "released"
fi
"""


def _follower(cluster: Cluster, nodes, rank: int, task_log: list[str]) -> RankFollower:
    return GangJob(cluster, 1).follower("run", 0, rank, nodes, f"task-{rank}", emit=task_log.append)


def test_engine_view_streams_rank_0_live_while_rank_1_is_followed_and_shows_each_line_once(
    local_cluster, tmp_path: Path
):
    name, nodes, key = local_cluster(2)
    release = tmp_path / "release"
    clients = {n.rank: NodeClient(n, key) for n in nodes}
    cluster = open_cluster(name, "local")
    handle = register_job(cluster, Task(run=SCRIPT, num_nodes=2), nodes, submit_key="test")
    seen: list[Event] = []
    rank0_started = threading.Event()

    def listener(event: Event) -> None:
        seen.append(event)
        if "hello from 0" in event.text:
            rank0_started.set()

    view = NodeLogs(cluster, handle, listener, redact=lambda line: line, phases=("run",))
    view.start()
    view.activate("run")
    try:
        for rank, client in clients.items():
            env = {"SKYPILOT_NODE_RANK": str(rank), "RELEASE": str(release)}
            assert start_job(client, f"{handle.job_id}-run", SCRIPT, env, 0).started
        # Rank 0 ends at once; rank 1 waits for the release, which only comes once rank 0's first line was
        # seen live by the engine's view while rank 1's follower (the one a sequential runner happened to
        # start first) was still running.
        rank1_log: list[str] = []
        waiter = threading.Thread(target=lambda: (rank0_started.wait(30), release.touch()))
        waiter.start()
        assert _follower(cluster, nodes, 1, rank1_log).run(0.1).wake is Wake.DONE
        rank0_log: list[str] = []
        assert _follower(cluster, nodes, 0, rank0_log).run(0.1).wake is Wake.DONE
        waiter.join()
    finally:
        view.stop()
        for client in clients.values():
            client.close()
    # Once stopped (the engine stops it when the teardown starts), the view holds no session on a node and
    # opens none: an ssh pool host is handed back only once its user has no session left.
    assert not view._clients  # closed by stop()
    held = {key: connection.users for key, connection in CONNECTIONS.items()}
    view.drain(reconnect=True)
    assert {key: connection.users for key, connection in CONNECTIONS.items()} == held
    assert not view._clients

    texts = [e.text for e in seen]
    first = {key: next(i for i, t in enumerate(texts) if key in t) for key in ("hello from 0", "released")}
    assert first["hello from 0"] < first["released"], texts  # rank 0 was shown while rank 1 still ran
    for rank in (0, 1):
        assert sum(f"hello from {rank}" in t for t in texts) == 1, texts
        assert sum(f"second line from {rank}" in t for t in texts) == 1, texts
    assert sum("released" in t for t in texts) == 1, texts
    assert all(e.rank == 0 for e in seen if "from 0" in e.text)
    assert all(e.rank == 1 for e in seen if "from 1" in e.text or "released" in e.text)
    assert all(e.kind == "log" and e.step == "run_follow" for e in seen)
    # Each task's own log holds only its own node's lines (the Airflow UI shows one node per task).
    assert all("rank=1" in line for line in rank1_log) and len(rank1_log) == 3
    assert all("rank=0," in line for line in rank0_log) and len(rank0_log) == 2
