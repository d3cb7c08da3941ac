"""The two tasks around a managed job: reading its spec from the run conf, and forgetting its secrets."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Variable
from airflow.sdk.log import mask_secret

from airflow_sky.errors import SpecError
from airflow_sky.operators.job_spec import SECRET_VARIABLE_PREFIX, JobSpec


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


class SkyJobSpecOperator(BaseOperator):
    """Checks the run conf of a managed job (see operators.job_spec) and returns it as the job's spec; every
    task of the job reads the spec from this task's XCom. A bad conf fails here, before any node exists."""

    ui_color = "#e8eaf6"

    def execute(self, context: Any) -> dict[str, Any]:
        conf = context["dag_run"].conf or {}
        spec = JobSpec.from_conf(conf)
        task = spec.load_task(read_secrets(spec))
        self.log.info(
            "Job %s: %d node(s) on %s, cluster %s (%s)",
            task.name or "(unnamed)",
            task.num_nodes,
            spec.infra,
            spec.cluster_name or "one for this run",
            "torn down at the end" if spec.down else "kept",
        )
        return spec.to_conf()


class SkyForgetSecretsOperator(BaseOperator):
    """Deletes the Airflow Variables that held a managed job's secrets, once the job ended (a teardown task:
    it runs whatever the job's outcome, and when the run is cancelled). Reads the run conf itself, so that
    it cleans up after a conf the spec task refused, too."""

    ui_color = "#e8eaf6"

    def execute(self, context: Any) -> None:
        conf = context["dag_run"].conf or {}
        secrets = conf.get("secrets") if isinstance(conf, dict) else None
        keys = [
            key
            for key in (secrets.values() if isinstance(secrets, dict) else ())
            if isinstance(key, str) and key.startswith(SECRET_VARIABLE_PREFIX)
        ]
        for key in keys:
            Variable.delete(key)
        self.log.info("Deleted the Variables of %d secret(s)", len(keys))
