"""GPU detection from nvidia-smi's CSV output and matching against `accelerators` (pure functions)."""

from __future__ import annotations

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.gpus import Gpus, matching_count, model_matches, parse_nvidia_smi, satisfies, share


def test_nvidia_smi_output_gives_one_name_per_device() -> None:
    gpus = parse_nvidia_smi("NVIDIA L4, 2\nNVIDIA L4, 2\n")
    assert gpus == Gpus(("NVIDIA L4", "NVIDIA L4")) and gpus.count == 2
    assert gpus.describe() == "2x NVIDIA L4"
    assert parse_nvidia_smi("") == Gpus()


@pytest.mark.parametrize(
    ("requested", "reported", "matches"),
    [
        ("L4", "NVIDIA L4", True),
        ("L4", "NVIDIA L40S", False),
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
        ("A100-80GB", "NVIDIA A100-SXM4-40GB", False),
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("T4", "Tesla T4", True),
        ("V100", "Tesla T4", False),
    ],
)
def test_a_requested_model_matches_the_words_of_the_reported_name(
    requested: str, reported: str, matches: bool
) -> None:
    assert model_matches(requested, reported) is matches


def test_a_host_satisfies_the_first_candidate_it_has_enough_of() -> None:
    host = Gpus(("NVIDIA L4",) * 4)
    assert satisfies(host, {"A100": 1, "L4": 4}) == "L4"
    assert satisfies(host, {"L4": 8}) is None
    assert satisfies(host, {"L4": 0.5}) == "L4"  # a fractional count needs one device
    assert satisfies(host, None) == ""
    assert matching_count(host, "L4") == 4


def test_local_nodes_get_disjoint_shares_and_too_many_is_a_clear_error() -> None:
    assert share(8, 2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert share(8, 3, 0) == [[], [], []]
    with pytest.raises(
        ClusterError, match=r"2 node\(s\) x 4 GPU\(s\) = 8 GPUs asked for, but this machine has 1"
    ):
        share(1, 2, 4)
