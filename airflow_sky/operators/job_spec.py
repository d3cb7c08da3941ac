"""A managed job's spec: the run conf of the `airflow_sky_jobs` DAG, checked, and the task it describes.

`airflow-sky jobs launch` (and `airflow_sky.jobs.launch`) validates the task locally and triggers the DAG
with a conf of this shape:

    {"task": {...},                 # the task mapping (Task.to_dict()), without its secrets' values
     "secrets": ["NAME", ...],      # held in the Airflow Variables airflow_sky_secret__<owner>__NAME
     "infra": "local", "cluster_name": null, "down": true,
     "uploads": null,                # or the run's prefix in the jobs bucket, which the run's end removes
     "pool": null}                   # or the pool whose free worker runs the job (task.pool)

A multi-task pipeline is `{"pipeline": "<name>", "jobs": [<one conf as above per task>, ...]}`, run in
order, one job after the other (each its own cluster), in one run of a DAG with enough pipeline slots.

Secret values never sit in the conf (a DAG run's conf is stored and shown in clear): they live in Airflow
Variables, Airflow's own store for secrets (encrypted with the deployment's Fernet key, masked in the API and
in task logs by their name), and the DAG's last task deletes them. A job's Variables are named by its
`owner`: a hash of the DAG id, the run id and the job's slot in the run (secret_owner), so that no run id,
however crafted, names the Variables of another run's job (a run id is chosen by whoever triggers the run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.gang.job import sanitize_cluster_name
from airflow_sky.task import Task, is_bucket_uri
from airflow_sky.task.conf_policy import ConfPolicy, check_no_worker_paths, check_run_conf, secret_references
from airflow_sky.task.diagnostics import known_fields
from airflow_sky.task.pool import check_pool_name

SECRET_VARIABLE_PREFIX = "airflow_sky_secret__"  # "secret" in the name: Airflow masks the value everywhere
_CONF_FIELDS = ("task", "secrets", "infra", "cluster_name", "down", "uploads", "pool")
SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_OWNER = re.compile(r"^[0-9a-f]{32}\Z")


def job_confs(conf: Any, source: str = "the run conf") -> list[Any]:
    """The conf of each job of a run conf: one, or a pipeline's in order."""
    if isinstance(conf, Mapping) and ("jobs" in conf or "pipeline" in conf):
        unknown = sorted(set(conf) - {"pipeline", "jobs"})
        jobs = conf.get("jobs")
        if unknown or not isinstance(jobs, list) or not jobs:
            raise SpecError(
                f"{source}: a pipeline is {{pipeline: <name>, jobs: [<job>, ...]}} with at least one job"
            )
        return jobs
    return [conf]


def _secret_keys(secrets: Any, owner: str | None, source: str) -> dict[str, str]:
    """Secret name -> its Variable: derived from the run (a conf can name no other run's Variable)."""
    if owner is not None:
        if secrets is None:
            return {}
        if not isinstance(secrets, list) or not all(
            isinstance(n, str) and SECRET_NAME.match(n) for n in secrets
        ):
            raise SpecError(
                f"{source}: secrets: must list the secrets' names (their values are in Airflow Variables "
                f"{SECRET_VARIABLE_PREFIX}<owner>__<NAME>, never in a conf)"
            )
        return {name: secret_variable_key(owner, name) for name in secrets}
    if not isinstance(secrets, Mapping) or not all(
        isinstance(k, str)
        and SECRET_NAME.match(k)
        and isinstance(v, str)
        and v.startswith(SECRET_VARIABLE_PREFIX)
        for k, v in secrets.items()
    ):
        raise SpecError(f"{source}: secrets: must map each secret's name to its Airflow Variable")
    return dict(secrets)


def secret_owner(dag_id: str, run_id: str, index: int = 0) -> str:
    """Whose Variables the secrets of job `index` (0: the job, or a pipeline's first) of run `run_id` of DAG
    `dag_id` are in: 32 hex digits of the SHA-256 of the three as JSON, which spells any two strings apart.
    (Joined as text, run `R` job 2 and a run named `R-2` were one owner; so were DAGs sharing a run id.)"""
    return hashlib.sha256(json.dumps([dag_id, run_id, index]).encode()).hexdigest()[:32]


def secret_variable_key(owner: str, name: str) -> str:
    """The Airflow Variable that holds secret `name` of the job `owner` (secret_owner): of fixed length up to
    the name, so no (owner, name) pair spells another's key."""
    if not _OWNER.match(owner) or not SECRET_NAME.match(name):
        raise ValueError(f"secret_variable_key: {owner!r}, {name!r}: an owner is a secret_owner() hash")
    return f"{SECRET_VARIABLE_PREFIX}{owner}__{name}"


@dataclasses.dataclass(frozen=True)
class JobSpec:
    task: dict[str, Any]  # the task mapping, secrets without values
    secrets: dict[str, str]  # secret name -> Airflow Variable key
    infra: str = "local"
    cluster_name: str | None = None
    down: bool = True
    # `<jobs bucket>/<run id>`: where `jobs launch` uploaded the task's workdir and local file_mounts (the
    # task copies them from there); the run's end removes it (task.jobs_bucket.checked_uploads_uri).
    uploads: str | None = None
    pool: str | None = None  # run on a free worker of this pool (no provisioning, no setup; kept after)

    def to_conf(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_conf(
        cls,
        conf: Any,
        source: str = "the run conf",
        owner: str | None = None,
    ) -> JobSpec:
        """Check a run conf field by field; a bad one raises SpecError naming the field.

        A conf never names a path on the worker (task.conf_policy); what the deployment's policy allows is
        checked by `check_policy`, on the task with its secrets' values.

        In a run conf, `secrets` lists the secrets' names and `owner` (secret_owner of the DAG, the run and
        the job's slot) gives their Variables; a spec handed on by the spec task maps each name to its
        Variable already (`owner` None).
        """
        conf = known_fields(conf, _CONF_FIELDS, source, f"a mapping with {', '.join(_CONF_FIELDS)}")
        task = conf.get("task")
        if not isinstance(task, Mapping):
            raise SpecError(f"{source}: task: must be a task mapping (what `Task.to_dict()` gives)")
        secrets = _secret_keys(conf.get("secrets"), owner, source)
        infra = conf.get("infra") or "local"
        cluster_name = conf.get("cluster_name")
        down = conf.get("down", True)
        if not isinstance(infra, str):
            raise SpecError(f"{source}: infra: must be a string such as local, ssh/<pool>, aws/<region>")
        if cluster_name is not None and not isinstance(cluster_name, str):
            raise SpecError(f"{source}: cluster_name: must be a string or null")
        if cluster_name:
            # A conf may come from the UI or the REST API, where the CLI's normalization
            # (client.cluster_names) never ran: the name the cluster gets, once, here at the door.
            cluster_name = sanitize_cluster_name(cluster_name)
        if not isinstance(down, bool):
            raise SpecError(f"{source}: down: must be true or false")
        uploads = conf.get("uploads")
        if uploads is not None and not (isinstance(uploads, str) and is_bucket_uri(uploads)):
            raise SpecError(f"{source}: uploads: must be the bucket URI of the run's uploaded files, or null")
        pool = conf.get("pool")
        if pool is not None:
            if cluster_name:
                raise SpecError(
                    f"{source}: pool: a pool's job runs on the pool's workers; give no cluster_name"
                )
            try:
                pool = check_pool_name(pool)
            except SpecError as e:
                raise SpecError(f"{source}: pool: {e}") from None
            down = False  # a pool's worker stays up for the pool's next job
        # Before the task is parsed: no question about worker paths.
        check_no_worker_paths(task, source, secrets)
        spec = cls(dict(task), secrets, infra, cluster_name, down, uploads, pool)
        if not (secret_references(task, secrets) & _strings(task.get("workdir"), task.get("file_mounts"))):
            # The task itself is valid. (One whose workdir or a source is a whole secret is checked once the
            # run has the secrets' values: an empty value would make a valid task look broken.)
            spec.load_task({name: "" for name in secrets})
        return spec

    def check_policy(
        self,
        policy: ConfPolicy,
        task: Task,
        source: str = "the run conf",
        user: str | None = None,
        user_known: bool = True,
    ) -> None:
        """Refuse (SpecError naming the field) an infra, cluster, resource or bucket the deployment's `policy`
        does not allow to a run triggered by `user` (not `user_known`: task.conf_policy.check_run_conf).
        `task`: this spec's task with its secrets' values (load_task), as its nodes will get it: a bucket URI
        may hold a secret (`s3://team${SUFFIX}`), and the policy judges what is mounted."""
        # What a whole secret reference stood for is known now: a secret's value is no way to a worker path.
        check_no_worker_paths(task.to_dict(), source)
        check_run_conf(
            policy, task, self.infra, self.cluster_name, self.uploads, source, user, user_known, self.pool
        )

    def to_run_conf(self) -> dict[str, Any]:
        """The run conf's form: the secrets' names only (their Variables follow from the run id); `uploads`
        and `pool` only when given (a deployment from before them refuses the fields)."""
        conf = {**self.to_conf(), "secrets": sorted(self.secrets)}
        for optional in ("uploads", "pool"):
            if conf[optional] is None:
                del conf[optional]
        return conf

    def load_task(self, secret_values: Mapping[str, str]) -> Task:
        """The Task, its secrets filled in from `secret_values` (name -> value)."""
        missing = sorted(set(self.secrets) - set(secret_values))
        if missing:
            raise SpecError(f"secrets: no value for {', '.join(missing)}")
        mapping = dict(self.task)
        mapping["secrets"] = {**(mapping.get("secrets") or {}), **{k: secret_values[k] for k in self.secrets}}
        return Task.from_dict(mapping, source="the managed job's task")


def _strings(*values: Any) -> set[str]:
    """Every string in `values` (nested lists and mappings' values): what a whole secret reference may be."""
    found: set[str] = set()
    for value in values:
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, Mapping):
            found |= _strings(*value.values())
        elif isinstance(value, list):
            found |= _strings(*value)
    return found
