"""What a job hands over as XCom: masked like its logs, and bounded (XComs are rows of the Airflow DB)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from airflow_sky.gang.phases import MAX_RESULT_BYTES
from airflow_sky.infra.local import daemon

SECRET = "res-s3cr3t-71c"


def test_a_secret_in_a_result_is_masked_and_a_result_over_the_limit_fails_clearly(run_dag, airflow_home):
    # Rank 0 echoes the secret into its result; rank 1 writes 50 MB of JSON.
    run = (
        'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then '
        'printf \'{"token": "%s", "nested": ["%s"]}\' "$TOKEN" "$TOKEN" > "$AIRFLOW_SKY_XCOM_DIR/return.json"; '
        "else python3 -c \"import json, os; json.dump(['x' * 1000] * 50000, "
        "open(os.environ['AIRFLOW_SKY_XCOM_DIR'] + '/return.json', 'w'))\"; fi"
    )
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(name="results", num_nodes=2, secrets={{"TOKEN": {SECRET!r}}}, run={run!r})
with DAG("results", schedule=None) as dag:
    sky_job(task, cluster_name="results-c")
"""
    result = run_dag("results", source)
    assert result.returncode != 0, result.digest
    assert "return.json is 50" in result.output and f"at most {MAX_RESULT_BYTES} bytes" in result.output
    db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT task_id, map_index, length(value), value FROM xcom WHERE dag_id = 'results' AND key = 'return_value'"
        ).fetchall()
    assert max(size or 0 for _, _, size, _ in rows) < MAX_RESULT_BYTES
    results = {index: value for task_id, index, _, value in rows if task_id.endswith("run_follow")}
    assert SECRET not in str(rows)
    assert '"token": "***"' in str(results.get(0)), rows
    assert daemon.processes_with_marker("results-c") == []
