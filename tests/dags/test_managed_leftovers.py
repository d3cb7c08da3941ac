"""`remove_leftovers`, the managed jobs DAG's last teardown: a follow task killed by `jobs cancel` writes its
rank's last progress record through the cluster's real state store after the teardown removed the cluster's
folder, bringing back `<cluster>/state/progress`; once nobody writes there any more, it is removed, and a
cluster that holds a node is never touched."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_sky.gang.job_progress import RankProgress
from airflow_sky.gang.progress_store import ProgressRecords
from airflow_sky.hooks.leftovers import remove_leftover_clusters
from airflow_sky.infra.local import layout
from airflow_sky.infra.local.state_store import LocalStateStore


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv(layout.ROOT_ENV, str(tmp_path / "local"))
    return tmp_path / "local"


def _late_progress_writes(cluster: str, count: int, every_s: float) -> threading.Thread:
    """A killed follow task's last flushes: progress records of rank 0 into the (removed) cluster's store."""
    records = ProgressRecords(LocalStateStore(layout.state_dir(cluster)))

    def write() -> None:
        for step in range(count):
            records.write(7, RankProgress(rank=0, generation=0, step=step, time=time.time()))
            time.sleep(every_s)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_a_torn_down_clusters_state_written_after_its_teardown_is_removed_once_the_writes_stop(root):
    writer = _late_progress_writes("cancelled", count=4, every_s=0.3)
    while not (root / "cancelled" / "state" / "progress" / "7").is_dir():  # what the issue saw left behind
        time.sleep(0.05)
    lines: list[str] = []
    removed = remove_leftover_clusters(["cancelled"], lines.append, quiet_s=1.0, wait_s=120)
    writer.join()
    assert removed == ["cancelled"] and not (root / "cancelled").exists()
    assert lines and "Removed what the stopped follow tasks left of cluster cancelled" in lines[0]


def test_a_cluster_with_a_node_or_no_folder_is_left_alone(root):
    (root / "kept" / "instances" / "local-kept-0").mkdir(parents=True)
    (root / "kept" / "state" / "progress" / "1").mkdir(parents=True)
    lines: list[str] = []
    assert remove_leftover_clusters(["kept", "gone"], lines.append, quiet_s=0.0, wait_s=5) == []
    assert (root / "kept" / "state" / "progress" / "1").is_dir() and lines == []


def test_a_folder_still_written_when_the_wait_ends_is_left_and_said_so(root):
    writer = _late_progress_writes("busy", count=8, every_s=0.2)
    while not (root / "busy").is_dir():
        time.sleep(0.05)
    lines: list[str] = []
    assert remove_leftover_clusters(["busy"], lines.append, quiet_s=60.0, wait_s=0.5) == []
    writer.join()
    assert (root / "busy").is_dir() and "still being written after" in lines[-1]
