"""A training pipeline: prepare -> 2-node minGPT DDP (airflow-sky) -> evaluate, daily.

The training job's head writes return.json (final loss) and keeps its snapshot; collect streams the
snapshot to MINGPT_ARTIFACTS_TO (a local directory by default; s3://bucket/prefix or gs://bucket/prefix
with the aws/gcp extras and connections), and evaluate reads both from XCom. The follow tasks are
deferrable: while the ranks train they wait in the triggerer (run one, e.g. `airflow triggerer`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

from airflow_sky import job_result, sky_job

TASK_YAML = os.environ.get(
    "MINGPT_TASK_YAML", str(Path(__file__).resolve().parent.parent / "examples" / "mingpt" / "train.yaml")
)
ARTIFACTS_TO = os.environ.get("MINGPT_ARTIFACTS_TO", "~/.airflow_sky/artifacts/mingpt/{{ ds }}/")

with DAG(
    dag_id="mingpt_pipeline",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["airflow-sky", "training", "pipeline"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare(ds: str | None = None) -> str:
        """Stand-in for data preparation: the corpus ships with the example."""
        return f"corpus for {ds}"

    training = sky_job(
        TASK_YAML,
        infra=os.environ.get("MINGPT_INFRA", "local"),
        down=True,
        deferrable=True,  # the ranks wait in the triggerer while they train: no worker slot held
        artifacts=["~/sky_workdir/gpt_snapshot.pt"],
        artifacts_to=ARTIFACTS_TO,
    )

    @task
    def evaluate(result: dict | None, ti=None) -> dict:  # type: ignore[no-untyped-def]
        uploaded = ti.xcom_pull(task_ids=f"{training.group_id}.collect", key="artifacts") or {}
        snapshot = uploaded.get("~/sky_workdir/gpt_snapshot.pt")
        if not result or snapshot is None:
            raise ValueError(
                f"training left no result or snapshot: result={result!r}, artifacts={uploaded!r}"
            )
        print(f"final loss {result['final_loss']:.4f} after {result['steps']} steps; snapshot at {snapshot}")
        return {"final_loss": result["final_loss"], "snapshot": snapshot}

    prepare() >> training
    evaluate(job_result(training))
