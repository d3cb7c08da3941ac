"""`airflow-sky check` on templates: envs/secrets declared null are valid in a file; `check` names what
`launch` will need and how to pass it; `launch` still refuses them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_sky.client.cli import main

TEMPLATE = """\
name: train
envs:
  EPOCHS: 10
  WANDB_PROJECT: null
secrets:
  WANDB_API_KEY: null
  HF_TOKEN: hf_set
file_mounts:
  /data: s3://$BUCKET/data
  /ckpt:
    name: $BUCKET
    store: $STORE
"""


@pytest.fixture(autouse=True)
def private_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() points AIRFLOW_HOME at its private home: keep that inside this test."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_SKY_AIRFLOW_HOME", str(tmp_path / "sky-airflow"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def template(tmp_path: Path) -> Path:
    text = TEMPLATE.replace("envs:\n", "envs:\n  BUCKET: null\n  STORE: null\n", 1)
    return write(tmp_path, text)


def test_check_accepts_a_template_and_names_what_launch_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = template(tmp_path)
    assert main(["check", str(path)]) == 0
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)
    assert printed["envs"] == {"BUCKET": None, "STORE": None, "EPOCHS": "10", "WANDB_PROJECT": None}
    assert printed["secrets"] == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": None}
    assert printed["file_mounts"]["/data"] == "s3://$BUCKET/data"  # filled in at launch
    notes = [line for line in err.splitlines() if line.startswith("airflow-sky: note: ")]
    assert len(notes) == 1, err
    note = notes[0]
    assert f"{path}: valid as a template; launch needs values for " in note
    assert "envs.BUCKET, envs.STORE, envs.WANDB_PROJECT, secrets.WANDB_API_KEY" in note
    assert "--env WANDB_PROJECT=VALUE (or in --env-file)" in note
    assert "--secret WANDB_API_KEY=VALUE (or --secret WANDB_API_KEY to take it from this shell's" in note
    assert "--secret-file" in note


def test_check_with_every_value_given_prints_no_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = template(tmp_path)
    argv = ["check", str(path), "--env", "BUCKET=bkt", "--env", "STORE=s3", "--env", "WANDB_PROJECT=p"]
    assert main([*argv, "--secret", "WANDB_API_KEY=k"]) == 0
    out, err = capsys.readouterr()
    assert "note:" not in err
    printed = yaml.safe_load(out)
    assert printed["file_mounts"] == {"/data": "s3://bkt/data", "/ckpt": {"name": "bkt", "store": "s3"}}
    assert printed["secrets"] == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": "<redacted>"}


def test_check_names_only_the_values_still_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = template(tmp_path)
    env_file = tmp_path / "launch.env"
    env_file.write_text("BUCKET=b\nSTORE=gcs\n")
    assert main(["check", str(path), "--env-file", str(env_file), "--env", "WANDB_PROJECT=p"]) == 0
    _, err = capsys.readouterr()
    assert "launch needs values for secrets.WANDB_API_KEY:" in err
    assert "envs." not in err


def test_a_template_that_is_wrong_elsewhere_is_still_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "envs:\n  A: null\nnum_nodes: 0\n")
    assert main(["check", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.strip() == f"airflow-sky: error: {path}: num_nodes: must be an integer >= 1, got 0"


def test_a_storage_field_filled_from_a_given_value_is_still_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = template(tmp_path)
    assert main(["check", str(path), "--env", "STORE=dropbox"]) == 2
    _, err = capsys.readouterr()
    assert f"{path}: file_mounts./ckpt.store: must be one of s3, gcs" in err


def test_launch_still_refuses_a_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = template(tmp_path)
    argv = ["launch", str(path), "--dryrun", "--env", "BUCKET=b", "--env", "STORE=s3"]
    assert main([*argv, "--env", "WANDB_PROJECT=p"]) == 2
    _, err = capsys.readouterr()
    assert err.strip() == (
        f"airflow-sky: error: {path}: secrets.WANDB_API_KEY: has no value; pass it at launch with "
        "--secret WANDB_API_KEY=VALUE (or --secret WANDB_API_KEY to take it from this shell's environment, "
        "or in --secret-file)"
    )
    assert main(["launch", str(path), "--dryrun"]) == 2
    _, err = capsys.readouterr()
    assert "envs.BUCKET: has no value; pass it at launch with --env BUCKET=VALUE (or in --env-file)" in err
