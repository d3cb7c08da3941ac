"""Managed jobs: one parametrized DAG, `airflow_sky_jobs`, that runs whatever task its run conf carries.

`airflow-sky jobs launch task.yaml` triggers it over the REST API of a running Airflow, which then is the
job's controller (as SkyPilot's jobs controller is): the job survives the laptop, recovers preempted nodes,
and `airflow-sky jobs queue/logs/cancel` follow it. Put it in the DAG folder of the deployment:

    # dags/airflow_sky_jobs.py
    from airflow_sky.dags.managed import managed_jobs_dag

    dag = managed_jobs_dag()

    begin ─▶ spec ─▶ [provision ─▶ sync[n] ─▶ setup_follow[n] ─▶ launch ─▶ run_follow[m] ─▶ collect ─▶ teardown] ─▶ forget_secrets
                                                                                                                 ├▶ remove_uploads
                                                                                                                 └▶ remove_leftovers

`spec` checks the conf (operators.job_spec) against the deployment's policy for the user who triggered the
run (task.conf_policy: `[sky] managed_infras`, `managed_cluster_names`, `managed_buckets`, `managed_ports`,
`managed_max_nodes`, `managed_instance_types`, `managed_accelerators`; no path on the worker ever), names
the job's own cluster when the conf names none (64 random bits) and hands the spec to every task of the job;
the job's node count, resources, infra and cluster come from it at run time (the per-node tasks map over the
provisioned nodes).
`forget_secrets` deletes the Variables that held the job's secrets, and `remove_uploads` the files `jobs
launch` put in the jobs bucket for the run (`<[sky] jobs_bucket>/<run id>/`), whatever the outcome;
`remove_leftovers` what follow tasks killed by `jobs cancel` wrote of a torn-down local cluster after its
teardown (operators.managed_leftovers).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from airflow_sky.dags.job import sky_job
from airflow_sky.gang.fleet import MANAGED_DAG_ID
from airflow_sky.operators.managed import (
    SkyForgetSecretsOperator,
    SkyJobSpecOperator,
    SkyRemoveUploadsOperator,
)
from airflow_sky.operators.managed_leftovers import SkyRemoveLeftoversOperator

JOB_GROUP = "job"  # the task group of the job's phases: job.provision, job.run_follow, ...


def slot_group(index: int) -> str:
    """The task group of pipeline slot `index` (0: `job`, then `job2`, `job3`, ...)."""
    return JOB_GROUP if index == 0 else f"{JOB_GROUP}{index + 1}"


def managed_jobs_dag(dag_id: str = MANAGED_DAG_ID, pipeline_slots: int = 1, **dag_kwargs: Any) -> DAG:
    """The managed jobs DAG. DAG kwargs pass through (e.g. `max_active_runs`, `tags`, `access_control`);
    `sky_job` options such as `deferrable` go in `job_kwargs`. It is created unpaused
    (`is_paused_upon_creation=False` unless given).

    :param pipeline_slots: the most tasks a pipeline may have: one job group per slot, chained (slot 2 runs
        when slot 1 succeeded); a run with fewer jobs skips the rest. 1 (the default) runs single tasks.
    """
    if pipeline_slots < 1:
        raise ValueError(f"pipeline_slots: must be >= 1, got {pipeline_slots}")
    job_kwargs = dag_kwargs.pop("job_kwargs", {})
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("max_active_runs", 64)
    # Created unpaused whatever `[core] dags_are_paused_at_creation` says (True by default): a paused
    # managed-jobs DAG leaves every submitted job PENDING. `jobs launch` refuses while it is paused.
    dag_kwargs.setdefault("is_paused_upon_creation", False)
    dag_kwargs.setdefault("tags", ["airflow-sky", "managed-jobs"])
    dag_kwargs.setdefault("doc_md", __doc__)
    with DAG(dag_id=dag_id, **dag_kwargs) as dag:
        # The setup of the secrets' teardown: an empty task that cannot fail (a teardown is skipped when its
        # setup failed, and a refused conf must not leave its secrets behind).
        begin = EmptyOperator(task_id="begin")
        previous: Any = begin
        spec_ids = [f"spec{'' if index == 0 else index + 1}" for index in range(pipeline_slots)]
        for index in range(pipeline_slots):
            spec = SkyJobSpecOperator(task_id=spec_ids[index], index=index)
            group = sky_job(spec.output, group_id=slot_group(index), down=True, **job_kwargs)
            previous >> spec >> group
            # The next job waits for this one's result (collect: fails when the job failed) and for its nodes
            # to be gone (terminated); the group's leaves alone hold only the latter.
            gid = slot_group(index)
            previous = [group.children[f"{gid}.collect"], group.children[f"{gid}.terminated"]]
        forget = SkyForgetSecretsOperator(task_id="forget_secrets")
        remove = SkyRemoveUploadsOperator(
            task_id="remove_uploads",
            aws_conn_id=job_kwargs.get("aws_conn_id"),
            gcp_conn_id=job_kwargs.get("gcp_conn_id"),
        )
        leftovers = SkyRemoveLeftoversOperator(task_id="remove_leftovers", spec_task_ids=spec_ids)
        for cleanup in (forget, remove, leftovers):
            previous >> cleanup
            cleanup.as_teardown(setups=begin)
    return dag
