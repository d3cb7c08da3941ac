"""airflow-sky's `[sky]` settings, read one way wherever they are used: a DAG's task on a worker, the CLI's
launch engine and the CLI's checks before the engine starts. Airflow's configuration resolves them:
`AIRFLOW__SKY__<NAME>` (and its `_CMD` / `_SECRET` forms) first, then `[sky]` in the airflow.cfg of the
Airflow home in use: a deployment's, or the CLI's private one (`~/.airflow_sky/airflow/airflow.cfg`), to
which the CLI binds AIRFLOW_HOME before anything imports Airflow. Reading the environment alone (as the
CLI's checks once did) refused a setting that the launch itself would have used."""

from __future__ import annotations


def sky_setting(name: str) -> str | None:
    """`[sky] <name>`, stripped; None when unset or empty. Imports Airflow's configuration (about 2 s the
    first time in a process): callers on a fast path read it only when the answer matters."""
    from airflow.sdk import conf

    value = conf.get("sky", name, fallback=None)
    return value.strip() or None if isinstance(value, str) else None
