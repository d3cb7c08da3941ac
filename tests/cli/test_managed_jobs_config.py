"""Where `airflow-sky jobs` finds the Airflow API, and what it refuses before calling it (no server needed)."""

from __future__ import annotations

import json

import pytest

from airflow_sky.client import managed_jobs
from airflow_sky.client.airflow_api import api_config
from airflow_sky.errors import SkyError, SpecError
from airflow_sky.task import Task


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in (
        "AIRFLOW_SKY_API_URL",
        "AIRFLOW_SKY_API_TOKEN",
        "AIRFLOW_CLI_TOKEN",
        "AIRFLOW_CLI_ENVIRONMENT",
        "AIRFLOW_SKY_JOBS_BUCKET",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    return tmp_path


def test_the_api_is_found_in_the_environment_then_the_config_file_then_airflowctls_config(
    clean_env, monkeypatch
):
    assert api_config().url == "http://localhost:8080"
    (clean_env / "airflow").mkdir()
    (clean_env / "airflow" / "production.json").write_text(json.dumps({"api_url": "http://ctl:8080"}))
    monkeypatch.setenv("AIRFLOW_CLI_TOKEN", "ctl-token")
    found = api_config()
    assert (found.url, found.token) == ("http://ctl:8080", "ctl-token")
    (clean_env / "sky").mkdir()
    (clean_env / "sky" / "config.yaml").write_text(
        "api:\n  url: http://file:8080\n  username: u\n  password: pw-1\n"
    )
    found = api_config()
    assert (found.url, found.username, found.password) == ("http://file:8080", "u", "pw-1")
    assert "pw-1" not in repr(found)  # the password stays out of reprs
    monkeypatch.setenv("AIRFLOW_SKY_API_URL", "http://env:8080")
    monkeypatch.setenv("AIRFLOW_SKY_API_TOKEN", "env-token")
    found = api_config()
    assert (found.url, found.token) == ("http://env:8080", "env-token")


def test_a_config_file_with_an_unknown_api_field_is_refused_naming_it(clean_env):
    (clean_env / "sky").mkdir()
    (clean_env / "sky" / "config.yaml").write_text("api:\n  url: http://x\n  pasword: p\n")
    with pytest.raises(SkyError, match=r"config.yaml: api: unknown field\(s\) pasword"):
        api_config()


def test_a_task_with_a_local_workdir_is_refused_naming_the_jobs_bucket_setting_before_any_request(
    clean_env, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_SKY_API_URL", "http://127.0.0.1:9")  # nothing listens: no request may be made
    monkeypatch.delenv("AIRFLOW_SKY_JOBS_BUCKET", raising=False)
    task = Task(
        run="true",
        workdir=str(clean_env),
        file_mounts={"/data": str(clean_env), "/bucket": "s3://my-bucket/data"},
    )
    with pytest.raises(SpecError) as refused:
        managed_jobs.launch(task)
    message = str(refused.value)
    assert message.startswith(f"workdir ({clean_env}), file_mounts./data ({clean_env}): ")
    assert "set jobs.bucket in ~/.airflow_sky/config.yaml (or AIRFLOW_SKY_JOBS_BUCKET)" in message
    assert "s3://my-bucket" not in message  # a bucket file_mount is no local path
