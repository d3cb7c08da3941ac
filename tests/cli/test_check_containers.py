"""`check` over task files with `image_id: docker:<image>`: the image is run, never refused or called
ignored, and `check` says which container runtime the nodes of the infra use (this machine's, probed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from airflow_sky.client.cli import main
from tests.task.test_skypilot_examples import EXAMPLES_DIR, REFUSED

DOCKER_EXAMPLES = sorted(
    p
    for p in EXAMPLES_DIR.rglob("*.yaml")
    if "docker:" in p.read_text() and p.relative_to(EXAMPLES_DIR).as_posix() not in REFUSED
)


@pytest.fixture(autouse=True)
def _homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_SKY_AIRFLOW_HOME", str(tmp_path / "sky-airflow"))


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    status = main(["check", *argv])
    err = capsys.readouterr().err
    assert status == 0, err
    return err.splitlines()


def test_skypilot_examples_with_a_docker_image_are_neither_refused_nor_called_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert len(DOCKER_EXAMPLES) >= 4  # NeMo, DeepSpeed multinode, GPUDirect-TCPX, Kimi K2, the GPT-2 pipeline
    for path in DOCKER_EXAMPLES:
        lines = _check(capsys, str(path))
        about_image = [line for line in lines if "image_id" in line]
        assert about_image, f"{path}: nothing said about its image"
        for line in about_image:
            assert line.startswith("airflow-sky: note: "), line
            assert "setup and run execute inside " in line and "one container per node" in line, line
            assert "not acted on" not in line and "no effect" not in line, line


def _image_note(capsys: pytest.CaptureFixture[str], tmp_path: Path, image: str, infra: str) -> str:
    """`check --infra INFRA` of a task running `image`: its one line about the image."""
    task = tmp_path / "task.yaml"
    task.write_text(f"resources:\n  image_id: docker:{image}\nrun: echo hi\n")
    (note,) = [line for line in _check(capsys, str(task), "--infra", infra) if "image_id" in line]
    return note


def test_check_names_this_machines_container_runtime_for_local(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    note = _image_note(capsys, tmp_path, "localhost/some-image:1", "local")
    assert "inside localhost/some-image:1" in note
    runtimes = note.partition("on local: this machine has ")[2]
    assert runtimes.split(", ")[0] == "podman", note
    if shutil.which("docker") is not None:  # a client without a daemon is named as such, never as usable
        up = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
        assert ("docker" if up else "docker (its daemon is not reachable)") in runtimes.split(", "), note


def test_check_says_where_each_infra_finds_its_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh = _image_note(capsys, tmp_path, "ubuntu:22.04", "ssh/gpu-box")
    assert "found at launch" in ssh and "airflow-sky ssh check gpu-box" in ssh, ssh
    aws = _image_note(capsys, tmp_path, "ubuntu:22.04", "aws")
    assert "Docker on each node" in aws, aws
    plain = tmp_path / "plain.yaml"
    plain.write_text("run: echo hi\n")
    assert not [line for line in _check(capsys, str(plain)) if "container" in line]
