"""A managed job's secrets, read from the Airflow Variables that hold them (see operators.job_spec)."""

from __future__ import annotations

from airflow.sdk import Variable
from airflow.sdk.log import mask_secret

from airflow_sky.errors import SpecError
from airflow_sky.operators.job_spec import JobSpec


def read_secrets(spec: JobSpec) -> dict[str, str]:
    """The secrets' values from their Airflow Variables, registered with the masker as they are read."""
    values = {}
    for name, key in spec.secrets.items():
        value = Variable.get(key, default=None)
        if value is None:
            raise SpecError(
                f"secrets.{name}: the Airflow Variable {key} is gone (deleted, or the run was triggered without "
                "`airflow-sky jobs launch`, which creates it)"
            )
        mask_secret(value, name=name)
        values[name] = str(value)
    return values
