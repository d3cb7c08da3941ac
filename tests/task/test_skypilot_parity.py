"""SkyPilot schema parity (sky/utils/schemas.py, sky/resources.py, sky/task.py): each difference found, fixed.

Every form SkyPilot accepts for the infras airflow-sky supports is accepted with SkyPilot's meaning, or named
once as not acted on (SpecWarning), or refused with a one-line reason.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from airflow_sky import SpecError
from airflow_sky.task import Resources, SpecWarning, StorageMount, Task

pytestmark = pytest.mark.filterwarnings("ignore::airflow_sky.task.SpecWarning")


def load(text: str, **kwargs: Any) -> Task:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        return Task.from_yaml_str(text, **kwargs)


def inert_warning(text: str) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        Task.from_yaml_str(text)
    messages = [str(w.message) for w in caught if issubclass(w.category, SpecWarning)]
    assert len(messages) == 1, messages
    return messages[0]


# -- accelerators ------------------------------------------------------------------------------------------


def test_one_gpu_at_several_counts_is_three_candidates() -> None:
    task = load("resources:\n  accelerators: {A100:4, A100:8, A100-80GB:2}\n")
    resources = task.resources
    assert resources.accelerator_candidates == (("A100", 4), ("A100", 8), ("A100-80GB", 2))
    assert [r.accelerator_candidates for r in resources.candidates()] == [
        (("A100", 4),),
        (("A100", 8),),
        (("A100-80GB", 2),),
    ]
    assert resources.accelerators == {"A100": 4, "A100-80GB": 2}  # first count per name
    assert resources.to_dict()["accelerators"] == {"A100:4": None, "A100:8": None, "A100-80GB:2": None}
    assert Task.from_yaml_str(task.to_yaml()) == task


def test_one_gpu_at_several_counts_in_a_list_keeps_the_order() -> None:
    resources = Resources(accelerators=["A100:8", "A100:4"])
    assert resources.accelerators_ordered
    assert [r.accelerator_count for r in resources.candidates()] == [8, 4]
    assert resources.to_dict()["accelerators"] == ["A100:8", "A100:4"]


def test_a_candidate_given_twice_counts_once() -> None:
    assert Resources(accelerators=["L4:1", "L4:1"]).accelerator_candidates == (("L4", 1),)


def test_gpus_is_an_alias_of_accelerators() -> None:
    task = load("resources:\n  gpus: H100:8\n  any_of:\n    - gpus: A100:8\n    - infra: aws\n")
    assert task.resources.accelerators == {"H100": 8}
    assert task.resources.any_of[0].accelerators == {"A100": 8}
    assert "gpus" not in task.resources.to_dict()
    assert Resources(gpus="L4:2").accelerators == {"L4": 2}


def test_gpus_and_accelerators_together_are_refused() -> None:
    with pytest.raises(
        SpecError, match=r"^<string>: resources\.gpus: cannot be combined with resources\.acc"
    ):
        load("resources:\n  gpus: H100:8\n  accelerators: A100:8\n")


@pytest.mark.parametrize("spec", ["80GB+", "nvidia:80GB:2", "24GB:1", "amd:64GB+"])
def test_gpus_chosen_by_memory_are_refused_with_a_reason(spec: str) -> None:
    with pytest.raises(
        SpecError, match=r"resources\.accelerators: GPUs chosen by memory size .* not supported"
    ):
        Resources(accelerators=spec)


def test_a_list_of_accelerators_with_any_of_is_refused_as_in_skypilot() -> None:
    with pytest.raises(SpecError, match=r"resources\.accelerators: a list of accelerators .* `any_of`"):
        Resources(accelerators=["A100:8", "H100:8"], any_of=[{"infra": "aws"}, {"infra": "gcp"}])
    Resources(accelerators={"A100": 8, "H100": 8}, any_of=[{"infra": "aws"}, {"infra": "gcp"}])


# -- sizes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "gigabytes"),
    [
        (100, 100),
        ("100", 100),
        ("1024GB", 1024),
        ("1024gb", 1024),
        ("1TB", 1024),
        ("256Gi", 256),
        ("2048MB", 2),
    ],
)
def test_disk_size_takes_units(value: Any, gigabytes: int) -> None:
    assert Resources(disk_size=value).disk_size == gigabytes
    assert load(f"resources:\n  disk_size: {value}\n").resources.disk_size == gigabytes


@pytest.mark.parametrize("value", ["512MB", "1.5TB", "big", "10GB+", "-5", 0])
def test_disk_size_refuses_what_is_not_a_whole_size(value: Any) -> None:
    with pytest.raises(SpecError, match=r"resources\.disk_size: must be"):
        Resources(disk_size=value)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("1TB", "1024"), ("512MB", "0.5"), ("16Gi+", "16+"), ("32 GB", "32"), ("64gb+", "64+"), ("2Ti", "2048")],
)
def test_memory_takes_skypilot_units(value: str, canonical: str) -> None:
    assert Resources(memory=value).memory == canonical


def test_cpus_take_any_python_float() -> None:
    assert Resources(cpus="1e1+").cpus == "10+"


# -- tiers, priority, volumes, accelerator_args, autostop ------------------------------------------------------


def test_tiers_are_skypilot_enums_in_any_case() -> None:
    resources = Resources(disk_tier="HIGH", network_tier="Best")
    assert (resources.disk_tier, resources.network_tier) == ("high", "best")
    with pytest.raises(
        SpecError, match=r"resources\.disk_tier: must be one of low, medium, high, ultra, best"
    ):
        Resources(disk_tier="fast")
    with pytest.raises(SpecError, match=r"resources\.network_tier: must be one of standard, best"):
        Resources(network_tier="premium")


def test_priority_and_resource_volumes_are_inert() -> None:
    message = inert_warning(
        "resources:\n  priority: 10\n  volumes:\n    - path: /mnt/disk\n      name: d\n      disk_size: 100\n"
    )
    assert "resources.priority, resources.volumes" in message
    task = load("resources:\n  priority: -1000\n")
    assert task.resources.priority == -1000
    with pytest.raises(SpecError, match=r"resources\.priority: must be an integer -1000\.\.1000, got 1001"):
        Resources(priority=1001)


def test_accelerator_args_are_skypilots_four_fields() -> None:
    Resources(accelerator_args={"runtime_version": "tpu-vm-base", "tpu_vm": True, "tpu_name": "t"})
    with pytest.raises(SpecError, match=r"resources\.accelerator_args\.tpu_type: unknown field"):
        Resources(accelerator_args={"tpu_type": "v4"})


def test_a_negative_autostop_is_off_as_in_skypilot() -> None:
    assert Resources(autostop=-1).autostop is False
    with pytest.raises(SpecError, match=r"resources\.autostop\.idle_minutes: idle minutes must be >= 0"):
        Resources(autostop={"idle_minutes": -1})


def test_autostop_hook_units_and_wait_for_case() -> None:
    resources = load(
        "resources:\n  autostop:\n    idle_minutes: 10\n    wait_for: JOBS\n    hook: git push\n"
        "    hook_timeout: 300\n"
    ).resources
    assert resources.autostop == {
        "idle_minutes": 10,
        "down": False,
        "wait_for": "jobs",
        "hook": "git push",
        "hook_timeout": 300,
    }
    assert "resources.autostop.hook" in inert_warning("resources:\n  autostop: {hook: echo bye}\n")
    assert Resources(autostop="2w").autostop == {
        "idle_minutes": 2 * 7 * 24 * 60,
        "down": False,
        "wait_for": "jobs_and_ssh",
    }
    assert Resources(autostop="3H").autostop["idle_minutes"] == 180  # type: ignore[index]
    with pytest.raises(SpecError, match=r"resources\.autostop\.hook_timeout: must be an integer >= 1"):
        Resources(autostop={"hook": "x", "hook_timeout": 0})


# -- job_recovery ----------------------------------------------------------------------------------------------


def test_spot_recovery_is_the_legacy_name_of_job_recovery() -> None:
    task = load("resources:\n  spot_recovery: failover\n")
    assert task.resources.job_recovery is not None
    assert task.resources.job_recovery.strategy == "FAILOVER"
    assert task.resources.to_dict() == {"job_recovery": {"strategy": "FAILOVER"}}
    with pytest.raises(
        SpecError, match=r"resources\.spot_recovery: cannot be combined with resources\.job_rec"
    ):
        load("resources:\n  spot_recovery: FAILOVER\n  job_recovery: FAILOVER\n")


@pytest.mark.parametrize("value", ["none", "{strategy: none, max_restarts_on_errors: 3}"])
def test_job_recovery_strategy_none_means_no_policy(value: str) -> None:
    assert load(f"resources:\n  job_recovery: {value}\n").resources.job_recovery is None


def test_null_fields_inside_any_of_count_as_absent() -> None:
    task = load("resources:\n  any_of:\n    - image_id: null\n      infra: aws\n    - infra: gcp\n")
    assert task.resources.any_of[0].to_dict() == {"infra": "aws"}


def test_any_of_labels_are_merged_over_the_base_labels() -> None:
    resources = Resources(labels={"team": "ml", "env": "dev"}, any_of=[{"labels": {"env": "prod"}}])
    assert resources.candidates()[0].labels == {"team": "ml", "env": "prod"}


# -- envs, file_mounts, substitution -------------------------------------------------------------------------


def test_env_scalars_become_python_strings_as_in_skypilot() -> None:
    task = load("envs:\n  FLAG: true\n  NO_FLAG: false\n  DAY: 2024-01-01\n  N: 3\nsecrets:\n  S: yes\n")
    assert task.envs == {"FLAG": "True", "NO_FLAG": "False", "DAY": "2024-01-01", "N": "3"}
    assert task.secrets == {"S": "True"}


def test_env_keys_yaml_reads_as_booleans_are_refused() -> None:
    # SkyPilot would rename `OFF:` (YAML 1.1 reads it as false) to 'False'; we ask for quotes instead.
    with pytest.raises(SpecError, match=r"envs\.False: keys must be strings, got a boolean \(false\); quote"):
        load("envs:\n  OFF: 1\n")


def test_env_lists_are_still_refused() -> None:
    with pytest.raises(SpecError, match=r"envs\.IDS: must be a string, a number or a boolean"):
        load("envs:\n  IDS: [1, 2]\n")


def test_relative_remote_path_lands_below_the_workdir_as_in_skypilot() -> None:
    task = load("file_mounts:\n  data: s3://bucket/data\n  ckpt/$RUN: ./ckpt\nenvs:\n  RUN: r1\n")
    assert list(task.file_mounts) == ["~/sky_workdir/data", "~/sky_workdir/ckpt/r1"]


def test_storage_fields_are_checked_after_substitution() -> None:
    task = load(
        "envs:\n  STORE: s3\n  MODE: copy\nfile_mounts:\n  /data:\n    name: b\n    store: $STORE\n    mode: ${MODE}\n"
    )
    assert task.file_mounts["/data"] == StorageMount(name="b", store="s3", mode="COPY")
    with pytest.raises(SpecError, match=r"file_mounts\./data\.store: must be one of"):
        load("envs:\n  STORE: dropbox\nfile_mounts:\n  /data:\n    name: b\n    store: $STORE\n")


def test_coreweave_buckets_are_accepted_and_volume_stores_refused() -> None:
    task = load("file_mounts:\n  /a: cw://bucket/x\n  /b:\n    name: bucket\n    store: coreweave\n")
    assert task.file_mounts["/a"] == "cw://bucket/x"
    with pytest.raises(SpecError, match=r"file_mounts\./scratch\.store: SkyPilot volumes .* not supported"):
        load("file_mounts:\n  /scratch:\n    name: s\n    store: volume\n")


def test_storage_config_is_kept_and_named_inert() -> None:
    text = "file_mounts:\n  /data:\n    name: b\n    store: s3\n    config: {disk_tier: best}\n"
    assert "file_mounts./data.config" in inert_warning(text)
    task = load(text)
    assert task.to_dict()["file_mounts"]["/data"]["config"] == {"disk_tier": "best"}


def test_envs_are_filled_into_service_and_volumes_as_in_skypilot() -> None:
    task = load(
        "envs:\n  MODEL: llama\nservice:\n  readiness_probe:\n    path: /v1/models/$MODEL\n"
        "volumes:\n  /mnt/vol: vol-${MODEL}\n"
    )
    assert task.extra_fields["service"] == {"readiness_probe": {"path": "/v1/models/llama"}}
    assert task.extra_fields["volumes"] == {"/mnt/vol": "vol-llama"}
    assert Task.from_yaml_str(task.to_yaml()) == task


def test_inputs_and_outputs_are_inert() -> None:
    message = inert_warning("inputs:\n  s3://in: 10\noutputs:\n  s3://out: 0.5\n")
    assert "inputs, outputs" in message
    with pytest.raises(SpecError, match=r"^<string>: inputs: "):
        load("inputs:\n  s3://a: 1\n  s3://b: 2\n")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("file_mounts_mapping: {}\n", "file_mounts_mapping"),
        ("_metadata: {git_commit: abc}\n", "_metadata"),
        ("volume_mounts: []\n", "volume_mounts"),
        ("resources:\n  _requires_fuse: true\n", "resources._requires_fuse"),
        (
            "resources:\n  any_of:\n    - _no_missing_accel_warnings: true\n",
            "resources.any_of.0._no_missing_accel_warnings",
        ),
        ("file_mounts:\n  /d:\n    name: b\n    _force_delete: true\n", "file_mounts./d._force_delete"),
    ],
)
def test_skypilot_internal_fields_are_refused_with_that_reason(text: str, field: str) -> None:
    with pytest.raises(SpecError, match=rf"^<string>: {field.replace('.', '[.]')}: SkyPilot-internal field"):
        load(text)
