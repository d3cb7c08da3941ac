"""The fleet ledger: its pure rules (spans, node-seconds, cost, bounds) and its records in a real store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_sky.infra import catalog, ledger
from airflow_sky.infra.local.state_store import LocalStateStore

AWS = ledger.Billing("m6i.large", False, 0.096, "us-east-1", "use1-az1", "2026-12-01")


def _record(billing: ledger.Billing | None = AWS) -> dict:
    return ledger.new_record("c", "aws/us-east-1", {"dag_id": "d"}, billing, 1000.0)


def test_spans_open_for_running_nodes_and_close_when_their_instance_changes_or_goes() -> None:
    record, changes = ledger.with_nodes(_record(), {0: "i-a", 1: "i-b"}, 1000.0)
    assert len(changes) == 2 and set(ledger.open_ranks(record)) == {0, 1}
    record, changes = ledger.with_nodes(record, {0: "i-a", 1: "i-c"}, 1600.0)  # rank 1 replaced
    assert changes == ["rank 1 (i-b) off the bill", "rank 1 (i-c) on the bill"]
    assert ledger.open_ranks(record)[1][1] == "i-c"
    record = ledger.closed(record, 4600.0)
    assert ledger.open_ranks(record) == {}
    # rank 0: 3600 s; rank 1: 600 s on i-b, then 3000 s on i-c
    assert ledger.node_seconds(record, now=9999.0) == 7200.0
    assert ledger.cost(record, now=9999.0) == pytest.approx(2 * 0.096)
    assert ledger.cost_per_hour(record) == 0.0


def test_a_runs_share_counts_only_node_time_inside_its_window() -> None:
    record, _ = ledger.with_nodes(_record(), {0: "i-a", 1: "i-b"}, 1000.0)
    assert ledger.node_seconds(record, now=2000.0, since=1500.0) == 1000.0
    assert ledger.node_seconds(record, now=2000.0, since=500.0, until=1100.0) == 200.0
    assert ledger.cost_per_hour(record) == pytest.approx(0.192)


def test_nodes_not_billed_by_the_hour_cost_nothing_and_an_unpriced_type_is_unknown() -> None:
    local, _ = ledger.with_nodes(_record(None), {0: "n"}, 1000.0)
    assert ledger.cost(local, 4600.0) == 0.0 and ledger.summary(local, 4600.0)["node_hours"] == 1.0
    unpriced, _ = ledger.with_nodes(_record(ledger.Billing("x1.odd", True, None)), {0: "n"}, 1000.0)
    assert ledger.cost(unpriced, 4600.0) is None and ledger.cost_per_hour(unpriced) is None
    assert "unknown" in ledger.cost_line(ledger.summary(unpriced, 4600.0))


def test_events_and_spans_stay_bounded_and_folded_time_is_still_billed() -> None:
    record = _record()
    for i in range(ledger.MAX_EVENTS + 10):
        record = ledger.with_event(record, float(i), "replaced", f"event {i}")
    assert len(record["events"]) == ledger.MAX_EVENTS and record["events_dropped"] == 10
    assert record["events"][-1][3] == f"event {ledger.MAX_EVENTS + 9}"
    for i in range(ledger.MAX_SPANS + 20):  # a pool worker's rank replaced again and again, 10 s each
        record, _ = ledger.with_nodes(record, {0: f"i-{i}"}, 1000.0 + 10 * i)
    assert len(record["spans"]) <= ledger.MAX_SPANS
    total = ledger.node_seconds(record, now=1000.0 + 10 * (ledger.MAX_SPANS + 19))
    assert total == pytest.approx(10 * (ledger.MAX_SPANS + 19))


def test_catalog_billing_prices_the_zone_and_spot_as_the_catalog_says() -> None:
    offering = next(o for o in catalog.offerings("aws") if o.instance_type == "m6i.large" and o.spot_price)
    on_demand = ledger.catalog_billing("aws", "m6i.large", False, offering.region, offering.zone)
    spot = ledger.catalog_billing("aws", "m6i.large", True, offering.region, offering.zone)
    assert (on_demand.hourly, spot.hourly) == (offering.price, offering.spot_price)
    assert on_demand.catalog_as_of == catalog.meta()["as_of"]
    assert ledger.catalog_billing("aws", "no.such", False, "us-east-1", None).hourly is None


def test_owner_is_the_run_and_its_user_and_a_cli_launch_is_its_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ledger.LAUNCHED_BY_ENV, raising=False)
    assert ledger.owner_of("d", "r", "alice") == {
        "dag_id": "d",
        "run_id": "r",
        "user": "alice",
        "via": "airflow",
    }
    monkeypatch.setenv(ledger.LAUNCHED_BY_ENV, "bob")
    assert ledger.owner_of("d", "r", "dag_test")["user"] == "bob"
    assert ledger.owner_of("d", "r", None)["via"] == "cli"


def test_a_torn_down_cluster_is_kept_under_ended_and_a_new_launch_of_its_name_starts_a_new_record(
    tmp_path: Path,
) -> None:
    clock = iter(float(t) for t in range(1000, 100000, 100))
    fleet = ledger.Ledger(LocalStateStore(tmp_path / "state"), clock=lambda: next(clock))
    fleet.provisioned("c", "local", {0: "a", 1: "b"}, {"dag_id": "d"}, None, "2 node(s)")
    fleet.node_replaced("c", 1, "b", "b2")
    fleet.event("c", "preempted", "rank 1 lost", 1)
    fleet.torn_down("c")
    fleet.torn_down("c", "found gone by a reader")  # a second teardown of the same record changes nothing
    assert fleet.live() == []
    [ended] = fleet.ended()
    assert [e[1] for e in ended["events"]] == ["provisioned", "replaced", "preempted", "torn down"]
    assert ended["owner"] == {"dag_id": "d"} and ended["ended_at"] is not None
    fleet.provisioned("c", "local", {0: "x"}, None, None, "1 node(s)")
    [live] = fleet.live()
    assert [e[1] for e in live["events"]] == ["provisioned"] and live["owner"] is None
    assert len(fleet.ended()) == 1 and fleet.ended(since=10**9) == []


def test_concurrent_writers_lose_no_event(tmp_path: Path) -> None:
    fleet = ledger.Ledger(LocalStateStore(tmp_path / "state"))
    fleet.provisioned("c", "local", {0: "a"}, None, None, "1 node(s)")

    def write(i: int) -> None:
        for j in range(5):
            fleet.event("c", "note", f"{i}-{j}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record = fleet.get("c")
    assert record is not None and len(record["events"]) == 31
