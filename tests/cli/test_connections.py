"""Whether the CLI's Airflow has a connection, read without Airflow where that is sure: the environment,
airflow.cfg and a real SQLite DB with Airflow's `connection` table; anything else is left to Airflow."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from airflow_sky.client.connections import AskAirflow, defined_without_airflow


def _db(path: Path, *conn_ids: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE connection (id INTEGER PRIMARY KEY, conn_id VARCHAR(250) UNIQUE)")
        db.executemany("INSERT INTO connection (conn_id) VALUES (?)", [(c,) for c in conn_ids])
    db.close()


def test_an_airflow_conn_variable_defines_it(tmp_path: Path):
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONN_AWS_DEFAULT": '{"conn_type": "aws"}'}
    assert defined_without_airflow("aws_default", env) is True


def test_a_home_without_a_db_has_none(tmp_path: Path):
    assert defined_without_airflow("aws_default", {"AIRFLOW_HOME": str(tmp_path)}) is False


def test_the_default_sqlite_db_is_read_for_the_row(tmp_path: Path):
    _db(tmp_path / "airflow.db", "google_cloud_default")
    env = {"AIRFLOW_HOME": str(tmp_path)}
    assert defined_without_airflow("google_cloud_default", env) is True
    assert defined_without_airflow("aws_default", env) is False


def test_the_sqlite_file_airflow_cfg_names_is_read(tmp_path: Path):
    _db(tmp_path / "elsewhere.db", "aws_default")
    (tmp_path / "airflow.cfg").write_text(
        f"[database]\nsql_alchemy_conn = sqlite:///{tmp_path / 'elsewhere.db'}\n[secrets]\nbackend = \n"
    )
    assert defined_without_airflow("aws_default", {"AIRFLOW_HOME": str(tmp_path)}) is True


@pytest.mark.parametrize(
    "config",
    [
        "[secrets]\nbackend = airflow.secrets.local_filesystem.LocalFilesystemBackend\n",
        "[database]\nsql_alchemy_conn = postgresql://u@db/airflow\n",
        "[database]\nsql_alchemy_conn_cmd = cat /run/db-url\n",
    ],
    ids=["secrets backend", "postgres", "url from a command"],
)
def test_what_only_airflow_can_answer_is_left_to_it(tmp_path: Path, config: str):
    (tmp_path / "airflow.cfg").write_text(config)
    with pytest.raises(AskAirflow):
        defined_without_airflow("aws_default", {"AIRFLOW_HOME": str(tmp_path)})
    with pytest.raises(AskAirflow):  # the same set in the environment
        defined_without_airflow(
            "aws_default", {"AIRFLOW_HOME": str(tmp_path / "none"), "AIRFLOW__SECRETS__BACKEND": "x.Backend"}
        )


def test_a_db_that_is_not_airflows_is_left_to_airflow(tmp_path: Path):
    (tmp_path / "airflow.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(AskAirflow):
        defined_without_airflow("aws_default", {"AIRFLOW_HOME": str(tmp_path)})
