"""Which resource fields have no effect on which infra (task/resources_effects.py), and the validation of
the fields that act (ports, disk_tier, network_tier): one line naming the field and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_sky import SpecError
from airflow_sky.task import Resources
from airflow_sky.task.resources_effects import no_effect_fields, no_effect_warning, ports_note

ALL = {"disk_tier": "best", "network_tier": "best", "labels": {"team": "ml"}, "ports": [8080]}


@pytest.mark.parametrize("infra", ["local", "ssh/pool"])
def test_tiers_and_labels_have_no_effect_on_local_and_ssh(infra: str) -> None:
    resources = Resources(**ALL)
    assert no_effect_fields(resources, infra) == [
        "resources.disk_tier",
        "resources.network_tier",
        "resources.labels",
    ]
    warning = no_effect_warning("t.yaml", resources, infra)
    assert warning is not None and warning.startswith(
        f"t.yaml: no effect on {infra}: resources.disk_tier, resources.network_tier, resources.labels ("
    )
    assert "\n" not in warning


@pytest.mark.parametrize("infra", ["aws", "aws/us-east-1", "gcp/us-central1"])
def test_every_field_acts_on_aws_and_gcp(infra: str) -> None:
    resources = Resources(**ALL)
    assert no_effect_fields(resources, infra) == []
    assert no_effect_warning("t.yaml", resources, infra) is None
    assert ports_note("t.yaml", resources, infra) is None


def test_network_tier_standard_is_what_every_infra_gives_so_it_is_not_named() -> None:
    assert no_effect_fields(Resources(network_tier="standard"), "local") == []
    assert no_effect_fields(Resources(network_tier="best"), "local") == ["resources.network_tier"]


def test_an_alternative_on_another_cloud_is_not_named_for_local() -> None:
    resources = Resources(
        any_of=[
            {"infra": "aws", "disk_tier": "best"},
            {"disk_tier": "high"},
            {"infra": "local", "labels": {"a": "b"}},
        ]
    )
    assert no_effect_fields(resources, "local") == [
        "resources.any_of.1.disk_tier",
        "resources.any_of.2.labels",
    ]
    assert no_effect_fields(resources, "aws") == []


def test_ports_on_an_ssh_pool_get_a_note_that_nothing_is_opened() -> None:
    resources = Resources(ports=[8080, "9000-9001"])
    note = ports_note("t.yaml", resources, "ssh/lab")
    assert note is not None
    assert "resources.ports 8080, 9000-9001" in note and "on ssh/lab nothing is opened" in note
    assert ports_note("t.yaml", resources, "local") is None  # a loopback node's ports are all reachable
    assert no_effect_fields(resources, "ssh/lab") == []  # ports are recorded for status --endpoints


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "disk_tier",
            "fastest",
            "resources.disk_tier: must be one of low, medium, high, ultra, best, got 'fastest'",
        ),
        ("network_tier", "premium", "resources.network_tier: must be one of standard, best, got 'premium'"),
        ("ports", 0, "resources.ports: must be a port 1..65535 or a range 'LO-HI', got 0"),
        ("ports", 65536, "resources.ports: must be a port 1..65535 or a range 'LO-HI', got 65536"),
        ("ports", "http", "resources.ports: must be a port 1..65535 or a range 'LO-HI', got 'http'"),
        (
            "ports",
            [80, "9000-8000"],
            "resources.ports.1: must be a port 1..65535 or a range 'LO-HI', got '9000-8000'",
        ),
        ("ports", [True], "resources.ports.0: must be a port"),
    ],
)
def test_a_bad_tier_or_port_is_one_line_naming_the_field_and_what_is_allowed(
    field: str, value: Any, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        Resources.from_dict({field: value}, source="t.yaml")
    assert str(info.value).startswith(f"t.yaml: {message}"), str(info.value)
    assert "\n" not in str(info.value)
