"""The DAG being defined: the one whose `with DAG(...)` block is running.

The Task SDK has no public accessor for it (`airflow.sdk` exports none; TaskGroup and BaseOperator find
their DAG through this same internal context manager), so the private import lives here alone: one place
to change when Airflow moves it.
"""

from __future__ import annotations

from airflow.sdk import DAG
from airflow.sdk.definitions._internal.contextmanager import DagContext


def current_dag() -> DAG | None:
    """The DAG of the enclosing `with DAG(...)` block, or None outside one."""
    return DagContext.get_current()
