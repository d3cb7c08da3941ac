"""The provision log (infra/provision_log.py) on the local infra's real state store: what a provisioning
records, bounded; the whole log or one worker's lines; following a provisioning that is still running."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.infra import provision_log
from airflow_sky.infra.base import Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.local.state_store import LocalStateStore

DRIVER = logging.getLogger("airflow_sky.infra.fake_driver")  # a driver's logger: under airflow_sky.infra


@pytest.fixture
def store(tmp_path: Path) -> LocalStateStore:
    return LocalStateStore(tmp_path / "state")


@pytest.fixture(autouse=True)
def infra_logs_at_info() -> Iterator[None]:
    # Airflow's task logging sets INFO; a bare pytest process leaves the WARNING default.
    previous = DRIVER.level
    DRIVER.setLevel(logging.INFO)
    yield
    DRIVER.setLevel(previous)


def _node(rank: int) -> Node:
    return Node(
        rank=rank,
        instance_id=f"i-{rank}",
        internal_ip=f"10.0.0.{rank + 1}",
        ssh_host="127.0.0.1",
        ssh_port=2200 + rank,
        ssh_user="sky",
        status=NodeStatus.RUNNING,
    )


def _shown(store: LocalStateStore, **kwargs: object) -> list[str]:
    lines: list[str] = []
    provision_log.show(store, lines.append, follow=False, **kwargs)  # type: ignore[arg-type]
    return lines


def _provision(request: ProvisionRequest) -> list[Node]:
    DRIVER.info("fake: %s: launching %d x m5.large", request.cluster_name, request.num_nodes)
    DRIVER.warning("fake: no capacity in us-east-1a; trying the next zone")
    return [_node(rank) for rank in range(request.num_nodes)]


def test_a_provisioning_records_the_infras_lines_then_one_line_per_node(store: LocalStateStore) -> None:
    nodes = provision_log.provisioned(store, ProvisionRequest("train", 3), [], _provision)
    assert [n.rank for n in nodes] == [0, 1, 2]
    text = [line.split(" ", 2)[2] for line in _shown(store)]  # without the date and time
    assert text[0] == "Provisioning cluster train: 3 node(s) (0 existing, 0 of them running)"
    assert text[1] == "fake: train: launching 3 x m5.large"
    assert text[2] == "WARNING fake: no capacity in us-east-1a; trying the next zone"
    assert text[3:6] == [
        "rank 0 (head): 10.0.0.1, instance i-0, RUNNING",
        "rank 1 (worker1): 10.0.0.2, instance i-1, RUNNING",
        "rank 2 (worker2): 10.0.0.3, instance i-2, RUNNING",
    ]
    assert text[6].startswith("provisioned in ") and len(text) == 7
    assert [line.split(" ", 2)[2] for line in _shown(store, worker=2)] == [
        "rank 2 (worker2): 10.0.0.3, instance i-2, RUNNING"
    ]
    assert [line.split(" ", 2)[2] for line in _shown(store, tail=2)] == [text[5], text[6]]
    DRIVER.info("after the provisioning")  # the capture ended with it
    assert len(_shown(store)) == 7


def test_a_failed_provisioning_ends_its_log_with_the_error_and_raises_it(store: LocalStateStore) -> None:
    def fails(request: ProvisionRequest) -> list[Node]:
        DRIVER.info("fake: launching")
        raise RuntimeError("InsufficientInstanceCapacity in every zone")

    with pytest.raises(RuntimeError, match="InsufficientInstanceCapacity"):
        provision_log.provisioned(store, ProvisionRequest("train", 2), [], fails)
    record = provision_log.read(store)
    assert record is not None and record["ended"] is True and record["ok"] is False
    assert "provisioning failed after" in _shown(store)[-1]
    assert "InsufficientInstanceCapacity in every zone" in _shown(store)[-1]


def test_a_newer_provisioning_replaces_the_log_and_the_older_writer_stops(store: LocalStateStore) -> None:
    with provision_log.recording(store, "first") as first:
        with provision_log.recording(store, "second"):
            pass
        first.add("late line of the first")
    assert _shown(store)[0].split(" ", 2)[2] == "second"
    assert not any("first" in line for line in _shown(store))


def test_the_log_keeps_its_newest_lines_within_its_bound_and_says_what_it_dropped(
    store: LocalStateStore,
) -> None:
    with provision_log.recording(store, "many") as record:
        for i in range(3000):
            record.add(f"line {i:05d} " + "x" * 40)
    stored = (store.directory / f"{provision_log.KEY}.json").stat().st_size
    assert stored < 2 * provision_log.MAX_BYTES  # JSON framing on top of the bound, never the whole log
    lines = _shown(store)
    assert lines[0].startswith("[... ") and "earlier lines dropped" in lines[0]
    assert lines[-1].split(" ", 2)[2].startswith("provisioned in ")
    assert lines[-2] == "line 02999 " + "x" * 40
    dropped = int(lines[0].split()[1])
    assert dropped + len(lines) - 1 == 3002  # title + 3000 + end: each line counted once


def test_a_very_long_line_is_cut_and_says_so() -> None:
    assert provision_log.clip("y" * 5000) == "y" * provision_log.MAX_LINE_CHARS + " [... 5000 chars]"


def test_follow_prints_lines_as_the_provisioning_writes_them_until_it_ends(
    store: LocalStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provision_log, "FLUSH_EVERY_S", 0.0)
    began, release = threading.Event(), threading.Event()

    def slow(request: ProvisionRequest) -> list[Node]:
        DRIVER.info("fake: waiting for SSH")
        began.set()
        assert release.wait(120)
        DRIVER.info("fake: SSH is up")
        return [_node(0), _node(1)]

    writer = threading.Thread(
        target=provision_log.provisioned, args=(store, ProvisionRequest("c", 2), [], slow), daemon=True
    )
    writer.start()
    assert began.wait(120)
    seen: list[str] = []

    def emit(line: str) -> None:
        seen.append(line)
        if line.endswith("fake: waiting for SSH"):
            release.set()  # the provisioning goes on only once the follower has shown its first lines

    record = provision_log.show(store, emit, worker=None, follow=True, poll_s=0.05)
    writer.join(120)
    assert record is not None and record["ended"] is True
    text = [line.split(" ", 2)[2] for line in seen]
    assert text[:3] == [
        "Provisioning cluster c: 2 node(s) (0 existing, 0 of them running)",
        "fake: waiting for SSH",
        "fake: SSH is up",
    ]
    assert text[-1].startswith("provisioned in ") and len(text) == 6  # each line once


def test_a_line_held_back_by_the_write_interval_is_written_without_waiting_for_another(
    store: LocalStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provision_log, "FLUSH_EVERY_S", 0.5)
    with provision_log.recording(store, "slow provisioning"):
        DRIVER.info("fake: launching")  # within the interval of the title's write: held back
        deadline = time.monotonic() + 120
        while not any(line.endswith("fake: launching") for line in _shown(store)):
            assert time.monotonic() < deadline, _shown(store)
            time.sleep(0.05)
        record = provision_log.read(store)
        assert record is not None and record["ended"] is False  # written while the provisioning still ran


def test_lines_another_thread_logs_meanwhile_stay_out_of_the_log(store: LocalStateStore) -> None:
    def other_cluster() -> None:
        DRIVER.info("fake: other-cluster: launching 8 x p5.48xlarge")

    def provision(request: ProvisionRequest) -> list[Node]:
        neighbour = threading.Thread(target=other_cluster)
        neighbour.start()
        neighbour.join(120)
        DRIVER.info("fake: mine: launching 1 x m5.large")
        return [_node(0)]

    provision_log.provisioned(store, ProvisionRequest("mine", 1), [], provision)
    text = " | ".join(_shown(store))
    assert "mine: launching" in text and "other-cluster" not in text, text
