"""`airflow-sky check [--infra I]`: the resource fields that have no effect on the infra a launch would use
are named once, with the infra (a warning: the file is valid); on aws and gcp every one of them acts."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sky.client.cli import main

TASK = """\
resources:
  ports: 8080
  disk_tier: best
  network_tier: best
  labels: {team: ml}
run: echo hi
"""
FIELDS = "resources.disk_tier, resources.network_tier, resources.labels"


@pytest.fixture
def task_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_SKY_AIRFLOW_HOME", str(tmp_path / "sky-airflow"))
    path = tmp_path / "task.yaml"
    path.write_text(TASK)
    return path


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["check", *args]) == 0
    return capsys.readouterr().err.splitlines()


def test_on_local_tiers_and_labels_are_named_once_with_the_infra(
    task_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _check(capsys, str(task_file))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"airflow-sky: warning: {task_file}: no effect on local: {FIELDS} (")
    assert "not acted on" not in lines[0] and "ports" not in lines[0]


@pytest.mark.parametrize("infra", ["aws", "aws/us-east-1", "gcp/us-central1"])
def test_on_aws_and_gcp_every_field_acts_so_nothing_is_said(
    task_file: Path, capsys: pytest.CaptureFixture[str], infra: str
) -> None:
    assert _check(capsys, str(task_file), "--infra", infra) == []


def test_the_tasks_own_infra_is_the_one_checked(task_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task_file.write_text(TASK.replace("resources:\n", "resources:\n  infra: gcp\n"))
    assert _check(capsys, str(task_file)) == []
    lines = _check(capsys, str(task_file), "--infra", "local")
    assert len(lines) == 1 and "no effect on local" in lines[0]


def test_on_an_ssh_pool_the_ports_are_not_opened_and_that_is_said(
    task_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _check(capsys, str(task_file), "--infra", "ssh/lab")
    assert lines[0].startswith(f"airflow-sky: warning: {task_file}: no effect on ssh/lab: {FIELDS} (")
    assert lines[1] == (
        f"airflow-sky: note: {task_file}: resources.ports 8080: listed by `status --endpoints`; on ssh/lab "
        "nothing is opened (the pool's own firewall applies)"
    )
    assert len(lines) == 2


def test_each_task_of_a_pipeline_is_checked_for_its_own_infra(
    tmp_path: Path, task_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(
        "name: p\n---\nname: prep\nresources: {disk_tier: best}\nrun: echo\n"
        "---\nname: train\nresources: {infra: aws, disk_tier: best}\nrun: echo\n"
    )
    lines = [line for line in _check(capsys, str(pipeline)) if "no effect" in line]
    assert lines == [
        f"airflow-sky: warning: {pipeline} (prep): no effect on local: resources.disk_tier (local nodes are "
        "processes on this machine: no disks, tags or network to set)"
    ]
