"""Scheduled 2-node minGPT DDP training (torchrun, CPU/gloo or GPU/nccl) on airflow-sky's local cluster.

Copy this file into your dags folder. Point MINGPT_TASK_YAML at the task YAML (default: the repository's
examples/mingpt/train.yaml next to this file); set MINGPT_INFRA to run on another infra (e.g. aws/us-east-1).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_sky import sky_job

TASK_YAML = os.environ.get(
    "MINGPT_TASK_YAML", str(Path(__file__).resolve().parent.parent / "examples" / "mingpt" / "train.yaml")
)

with DAG(
    dag_id="mingpt_ddp",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["airflow-sky", "training"],
    doc_md=__doc__,
) as dag:
    # One cluster per run (named after the DAG and run), torn down when the run ends, failed or not.
    sky_job(TASK_YAML, infra=os.environ.get("MINGPT_INFRA", "local"), down=True)
