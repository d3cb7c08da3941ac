"""Resources and JobRecovery: accepted forms, canonical values, candidates, GPU counts."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from airflow_sky import SpecError
from airflow_sky.task import JobRecovery, Resources, SpecWarning, Task, gpus_per_node


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("L4:4", {"L4": 4}),
        ("L4", {"L4": 1}),
        ("A100:0.5", {"A100": 0.5}),
        ("A100-80GB:8", {"A100-80GB": 8}),
        ({"L4": 4}, {"L4": 4}),
        ({"L4": 4, "A100": 8}, {"L4": 4, "A100": 8}),
        ({"V100:1": None, "A100:2": None}, {"V100": 1, "A100": 2}),
        (["L4:1", "A100:1"], {"L4": 1, "A100": 1}),
        ({"T4": 1.0}, {"T4": 1}),
    ],
)
def test_accelerator_forms_parse_into_ordered_candidates(value: Any, expected: dict[str, float]) -> None:
    assert Resources(accelerators=value).accelerators == expected


def test_accelerators_written_as_unquoted_yaml_set_parse() -> None:
    task = Task.from_yaml_str("resources:\n  accelerators: {V100:1, A100:1}\n")
    assert task.resources.accelerators == {"V100": 1, "A100": 1}


@pytest.mark.parametrize(
    ("value", "yaml_form"),
    [("L4:4", "L4:4"), ({"L4": 4, "A100": 8}, {"L4": 4, "A100": 8}), ("A100:0.5", "A100:0.5")],
)
def test_accelerators_serialize_to_one_string_or_a_mapping(value: Any, yaml_form: Any) -> None:
    assert Resources(accelerators=value).to_dict() == {"accelerators": yaml_form}


@pytest.mark.parametrize(
    ("accelerators", "gpus"),
    [(None, 0), ("L4:4", 4), ("A100:0.5", 1), ("A100:1.5", 2), ({"H100": 8, "L4": 1}, 8)],
)
def test_gpus_per_node_is_the_ceiling_of_the_first_candidate(accelerators: Any, gpus: int) -> None:
    assert gpus_per_node(Resources(accelerators=accelerators)) == gpus


def test_gpus_per_node_without_resources_is_zero() -> None:
    assert gpus_per_node(None) == 0


def test_accelerator_name_and_count_fall_back_to_the_first_alternative() -> None:
    resources = Resources(any_of=[{"cpus": 4}, {"accelerators": "L4:2"}])
    assert (resources.accelerator_name, resources.accelerator_count) == ("L4", 2)
    assert (Resources().accelerator_name, Resources().accelerator_count) == (None, 0)


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [(4, "4"), (4.0, "4"), (0.5, "0.5"), ("4+", "4+"), ("8", "8"), (" 2 + ", "2+"), ("1.50", "1.5")],
)
def test_cpus_canonicalize_to_strings(cpus: Any, expected: str) -> None:
    assert Resources(cpus=cpus).cpus == expected


@pytest.mark.parametrize(
    ("memory", "expected"),
    [(32, "32"), ("64+", "64+"), ("32GB", "32"), ("32gb+", "32+"), ("16.5", "16.5")],
)
def test_memory_canonicalizes_to_gigabyte_strings(memory: Any, expected: str) -> None:
    assert Resources(memory=memory).memory == expected


@pytest.mark.parametrize(
    ("kwargs", "placement", "infra"),
    [
        ({"infra": "aws/us-east-1"}, ("aws", "us-east-1", None), "aws/us-east-1"),
        ({"infra": "GCP/us-central1/us-central1-a"}, ("gcp", "us-central1", "us-central1-a"), None),
        ({"infra": "local"}, ("local", None, None), "local"),
        ({"infra": "ssh/mypool"}, ("ssh", "mypool", None), "ssh/mypool"),
        ({"infra": "*/us-east-1"}, (None, "us-east-1", None), "*/us-east-1"),
        ({"infra": "aws/*/us-east-1a"}, ("aws", None, "us-east-1a"), "aws/*/us-east-1a"),
        ({"cloud": "aws", "region": "us-west-2"}, ("aws", "us-west-2", None), "aws/us-west-2"),
        ({"region": "us-west-2"}, (None, "us-west-2", None), "*/us-west-2"),
    ],
)
def test_infra_and_cloud_region_zone_forms(
    kwargs: dict[str, Any], placement: tuple[Any, ...], infra: Any
) -> None:
    resources = Resources(**kwargs)
    assert (resources.cloud, resources.region, resources.zone) == placement
    assert resources.infra == (infra or "gcp/us-central1/us-central1-a")
    assert Resources.from_dict(resources.to_dict()) == resources


def test_infra_with_cloud_names_both_fields() -> None:
    with pytest.raises(SpecError) as info:
        Resources(infra="aws", zone="us-east-1a")
    assert "resources.infra" in str(info.value) and "resources.zone" in str(info.value)


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        (8080, ("8080",)),
        ("8080", ("8080",)),
        ("10000-10010", ("10000-10010",)),
        ([22, "80-81"], ("22", "80-81")),
    ],
)
def test_ports_canonicalize_to_strings(ports: Any, expected: tuple[str, ...]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ports act: no "not acted on" warning
        assert Resources(ports=ports).ports == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("failover", JobRecovery(strategy="FAILOVER")),
        ({"strategy": "EAGER_NEXT_REGION"}, JobRecovery(strategy="EAGER_NEXT_REGION")),
        (
            {"max_restarts_on_errors": 3, "recover_on_exit_codes": 33},
            JobRecovery(max_restarts_on_errors=3, recover_on_exit_codes=(33,)),
        ),
        ({"strategy": None, "recover_on_exit_codes": [33, 34]}, JobRecovery(recover_on_exit_codes=(33, 34))),
        (JobRecovery(strategy="failover", max_restarts_on_errors=1), JobRecovery("FAILOVER", 1)),
    ],
)
def test_job_recovery_forms(value: Any, expected: JobRecovery) -> None:
    assert Resources(job_recovery=value).job_recovery == expected


def test_job_recovery_python_constructor_validates() -> None:
    with pytest.raises(SpecError, match=r"^<python>: job_recovery.strategy: unknown strategy 'NOPE'"):
        JobRecovery(strategy="nope")
    with pytest.raises(
        SpecError, match=r"^<python>: job_recovery.max_restarts_on_errors: must be an integer >= 0"
    ):
        JobRecovery(max_restarts_on_errors=-1)


def test_task_job_recovery_defaults_when_unset() -> None:
    assert Task().job_recovery == JobRecovery()
    assert Task(resources={"job_recovery": "FAILOVER"}).job_recovery.strategy == "FAILOVER"


def test_any_of_candidates_merge_over_the_base() -> None:
    resources = Resources(
        accelerators="A100:8",
        use_spot=True,
        infra="aws/us-east-1",
        any_of=[{"infra": "gcp"}, Resources(use_spot=False)],
    )
    candidates = resources.candidates()
    assert [(c.infra, c.use_spot, c.accelerator_name) for c in candidates] == [
        ("gcp", True, "A100"),
        ("aws/us-east-1", False, "A100"),
    ]
    assert all(not c.any_of and not c.ordered for c in candidates)


def test_ordered_keeps_preference_order_and_round_trips() -> None:
    resources = Resources.from_dict({"ordered": [{"accelerators": "H100:8"}, {"accelerators": "A100:8"}]})
    assert [c.accelerator_name for c in resources.candidates()] == ["H100", "A100"]
    assert Resources.from_dict(resources.to_dict()) == resources


def test_several_accelerators_cannot_be_combined_with_ordered() -> None:
    with pytest.raises(SpecError, match=r"resources\.accelerators: several accelerator candidates"):
        Resources(accelerators=["L4:1", "A100:1"], ordered=[{"cpus": 2}])


def test_copy_replaces_fields_and_keeps_the_rest() -> None:
    base = Resources(accelerators="L4:4", infra="aws/us-east-1", use_spot=True)
    moved = base.copy(cloud="gcp", region="us-central1")
    assert moved.to_dict() == {"infra": "gcp/us-central1", "accelerators": "L4:4", "use_spot": True}
    assert base.infra == "aws/us-east-1"


def test_resources_errors_from_python_name_the_python_source() -> None:
    with pytest.raises(
        SpecError, match=r"^<python>: resources\.disk_size: must be a positive integer \(GB\), got 0$"
    ):
        Resources(disk_size=0)


def test_resources_from_dict_names_the_given_source() -> None:
    with pytest.raises(SpecError, match=r"^dag\.py: resources\.use_spot: must be true or false"):
        Resources.from_dict({"use_spot": "yes"}, source="dag.py")


def test_inert_resource_fields_are_kept_and_warned_once() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resources = Resources(image_id="docker:ubuntu", labels={"a": "b"}, priority=5, disk_tier="best")
    assert len(record) == 1 and issubclass(record[0].category, SpecWarning)
    assert str(record[0].message).endswith("(kept as written): resources.priority")
    assert resources.to_dict() == {
        "image_id": "docker:ubuntu",
        "labels": {"a": "b"},
        "disk_tier": "best",
        "priority": 5,
    }


def test_fields_that_act_on_aws_and_gcp_are_not_called_inert() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resources = Resources(ports=[8080], labels={"a": "b"}, disk_tier="best", network_tier="best")
    assert record == []
    assert resources.ports == ("8080",) and resources.network_tier == "best"
