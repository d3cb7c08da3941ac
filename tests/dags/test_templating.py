"""Task fields are Airflow templates, rendered per run; secrets stay out of the task logs."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

SECRET = "s3cr3t-Value-9f2"


def test_envs_and_run_render_per_run_and_secrets_are_masked(run_dag, airflow_home, tmp_path):
    source = f"""
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(
    name="templated",
    num_nodes=2,
    envs={{"DAY": "{{{{ ds }}}}", "RUN": "{{{{ run_id }}}}", "LITERAL": "$HOME and ${{HOME}}", "PROBE": {str(tmp_path)!r}}},
    secrets={{"TOKEN": {SECRET!r}}},
    run='echo "day=$DAY token=$TOKEN literal=$LITERAL"; ARR=(a b c); echo "${{#ARR[@]}}" > "$PROBE/len-$SKYPILOT_NODE_RANK"; echo "{{{{ dag.dag_id }}}}" > "$PROBE/rendered-$SKYPILOT_NODE_RANK"; '
        'python3 -c "import json, os; json.dump({{k: os.environ[k] for k in (\\'DAY\\', \\'LITERAL\\', \\'TOKEN\\')}}, '
        'open(os.environ[\\'PROBE\\'] + \\'/env-\\' + os.environ[\\'SKYPILOT_NODE_RANK\\'], \\'w\\'))"',
)
with DAG("templated", schedule=None) as dag:
    sky_job(task, cluster_name="templated-c")
"""
    result = run_dag("templated", source)
    assert result.returncode == 0, result.digest
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env-{rank}").read_text())
        assert len(env["DAY"]) == 10 and env["DAY"][4] == "-"  # {{ ds }} -> YYYY-MM-DD
        assert env["LITERAL"] == "$HOME and ${HOME}"  # shell variables are not Jinja's
        assert env["TOKEN"] == SECRET  # the node gets the real value...
        assert (tmp_path / f"rendered-{rank}").read_text().strip() == "templated"
        assert (tmp_path / f"len-{rank}").read_text().strip() == "3"  # ${#ARR[@]} is bash's, not Jinja's
    assert "day=" in result.output
    assert SECRET not in result.output  # ...the logs never do
    # ...nor the rendered-template view of any task, mapped ones included.
    db = Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rendered = conn.execute(
            "SELECT task_id, map_index, rendered_fields FROM rendered_task_instance_fields WHERE dag_id = 'templated'"
        ).fetchall()
    assert {task_id.rsplit(".", 1)[-1] for task_id, _, _ in rendered} >= {
        "provision",
        "launch",
        "run_follow",
    }
    assert [row[:2] for row in rendered if SECRET in str(row[2])] == []
    # The view shows the rendered scripts and envs themselves (not the spec's repr), with the secret masked.
    launch = next(json.loads(row[2]) for row in rendered if row[0].endswith("launch"))
    assert '"templated" > "$PROBE/rendered-$SKYPILOT_NODE_RANK"' in launch["sky_task.run"]
    assert len(launch["sky_task.envs"]["DAY"]) == 10
    assert launch["sky_task.secrets"] == {"TOKEN": "***"}
