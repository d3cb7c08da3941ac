"""The CLI sees every node's log live although a sequential runner follows one rank at a time."""

from __future__ import annotations

import threading
from pathlib import Path

from airflow_sky import events
from airflow_sky.gang import GangFollower
from airflow_sky.remote import NodeClient, start_job

SCRIPT = """\
echo "hello from $SKYPILOT_NODE_RANK"
echo "second line from $SKYPILOT_NODE_RANK"
if [ "$SKYPILOT_NODE_RANK" = 1 ]; then
  while [ ! -f "$RELEASE" ]; do sleep 0.1; done
  echo "released"
fi
"""


def _follower(rank: int, clients: dict[int, NodeClient], task_log: list[str]) -> GangFollower:
    def publish(node_rank: int, number: int, line: str) -> None:
        events.publish_line(
            ("c", 1, "run_follow", 0, node_rank), number, events.Event("log", "run", node_rank, line)
        )

    return GangFollower(
        "1-run",
        0,
        rank,
        clients,
        emit=task_log.append,
        publish=publish,
        tail_siblings=True,
        poll_interval_s=0.1,
    )


def test_follower_of_rank_1_streams_rank_0_live_and_the_next_follower_adds_only_new_lines(
    local_cluster, tmp_path: Path
):
    _, nodes, key = local_cluster(2)
    release = tmp_path / "release"
    clients = {n.rank: NodeClient(n, key) for n in nodes}
    seen: list[events.Event] = []
    rank0_started = threading.Event()

    def listener(event: events.Event) -> None:
        seen.append(event)
        if "hello from 0" in event.text:
            rank0_started.set()

    unsubscribe = events.subscribe(listener)
    try:
        for rank, client in clients.items():
            env = {"SKYPILOT_NODE_RANK": str(rank), "RELEASE": str(release)}
            assert start_job(client, "1-run", SCRIPT, env, 0).started
        # Rank 0 ends at once; rank 1 waits for the release, which only comes once rank 0's first line was
        # seen live through rank 1's follower (the one a sequential runner happened to start first).
        rank1_log: list[str] = []
        waiter = threading.Thread(target=lambda: (rank0_started.wait(30), release.touch()))
        waiter.start()
        assert _follower(1, clients, rank1_log).run().exit_code == 0
        rank0_log: list[str] = []
        assert _follower(0, clients, rank0_log).run().exit_code == 0
        waiter.join()
    finally:
        unsubscribe()
        for client in clients.values():
            client.close()

    texts = [e.text for e in seen]
    first = {key: next(i for i, t in enumerate(texts) if key in t) for key in ("hello from 0", "released")}
    assert first["hello from 0"] < first["released"], texts  # rank 0 was shown while rank 1 still ran
    for rank in (0, 1):
        assert sum(f"hello from {rank}" in t for t in texts) == 1, texts
        assert sum(f"second line from {rank}" in t for t in texts) == 1, texts
    assert sum("released" in t for t in texts) == 1, texts
    assert all(e.rank == 0 for e in seen if "from 0" in e.text)
    assert all(e.rank == 1 for e in seen if "from 1" in e.text or "released" in e.text)
    # Each task's own log holds only its own node's lines (the Airflow UI shows one node per task).
    assert all("rank=1" in line for line in rank1_log) and len(rank1_log) == 3
    assert all("rank=0," in line for line in rank0_log) and len(rank0_log) == 2
