"""Pools (SkyPilot `docs/source/examples/pools.rst`): warm workers, set up once, that run jobs one at a time.

A pool file is a task file with a `pool:` section and no `run`:

    pool:
      workers: 2          # each worker is a cluster of the task's num_nodes
    resources: {...}
    workdir: .
    file_mounts: {...}
    setup: pip install -r requirements.txt

A job for a pool names only its `run`, `envs`/`secrets`, `num_nodes` and `resources`: its workers' setup,
workdir and file mounts are the pool's, so every job on a worker finds the same environment. Each job of a
submission of N gets SKYPILOT_JOB_RANK (0..N-1) and SKYPILOT_NUM_JOBS (N). Pure rules; nothing runs here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_sky.errors import SpecError

if TYPE_CHECKING:  # (task.task reads pool sections with parse_pool)
    from airflow_sky.task.task import Task

_FIELDS = ("workers",)
POOL_NAME = re.compile(r"^[a-z][a-z0-9-]{0,29}\Z")  # a worker is `<pool>-<i>`: a cluster name (<= 40)
POOL_TASK_INFO_KEY = "pool_task"  # a pool job's state: the pool's task, for a replacement node's setup
JOB_RANK_ENV = "SKYPILOT_JOB_RANK"
NUM_JOBS_ENV = "SKYPILOT_NUM_JOBS"
MAX_WORKERS = 256


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    workers: int


def parse_pool(value: Any, source: str = "pool") -> PoolSpec | None:
    """The `pool:` section as written (None: not a pool file); a wrong one raises SpecError naming the field."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{source}: must be a mapping, e.g. {{workers: 2}}")
    unknown = sorted(str(key) for key in value if key not in _FIELDS)
    if unknown:
        raise SpecError(
            f"{source}: unknown field {unknown[0]!r}; a pool here has a fixed size: {{workers: N}} "
            "(autoscaling pools are not supported)"
        )
    workers = value.get("workers")
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise SpecError(
            f"{source}.workers: required, a whole number from 1 to {MAX_WORKERS}, got {workers!r}"
        )
    return PoolSpec(workers)


def check_pool_name(name: str) -> str:
    """A pool's name: lowercase letters, digits and '-', starting with a letter, at most 30 characters."""
    if not isinstance(name, str) or not POOL_NAME.match(name):
        raise SpecError(
            f"pool name {name!r} is invalid: lowercase letters, digits and '-', starting with a letter, "
            "at most 30 characters (its workers are clusters named <pool>-<i>)"
        )
    return name


def worker_cluster_name(pool: str, index: int) -> str:
    """The cluster of worker `index` of `pool`."""
    return f"{check_pool_name(pool)}-{index}"


def pool_task(task: Task, source: str) -> tuple[Task, PoolSpec]:
    """A pool file's task and its spec; refuses a task that is not one (no `pool:`, or a `run`)."""
    spec = parse_pool(task.extra_fields.get("pool"), f"{source}: pool")
    if spec is None:
        raise SpecError(f"{source}: not a pool file: add a `pool: {{workers: N}}` section")
    if task.run is not None:
        raise SpecError(
            f"{source}: run: a pool file may not have a run section (the workers only provision and set "
            "up); submit the job with `airflow-sky jobs launch --pool <pool> job.yaml`"
        )
    return task, spec


def check_pool_job(task: Task, source: str) -> None:
    """Refuse what a job for a pool may not have: its workers' environment is the pool's (SkyPilot's rule)."""
    given = [
        field
        for field, value in (
            ("setup", task.setup),
            ("workdir", task.workdir),
            ("file_mounts", task.file_mounts),
            ("pool", task.extra_fields.get("pool")),
        )
        if value
    ]
    if given:
        raise SpecError(
            f"{source}: {', '.join(given)}: a job for a pool may not have {' or '.join(given)}; the pool's "
            "workers were set up from the pool file (put them there and `jobs pool apply` again)"
        )
    if task.run is None:
        raise SpecError(f"{source}: run: a job for a pool needs a run section")


def job_rank_envs(rank: int, num_jobs: int) -> dict[str, str]:
    """SKYPILOT_JOB_RANK / SKYPILOT_NUM_JOBS of job `rank` of a submission of `num_jobs`."""
    if not 0 <= rank < num_jobs:
        raise ValueError(f"job rank {rank} is not in 0..{num_jobs - 1}")
    return {JOB_RANK_ENV: str(rank), NUM_JOBS_ENV: str(num_jobs)}


def pool_task_record(task: Task) -> dict[str, Any]:
    """What the pool's record keeps of its task: everything but its secrets' values (their names only), so
    the record can live in the infra's store; a secret that `$VAR` put into a URL stays a reference."""
    mapping = task.to_dict(secret_references=True)
    secrets = sorted(mapping.pop("secrets", None) or {})
    return {**mapping, "secret_names": secrets} if secrets else mapping


def worker_setup_task(job: Task, pool_record_task: Mapping[str, Any]) -> Task:
    """A pool job's task as a replacement node of its worker needs it: the pool's workdir, file mounts and
    setup with the job's run, envs and secrets (the pool's own secrets are not kept: a setup that needs one
    finds it unset). A replacement node runs this setup before the job's next generation starts there."""
    from airflow_sky.task.task import Task

    mapping = {
        k: v for k, v in pool_record_task.items() if k not in ("pool", "secret_names", "secrets", "run")
    }
    mapping["envs"] = {**(mapping.get("envs") or {}), **job.envs} or None
    mapping["num_nodes"] = job.num_nodes
    mapping["resources"] = job.resources.to_dict() or None
    merged = Task.from_dict({k: v for k, v in mapping.items() if v is not None}, source="the pool's task")
    merged.run = job.run
    return merged.update_secrets(job.secrets)
