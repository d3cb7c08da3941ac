"""How many of a task's instances failed, asked from inside a trigger.

The Task SDK has no public call for it in a trigger: `airflow.sdk.TaskInstance` is only a typing Protocol,
and a trigger gets no running task instance (an operator asks `context["ti"].get_ti_count`). Airflow's own
triggers (the standard provider's external_task) call the same private class, RuntimeTaskInstance, whose
static methods ask the triggerer's supervisor over its comms channel. The private import lives here alone:
one place to change when Airflow makes it public or moves it.
"""

from __future__ import annotations


def failed_count(dag_id: str, task_id: str, run_id: str) -> int:
    """The number of failed instances (every map index) of `task_id` in the run."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    return RuntimeTaskInstance.get_ti_count(
        dag_id=dag_id, task_ids=[task_id], run_ids=[run_id], states=["failed"]
    )
