"""Managed jobs from Python, as `sky.jobs`: `airflow_sky.jobs.launch(task)` submits a task to a deployed Airflow
(the `airflow_sky_jobs` DAG, through its REST API), and `queue`, `job`, `logs`, `cancel` follow and steer it.

    import airflow_sky
    from airflow_sky import jobs

    job_id = jobs.launch(airflow_sky.Task.from_yaml("train.yaml"), secrets={"WANDB_API_KEY": key})
    jobs.logs(job_id)                 # every rank's lines until the job ends
    print(jobs.job(job_id).status)    # SUCCEEDED

Where the API is and how to log in: airflow_sky.client.airflow_api (environment, ~/.airflow_sky/config.yaml,
or airflowctl's configuration).
"""

from __future__ import annotations

from airflow_sky.client.airflow_api import AirflowApi, ApiConfig, ApiError, api_config
from airflow_sky.client.managed_jobs import ManagedJob, cancel, job, launch, logs, queue

__all__ = [
    "AirflowApi",
    "ApiConfig",
    "ApiError",
    "ManagedJob",
    "api_config",
    "cancel",
    "job",
    "launch",
    "logs",
    "queue",
]
