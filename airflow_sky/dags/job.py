"""Build a job's Airflow tasks: `sky_job(...)` returns a TaskGroup usable inside any DAG.

    provision (setup task) -> sync[n] -> setup_follow[n] -> launch -> run_follow[m] -> collect
        -> teardown (teardown task)

`n` is every node of the cluster, `m` the task's num_nodes (head first). Every arrow is a barrier. Each
node's sync task starts that node's setup once its files are there, and launch starts the run on every
node at once: every rank of a phase runs before any follow task waits, so a gang job (torchrun, Ray) never
waits on a worker slot, and the chain has no scheduler hop that no barrier needs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import TaskGroup, XComArg, conf

from airflow_sky.dags.results import register_sky_result
from airflow_sky.dags.task_path import resolve_task_path
from airflow_sky.errors import SpecError
from airflow_sky.gang.recovery import DEFAULT_MAX_RECOVERIES
from airflow_sky.hooks.cluster import task_buckets
from airflow_sky.infra.registry import check_connection
from airflow_sky.operators import (
    SkyCollectOperator,
    SkyFollowOperator,
    SkyLaunchOperator,
    SkyProvisionOperator,
    SkySyncOperator,
    SkyTeardownOperator,
)
from airflow_sky.operators.base import NODE_MAP_INDEX_TEMPLATE
from airflow_sky.operators.provision import PipelineSlot
from airflow_sky.task import Task
from airflow_sky.task.launch import Launch, LaunchOptions
from airflow_sky.task.pipeline import job_id_for
from airflow_sky.task.pool import check_pool_job, check_pool_name

# The deadline of every step that is not the user's own script (setup and run take setup_timeout and
# run_timeout). Generous: they cover a cloud's slow days, and only a hung step ever reaches them.
STEP_TIMEOUTS: dict[str, timedelta] = {
    "provision": timedelta(minutes=45),
    "sync": timedelta(minutes=60),
    "launch": timedelta(minutes=10),
    "collect": timedelta(minutes=60),
    "teardown": timedelta(minutes=30),
}


def sky_job(
    task: Task | str | os.PathLike[str] | XComArg | None = None,
    *,
    launch: Launch | None = None,
    cluster_name: str | None = None,
    infra: str | None = None,
    down: bool | None = None,
    group_id: str | None = None,
    conn_id: str | None = None,
    env_overrides: dict[str, str] | None = None,
    setup: bool | None = None,
    must_exist: bool | None = None,
    retry_until_up: bool | None = None,
    follow_run: bool | None = None,
    max_recoveries: int = DEFAULT_MAX_RECOVERIES,
    artifacts: Sequence[str] | None = None,
    artifacts_to: str | None = None,
    artifacts_from: str = "head",
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
    deferrable: bool | None = None,
    defer_after_s: float | None = None,
    trigger_min_wait_s: float | None = None,
    setup_timeout: timedelta | None = None,
    run_timeout: timedelta | None = None,
    pipeline: PipelineSlot | None = None,
    pool: str | None = None,
    outlets: Sequence[Any] | None = None,
    output_extra: dict[str, Any] | None = None,
    output_partition: str | None = None,
    sweep_plan_task: str | None = None,
) -> TaskGroup:
    """The tasks of one SkyPilot-style job, as a TaskGroup in the current DAG.

    :param task: a Task, or the path of a task YAML (a relative path is read against the directory of the
        DAG file that calls sky_job, else the working directory), or the XComArg of a task that returns a
        managed job's spec (dags.managed: the task, infra, cluster and down are then read at run time).
    :param launch: instead of the task and its options (cluster_name, infra, down, env_overrides, setup,
        must_exist, retry_until_up, follow_run, pipeline): a whole launch description (task.launch.Launch),
        as the engine hands one over; none of those keywords may be given with it.
    :param cluster_name: the cluster to launch or reuse; default: one per DAG run (`<dag>-<hash>`).
    :param infra: `local` (default), `ssh/<pool>`, `aws/<region>`, `gcp/<region>`; default: the task's
        `resources.infra`, else local.
    :param down: tear the cluster down when the job ends (also when it fails); default True.
    :param group_id: the TaskGroup id; default: the task's name (or `sky_job`).
    :param conn_id: the Airflow connection with the infra's credentials (not needed for local).
    :param setup: run the task's setup on every node (default True; False: like `sky exec` /
        `sky launch --no-setup`).
    :param must_exist: only use a cluster that is already up (never provision); default False.
    :param retry_until_up: when no region or zone has capacity, keep trying with backoff (the provision
        task then has no deadline) instead of failing; default False.
    :param follow_run: default True; False ends the group once every rank's run started (`--detach-run`):
        no run_follow, collect or teardown; the job keeps running on the kept cluster.
    :param aws_conn_id: the connection for `s3://` buckets (file_mounts and artifacts_to): named buckets are
        created and deleted with it; on aws the nodes get a session minted from it, scoped to the job's
        buckets (never its keys), unless the infra gives them an identity of their own; local and ssh nodes
        mint theirs from `sky_nodes_aws` (default `aws_default`).
    :param gcp_conn_id: the same for `gs://` buckets (default `google_cloud_default`).
    :param deferrable: the setup and run follow tasks wait in the triggerer while their node runs, holding
        no worker slot (default: `[operators] default_deferrable`).
    :param defer_after_s: a deferrable follow task follows in its worker this long before it defers
        (default 30 s), so a short phase never defers.
    :param trigger_min_wait_s: a trigger never fires sooner than this after it started (default 15 s):
        Airflow 3.3 can fail a task whose trigger fires before the scheduler processed the deferring
        attempt's exit. 0 only where no scheduler races (`airflow dags test` runs triggers inline).
    :param setup_timeout: the longest a rank's setup may take (default: no limit, as in SkyPilot); past it
        the follow task fails and the job fails fast.
    :param run_timeout: the same for a rank's run (recoveries included).
    :param pipeline: set by sky_pipeline: the job's place in a pipeline (SKYPILOT_TASK_IDS, its cluster).
    :param pool: run on a free worker of this pool (`airflow-sky jobs pool apply`; task.pool): the job waits
        PENDING in the pool's queue, then runs without provisioning or setup on the worker, which stays up.
        The task may have no setup, workdir or file_mounts (the workers have the pool's); cluster_name,
        down, setup and must_exist are the pool's business.
    :param outlets: Airflow assets (a checkpoint prefix, an artifact) that get an event when the job
        succeeds (its collect task), with the job and `output_extra` as the event's extra and
        `output_partition` as its partition key (sky_sweep: the trial).
    :param sweep_plan_task: set by sky_sweep: the task whose XCom says the sweep was cancelled.

    Every other step has a deadline of its own (STEP_TIMEOUTS): provisioning, syncing, starting, collecting
    and tearing down never wait forever.
    """
    # The keywords a launch description replaces, as job_launch takes them.
    described: dict[str, Any] = {
        "cluster_name": cluster_name,
        "infra": infra,
        "down": down,
        "env_overrides": env_overrides,
        "setup": setup,
        "must_exist": must_exist,
        "retry_until_up": retry_until_up,
        "follow_run": follow_run,
        "pipeline": pipeline,
    }
    given = sorted(name for name, value in {"task": task, **described}.items() if value is not None)
    if launch is not None and given:
        raise SpecError(
            f"sky_job: launch= already describes the task and its options; {', '.join(given)} "
            "cannot be given with it (pass either a launch or the task and its keywords)"
        )
    job: Task | XComArg
    if pool is not None:
        if launch is not None or cluster_name or down or must_exist is not None or setup is not None:
            raise SpecError(
                "sky_job: pool= runs the job on the pool's workers: give no launch=, cluster_name, down=True, "
                "setup or must_exist with it"
            )
        check_pool_name(pool)
        described.update(down=False, setup=False, must_exist=True)
    if launch is not None:
        job, options = launch.task, launch.options
    elif task is None:
        raise SpecError("sky_job: give the task (a Task, a task YAML's path, an XComArg) or launch=")
    else:
        job, options = job_launch(task, **described)
    if not options.follow and options.down:
        raise SpecError(
            "down=True needs follow_run=True: the cluster would be torn down under the running job"
        )
    if isinstance(job, XComArg):
        # A managed job (dags.managed): the task, infra, cluster and down come from the run's spec, checked
        # by the task that produced it; nothing about them is known when the DAG is parsed.
        if group_id is None:
            raise SpecError("group_id: a job whose task is resolved at run time needs a group_id")
    else:
        check_runnable(job)
        if pool is not None:
            check_pool_job(job, f"sky_job(pool={pool!r})")
        if "{{" not in options.infra:
            check_connection(options.infra, conn_id)  # fails when the DAG is parsed, not mid-run
            task_buckets(job, options.infra)  # so do unsupported bucket mounts
        group_id = group_id or job_id_for(job.name or "sky_job")
    setup, follow_run, down = options.setup, options.follow, options.down
    common: dict[str, Any] = {"sky_task": job, "conn_id": conn_id}
    follow_options: dict[str, Any] = {} if deferrable is None else {"deferrable": deferrable}
    if defer_after_s is not None:
        follow_options["defer_after_s"] = defer_after_s
    if trigger_min_wait_s is not None:
        follow_options["trigger_min_wait_s"] = trigger_min_wait_s

    with TaskGroup(group_id=group_id) as group:
        if group.dag is not None:
            register_sky_result(group.dag)
        provision = SkyProvisionOperator(
            task_id="provision",
            cluster_name=options.cluster_name or None,  # "": one per DAG run, named by provision
            infra=options.infra,
            down=down,
            must_exist=options.must_exist,
            retry_until_up=options.retry_until_up,
            pipeline=pipeline_slot(options),
            aws_conn_id=aws_conn_id,
            gcp_conn_id=gcp_conn_id,
            sky_pool=pool,
            sweep_plan_task=sweep_plan_task,
            # An exec provisions nothing; it may wait in the cluster's job queue as long as the jobs before
            # it run (a launch onto a busy cluster waits within provision's deadline).
            execution_timeout=None
            if options.retry_until_up or options.must_exist
            else STEP_TIMEOUTS["provision"],
            **common,
        )
        cluster = provision.output["handle"]  # type: ignore[index]  # a PlainXComArg of another XCom key
        every_node = provision.output

        def per_node(operator: type[Any], task_id: str, nodes: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("execution_timeout", STEP_TIMEOUTS.get(task_id))
            return operator.partial(
                task_id=task_id,
                cluster=cluster,
                map_index_template=NODE_MAP_INDEX_TEMPLATE,
                **common,
                **kwargs,
            ).expand(node=nodes)

        sync = per_node(
            SkySyncOperator,
            "sync",
            every_node,
            start_setup=setup,
        )
        start = SkyLaunchOperator(
            task_id="launch", cluster=cluster, execution_timeout=STEP_TIMEOUTS["launch"], **common
        )
        if setup:
            setup_follow = per_node(
                SkyFollowOperator,
                "setup_follow",
                every_node,
                phase="setup",
                execution_timeout=setup_timeout,
                **follow_options,
            )
            provision >> sync >> setup_follow >> start
        else:
            provision >> sync >> start
        if not follow_run:
            return group
        run_follow = per_node(
            SkyFollowOperator,
            "run_follow",
            start.output,
            phase="run",
            max_recoveries=max_recoveries,
            execution_timeout=run_timeout,
            **follow_options,
        )
        collect = SkyCollectOperator(
            task_id="collect",
            cluster=cluster,
            run_follow_task_id=f"{group.group_id}.run_follow",  # (prefixed inside an outer group)
            artifacts=artifacts,
            artifacts_to=artifacts_to,
            artifacts_from=artifacts_from,
            aws_conn_id=aws_conn_id,
            gcp_conn_id=gcp_conn_id,
            outlets=list(outlets or []),
            output_extra=output_extra,
            output_partition=output_partition,
            execution_timeout=STEP_TIMEOUTS["collect"],
            **common,
        )
        teardown = SkyTeardownOperator(
            task_id="teardown",
            cluster=cluster,
            down=down,
            execution_timeout=STEP_TIMEOUTS["teardown"],
            **common,
        )
        start >> run_follow >> collect >> teardown
        teardown.as_teardown(setups=provision)
        if down:
            # A teardown that cannot terminate must fail the run: nodes left running must not look like a
            # success. Not on_failure_fail_dagrun: it makes the teardown the run's only leaf, so a failed
            # job followed by a clean teardown would count as a successful run. A plain leaf after the
            # teardown fails the run when it does not succeed, and leaves collect a leaf of its own.
            teardown >> EmptyOperator(task_id="terminated")
    return group


def job_launch(
    task: Task | str | os.PathLike[str] | XComArg,
    *,
    cluster_name: str | None,
    infra: str | None,
    down: bool | None,
    env_overrides: dict[str, str] | None,
    setup: bool | None,
    must_exist: bool | None,
    retry_until_up: bool | None,
    follow_run: bool | None,
    pipeline: PipelineSlot | None,
) -> tuple[Task | XComArg, LaunchOptions]:
    """sky_job's keywords as a launch description (the one place that turns them into one): the task
    (read from its YAML, with the overrides, on a copy) and its LaunchOptions. A cluster name of "" is one
    per DAG run (provision names it); a managed job's task stays an XComArg, resolved at run time."""
    if isinstance(task, XComArg):
        job: Task | XComArg = task
        infra = infra or "local"
    else:
        if not isinstance(task, Task):
            job = Task.from_yaml(resolve_task_path(task), env_overrides=env_overrides)
        else:  # the overrides go to a copy: the caller's Task stays as it was
            job = task.with_envs(env_overrides) if env_overrides else task
        infra = infra or job.resources.infra or "local"
    options = LaunchOptions(
        cluster_name=cluster_name or "",
        infra=infra,
        down=True if down is None else down,
        setup=True if setup is None else setup,
        must_exist=bool(must_exist),
        retry_until_up=bool(retry_until_up),
        follow=True if follow_run is None else follow_run,
    )
    if pipeline is not None:
        options = dataclasses.replace(
            options,
            pipeline_name=pipeline.name,
            pipeline_index=pipeline.index,
            pipeline_task_names=pipeline.task_names,
            pipeline_task_ids=pipeline.task_ids,
        )
    return job, options


def pipeline_slot(options: LaunchOptions) -> PipelineSlot | None:
    """The job's place in a pipeline, as the provision operator takes it."""
    if options.pipeline_name is None:
        return None
    return PipelineSlot(
        options.pipeline_name, options.pipeline_index, options.pipeline_task_names, options.pipeline_task_ids
    )


def check_runnable(task: Task) -> None:
    """Refuse, when the DAG is parsed, a job that Airflow's limits would stop mid-run.

    Every per-node phase is one mapped task with an instance per node, and Airflow fails a mapped task
    whose list is longer than `[core] max_map_length`. The other limits (parallelism,
    max_active_tasks_per_dag, pool slots) only slow a job down: every rank is started by quick tasks before
    any follow task waits, so the ranks never wait on a worker slot for each other.
    """
    limit = conf.getint("core", "max_map_length", fallback=1024)
    if task.num_nodes > limit:
        raise SpecError(
            f"num_nodes: {task.num_nodes} nodes need {task.num_nodes} mapped task instances per phase, more "
            f"than Airflow's [core] max_map_length ({limit}) allows; raise it (AIRFLOW__CORE__MAX_MAP_LENGTH) "
            "on every Airflow component, or use fewer nodes"
        )


def job_result(group: TaskGroup) -> Any:
    """The job's result for downstream tasks: the head's return.json (XCom of the group's collect task).

    `job_result(group)` is an XComArg; pass it to a @task, or pull `ranks` / `artifacts` keys from collect.
    """
    return group.children[f"{group.group_id}.collect"].output  # type: ignore[attr-defined]
