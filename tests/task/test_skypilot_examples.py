"""SkyPilot's own multi-node example tasks (tests/task/skypilot_examples/, see its README) go through `check`.

Each is accepted (warnings only for fields airflow-sky names as inert), or refused with the reason listed here.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from airflow_sky import SpecError
from airflow_sky.client.cli import main
from airflow_sky.task import SpecWarning, Task
from airflow_sky.task.resources_effects import NO_EFFECT_FIELDS
from airflow_sky.task.schema import INERT_RESOURCE_FIELDS, INERT_STORAGE_FIELDS, INERT_TASK_FIELDS

EXAMPLES_DIR = Path(__file__).parent / "skypilot_examples"
EXAMPLES = sorted(
    p for p in EXAMPLES_DIR.rglob("*.yaml") if "pipelines" not in p.relative_to(EXAMPLES_DIR).parts
)
PIPELINES = sorted((EXAMPLES_DIR / "pipelines").rglob("*.yaml"))

# relative path -> (field, reason) of the one-line refusal.
REFUSED = {
    # SkyPilot runs these on Kubernetes / Nebius, which airflow-sky does not provision.
    "examples/amd/amd-minGPT-ddp.yaml": ("resources.cloud", "Kubernetes is not supported"),
    "examples/aws_efa/nccl_efa.yaml": ("resources.infra", "Kubernetes is not supported"),
    "examples/nebius_infiniband/infiniband.yaml": ("resources.cloud", "unsupported cloud 'nebius'"),
    # A fill-in template: SkyPilot's storage schema refuses `name: null` too, until a bucket is written in.
    "examples/spot/resnet.yaml": ("file_mounts./checkpoint.name", "must be a string, got null"),
}

_INERT = re.compile(r"parsed but not acted on yet \(kept as written\): (?P<fields>.*)$")
_NO_EFFECT = re.compile(r": no effect on (?P<infra>[^:]+): (?P<fields>[^(]*) \(")


def _relative(path: Path) -> str:
    return path.relative_to(EXAMPLES_DIR).as_posix()


def _inert_field_is_known(field: str) -> bool:
    parts = field.split(".")
    if len(parts) == 1:
        return parts[0] in INERT_TASK_FIELDS
    if parts[0] == "config":  # config.docker.run_options acts; every other part of config is inert
        return parts[1:] != ["docker", "run_options"]
    if parts[0] == "file_mounts":
        return parts[-1] in INERT_STORAGE_FIELDS
    if parts[:2] == ["resources", "autostop"]:
        return parts[-1] == "hook"
    return parts[0] == "resources" and parts[-1] in INERT_RESOURCE_FIELDS


def test_there_are_25_to_35_examples_and_some_pipelines() -> None:
    assert 25 <= len(EXAMPLES) <= 35
    assert len(PIPELINES) >= 3
    assert set(REFUSED) <= {_relative(p) for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=[_relative(p) for p in EXAMPLES])
def test_skypilot_example_is_accepted_or_refused_with_a_reason(path: Path) -> None:
    refused = REFUSED.get(_relative(path))
    if refused is not None:
        field, reason = refused
        with pytest.raises(SpecError) as info:
            Task.from_yaml(path, allow_unset=True)
        assert str(info.value).startswith(f"{path}: {field}: {reason}"), str(info.value)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = Task.from_yaml(path, allow_unset=True)
    assert [w.category for w in caught] == [SpecWarning] * len(caught)
    for warning in caught:
        match = _INERT.search(str(warning.message))
        assert match is not None, str(warning.message)
        fields = match["fields"].split(", ")
        assert all(_inert_field_is_known(f) for f in fields), fields
    assert task.num_nodes >= 1
    assert task.run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        assert Task.from_yaml_str(task.to_yaml(), allow_unset=True) == task


@pytest.mark.parametrize("path", EXAMPLES, ids=[_relative(p) for p in EXAMPLES])
def test_skypilot_example_through_the_check_command(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_SKY_AIRFLOW_HOME", str(tmp_path / "sky-airflow"))
    refused = REFUSED.get(_relative(path))
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    if refused is not None:
        assert status == 2
        assert err.strip().startswith(f"airflow-sky: error: {path}: {refused[0]}: {refused[1]}")
        return
    assert status == 0, err
    assert out.strip()
    for line in err.splitlines():
        assert line.startswith(("airflow-sky: warning: ", "airflow-sky: note: ")), line
        effect = _NO_EFFECT.search(line)
        if effect is not None:  # named with the infra, and only fields that act on aws/gcp but not there
            assert effect["infra"] == "local", line
            fields = effect["fields"].split(", ")
            assert all(f.rsplit(".", 1)[-1] in NO_EFFECT_FIELDS["local"] for f in fields), fields
