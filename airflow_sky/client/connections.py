"""Whether the CLI's Airflow has a connection, answered without importing Airflow where the answer is sure.

A cluster search asks each cloud only when its connection is defined (client/cluster_search.py). Importing
Airflow to look costs seconds, and on a machine that never set a cloud up the answer is plain: no
`AIRFLOW_CONN_<ID>` variable, no secrets backend, and the Airflow DB (the private home's SQLite file) has no
such row. Anything else (another DB, a secrets backend, a file that cannot be read as expected) is left to
Airflow itself, which is then imported: a wrong "not defined" would hide a cluster.
"""

from __future__ import annotations

import configparser
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

_SQLITE_PREFIX = "sqlite:///"


class AskAirflow(Exception):
    """Only Airflow itself can tell (a secrets backend, another database, a file not read as expected)."""


def defined_without_airflow(conn_id: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether connection `conn_id` is defined, read from the environment, airflow.cfg and the SQLite DB;
    AskAirflow when those cannot settle it."""
    env = os.environ if environ is None else environ
    if env.get(f"AIRFLOW_CONN_{conn_id.upper()}"):
        return True
    if any(k.startswith(("AIRFLOW__SECRETS__", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")) for k in env):
        raise AskAirflow("a secrets backend or database set in the environment")
    home = Path(env.get("AIRFLOW_HOME") or "~/airflow").expanduser()
    database = _database_file(Path(env.get("AIRFLOW_CONFIG") or home / "airflow.cfg"), home)
    if not database.exists():
        return False  # no DB yet: Airflow would find the connection nowhere either
    return _has_row(database, conn_id)


def _database_file(config_file: Path, home: Path) -> Path:
    """The SQLite file airflow.cfg names (Airflow's default: airflow.db in the home)."""
    config = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        config.read(config_file, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError) as e:
        raise AskAirflow(f"{config_file}: {e}") from e
    if config.get("secrets", "backend", fallback="").strip():
        raise AskAirflow("a secrets backend in airflow.cfg")
    if any(config.has_option("database", k) for k in ("sql_alchemy_conn_cmd", "sql_alchemy_conn_secret")):
        raise AskAirflow("the database URL comes from a command or a secret")
    url = config.get("database", "sql_alchemy_conn", fallback="").strip()
    if not url:
        return home / "airflow.db"
    if not url.startswith(_SQLITE_PREFIX) or "?" in url:
        raise AskAirflow("a database other than a plain SQLite file")
    return Path(url.removeprefix(_SQLITE_PREFIX))


def _has_row(database: Path, conn_id: str) -> bool:
    try:
        db = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            return (
                db.execute("SELECT 1 FROM connection WHERE conn_id = ? LIMIT 1", (conn_id,)).fetchone()
                is not None
            )
        finally:
            db.close()
    except sqlite3.Error as e:  # locked, not migrated, not a DB: Airflow says what it makes of it
        raise AskAirflow(f"{database}: {e}") from e
