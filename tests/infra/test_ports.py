"""The port rules every infra shares (infra/ports.py)."""

from __future__ import annotations

from airflow_sky.infra.ports import port_numbers, port_ranges, ports_to_open


def test_port_ranges_are_expanded_once_each_in_order() -> None:
    assert port_numbers(["8080", "10-12", "11", "22"]) == [10, 11, 12, 22, 8080]
    assert port_numbers([]) == []


def test_consecutive_ports_become_one_range() -> None:
    assert port_ranges([8082, 22, 8080, 8081, 8081]) == ("22", "8080-8082")
    assert port_ranges([]) == ()


def test_a_launch_onto_a_cluster_adds_the_ports_it_lacks_and_closes_none() -> None:
    assert ports_to_open(("8080",), ("6006", "8081")) == ("6006", "8080-8081")
    assert ports_to_open(("10000-10010",), ("10005",)) is None  # already open
    assert ports_to_open(("8080",), None) is None
    assert ports_to_open((), ("8080",)) == ("8080",)
