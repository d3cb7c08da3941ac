"""What a managed job's run conf may ask of a shared deployment, as pure rules.

Whoever may trigger the managed jobs DAG (the UI, the REST API, `airflow-sky jobs launch`) writes its run
conf; the deployment's workers act on it with their own files and credentials. So the conf is checked
against the deployment's policy, from the `[sky]` section of the Airflow config; unset, each setting is the
safe default:

    managed_infras          infras a run may use: names or globs (`aws`, `aws/us-*`, `ssh/gpu-pool`);
                            default: every infra except `local`, which only a literal `local` allows
    managed_cluster_names   shared cluster names (globs) every user may name; default: none. A run names a
                            cluster of its triggering user's namespace (`<user>--*`: task.cluster_namespace)
                            or one of these; a run without a name gets its own (64 random bits)
    managed_pools           pools (globs) a run may send its job to (`jobs launch --pool`); default: none
    managed_buckets         the buckets (or `bucket/prefix`es) a task may mount, `*` for any; default: none
                            but the run's own uploads in the jobs bucket
    managed_ports           ports and ranges (`8888, 6006-6010`) a task may open, `*` for any; default: none
    managed_max_nodes       the most nodes a task may have; default 16
    managed_instance_types  instance types a task may ask for (globs: `g5.*, n2-standard-*`); default: any
    managed_accelerators    accelerators a task may ask for (globs on the name: `T4, L4, A10G`); default: any

and, whatever the policy, a conf names no path on the worker: no local workdir, no local file_mounts
source, no local git URL, no GIT_SSH_KEY_PATH (each would be read by the worker and sent to a node).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.task.cluster_namespace import SEPARATOR, in_namespace, user_namespace
from airflow_sky.task.mounts import is_bucket_uri
from airflow_sky.task.resource_policy import (
    check_resources,
    parse_max_nodes,
    parse_ports_setting,
    setting_name,
)
from airflow_sky.task.storage import BucketMount, bucket_mounts, default_store, parse_bucket_uri
from airflow_sky.task.task import Task

LOCAL = "local"
ANY = "*"
SETTINGS = (
    "managed_infras",
    "managed_cluster_names",
    "managed_pools",
    "managed_buckets",
    "managed_ports",
    "managed_max_nodes",
    "managed_instance_types",
    "managed_accelerators",
)
DEFAULT_MAX_NODES = 16
_SPLIT = re.compile(r"[\s,]+")
# Git URLs a node clones from (and the worker asks with ls-remote): http(s), ssh, git, or scp-like host:path.
_REMOTE_GIT_URL = re.compile(r"^(?:(?:https?|ssh|git)://|(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//))", re.I)
_KEY_PATH_VARIABLE = "GIT_SSH_KEY_PATH"


@dataclasses.dataclass(frozen=True)
class ConfPolicy:
    """The deployment's rules for run confs (see the module's docstring); the defaults are the safe ones.
    None stands for "any" where a setting may be `*`."""

    infras: tuple[str, ...] = ()  # () : every infra but local
    cluster_names: tuple[str, ...] = ()  # shared names (globs); a user's own namespace is always allowed
    pools: tuple[str, ...] = ()  # globs of the pools a run may use
    buckets: tuple[str, ...] | None = ()  # () : the run's own uploads only; None: any bucket
    default_store: str | None = None  # `[sky] default_store`: the store of a bucket named without one
    jobs_bucket: str | None = None  # `[sky] jobs_bucket`: there, a run reads its own uploads only
    ports: tuple[tuple[int, int], ...] | None = ()  # (lo, hi) ranges a task may open; None: any
    max_nodes: int = DEFAULT_MAX_NODES
    instance_types: tuple[str, ...] = (ANY,)  # globs
    accelerators: tuple[str, ...] = (ANY,)  # globs on the accelerator's name

    @classmethod
    def from_settings(
        cls,
        get: Callable[[str], str | None],
        default_store: str | None = None,
        jobs_bucket: str | None = None,
    ) -> ConfPolicy:
        """The policy from the settings `get(name)` reads (None or "" when unset). A bad setting (a bucket
        that is not a bucket URI, a port that is none) raises SpecError naming the setting."""
        infras = tuple(_items(get("managed_infras")))
        buckets_setting = _items(get("managed_buckets"))
        buckets: tuple[str, ...] | None = ()
        if ANY in buckets_setting:
            buckets = None
        elif buckets_setting:
            setting = setting_name("managed_buckets")
            buckets = tuple(_allowed_bucket(setting, item).uri for item in buckets_setting)
        jobs = _allowed_bucket(setting_name("jobs_bucket"), jobs_bucket.strip()).uri if jobs_bucket else None
        return cls(
            infras=tuple(i.lower() for i in infras),
            cluster_names=tuple(_items(get("managed_cluster_names"))),
            pools=tuple(_items(get("managed_pools"))),
            buckets=buckets,
            default_store=default_store,
            jobs_bucket=jobs,
            ports=parse_ports_setting(setting_name("managed_ports"), _items(get("managed_ports"))),
            max_nodes=parse_max_nodes(
                setting_name("managed_max_nodes"), get("managed_max_nodes"), DEFAULT_MAX_NODES
            ),
            instance_types=tuple(_items(get("managed_instance_types"))) or (ANY,),
            accelerators=tuple(_items(get("managed_accelerators"))) or (ANY,),
        )


def _items(value: str | None) -> list[str]:
    return [item for item in _SPLIT.split(value or "") if item]


def _allowed_bucket(setting: str, item: str) -> BucketMount:
    if not is_bucket_uri(item):
        raise SpecError(
            f"{setting}: {item!r} is not a bucket URI; write s3://<bucket>[/<prefix>] or gs://..."
        )
    mount = parse_bucket_uri(setting, item)
    _check_segments(setting, mount)
    return mount


# ---- the rules ---------------------------------------------------------------------------------------


def secret_references(task: Mapping[str, Any], names: Iterable[str] = ()) -> set[str]:
    """The strings that stand for a whole secret of `task` (`${NAME}`, `$NAME`): a run conf carries a secret
    substituted into the workdir or a file_mounts source so (Task.to_dict(secret_references=True)), and what
    it names is known only once the run reads the secret's value (`check_policy` judges it then)."""
    secrets = task.get("secrets")
    named = {name for name in secrets if isinstance(name, str)} if isinstance(secrets, Mapping) else set()
    return {ref for name in named | set(names) for ref in (f"${{{name}}}", f"${name}")}


def worker_paths(task: Mapping[str, Any], secret_names: Iterable[str] = ()) -> list[str]:
    """The fields of a run conf's task mapping (as written, before it is parsed) that name something on the
    worker, as `field (value)`: a local workdir or git URL, local file_mounts sources, GIT_SSH_KEY_PATH.
    A value that is a whole secret reference is left to the check of the task with its secrets' values."""
    found: list[str] = []
    deferred = secret_references(task, secret_names)
    workdir = task.get("workdir")
    if isinstance(workdir, str) and workdir not in deferred:
        found.append(f"workdir ({workdir})")
    elif isinstance(url := _mapping_get(workdir, "url"), str) and not (
        _REMOTE_GIT_URL.match(url) or url in deferred
    ):
        found.append(f"workdir.url ({url})")
    mounts = task.get("file_mounts")
    for dst, src in mounts.items() if isinstance(mounts, Mapping) else ():
        if isinstance(src, str) and not (is_bucket_uri(src) or src in deferred):
            found.append(f"file_mounts.{dst} ({src})")
        elif isinstance(src, Mapping):
            source = src.get("source")
            sources = source if isinstance(source, list) else [source] if source is not None else []
            if any(not (isinstance(s, str) and is_bucket_uri(s)) for s in sources):
                found.append(f"file_mounts.{dst}.source ({source})")
    for section in ("envs", "secrets"):
        values = task.get(section)
        if isinstance(values, Mapping) and _KEY_PATH_VARIABLE in values:
            found.append(f"{section}.{_KEY_PATH_VARIABLE}")
    return found


def _mapping_get(value: object, key: str) -> object:
    return value.get(key) if isinstance(value, Mapping) else None


def check_no_worker_paths(task: Mapping[str, Any], source: str, secret_names: Iterable[str] = ()) -> None:
    """SpecError for the first field of `task` that names something on the worker."""
    found = worker_paths(task, secret_names)
    if found:
        raise SpecError(
            f"{source}: task.{found[0]}: names a path on the Airflow worker, which a run conf may never do; "
            "`airflow-sky jobs launch` uploads local files to the jobs bucket, or use a bucket URI or a "
            "git workdir (https:// or ssh)"
        )


def infra_allowed(policy: ConfPolicy, infra: str) -> bool:
    """Whether a run may use `infra`: `local` only when listed as such; else a listed name covers itself and
    what is below it (`aws` covers `aws/us-east-1`), a glob matches the whole infra."""
    infra = infra.strip().lower()
    if any(part in ("", ".", "..") for part in infra.split("/")):
        return False  # `ssh/pool/../other` is no spelling of an allowed infra
    if infra.split("/", 1)[0] == LOCAL:
        return LOCAL in policy.infras
    if not policy.infras:
        return True
    return any(_infra_matches(pattern, infra) for pattern in policy.infras if pattern != LOCAL)


def _infra_matches(pattern: str, infra: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(infra, pattern)
    return infra == pattern or infra.startswith(pattern.rstrip("/") + "/")


def cluster_allowed(policy: ConfPolicy, cluster_name: str, user: str | None) -> bool:
    """Whether a run triggered by `user` may name `cluster_name`: one of its user's namespace, or a shared
    name of the deployment."""
    return in_namespace(cluster_name, user) or any(
        fnmatch.fnmatchcase(cluster_name, pattern) for pattern in policy.cluster_names
    )


def _cluster_refusal(policy: ConfPolicy, user: str | None, user_known: bool) -> str:
    """What a run of `user` may name instead."""
    namespace = user_namespace(user)
    if not user_known:
        own = f"name a cluster of your own, <your user>{SEPARATOR}<name> (the namespace of who triggers the run)"
    elif namespace:
        own = (
            f"name a cluster of your own, {namespace}<name> (the namespace of {user}, who triggered the run)"
        )
    else:
        own = "the run has no triggering user, so no namespace of its own"
    setting = setting_name("managed_cluster_names")
    shared = (
        f"or a shared one: {', '.join(policy.cluster_names)} ({setting})"
        if policy.cluster_names
        else f"the deployment shares none ({setting} is not set)"
    )
    return f"{own}; {shared}; or leave cluster_name out for a cluster of the run's own"


def bucket_allowed(policy: ConfPolicy, mount: BucketMount, own: Iterable[str] = ()) -> bool:
    """Whether the task may mount `mount`: in the jobs bucket only below the run's `own` prefixes (its
    uploads); elsewhere one the allow-list (or `own`) covers, any with `*` (None). A prefix with
    `.` or `..` segments is covered by nothing."""
    return _bucket_refusal(policy, mount, tuple(own)) is None


def _bucket_refusal(policy: ConfPolicy, mount: BucketMount, own: tuple[str, ...]) -> str | None:
    """Why `mount` is not allowed (what is), or None when it is."""
    if _bad_segments(mount.prefix):
        return "a bucket prefix has no empty, `.` or `..` segments"
    jobs = policy.jobs_bucket
    if jobs and (_covers(jobs, mount.uri) or _covers(mount.uri, jobs)):
        if any(_covers(prefix, mount.uri) for prefix in own):
            return None
        return (
            f"it holds the runs' uploads ({setting_name('jobs_bucket')}), of which a run reads its own only"
        )
    if policy.buckets is None or any(_covers(allowed, mount.uri) for allowed in (*policy.buckets, *own)):
        return None
    setting = setting_name("managed_buckets")
    if not policy.buckets:
        return (
            f"a run mounts only its own uploads on this deployment ({setting} is not set: it lists the buckets "
            "runs may mount, or * for any)"
        )
    return f"allowed: {', '.join(policy.buckets)} ({setting})"


def _covers(allowed: str, uri: str) -> bool:
    """Whether `uri` is `allowed` or below it (at a `/`: s3://a/b covers s3://a/b/c, not s3://a/bc)."""
    return uri == allowed or uri.startswith(allowed.rstrip("/") + "/")


def _bad_segments(prefix: str) -> bool:
    return any(part in (".", "..", "") for part in prefix.split("/")) if prefix else False


def _check_segments(field: str, mount: BucketMount) -> None:
    if _bad_segments(mount.prefix):
        raise SpecError(f"{field}: {mount.uri}: a bucket prefix with empty, `.` or `..` segments")


def check_run_conf(
    policy: ConfPolicy,
    task: Task,
    infra: str,
    cluster_name: str | None,
    uploads: str | None,
    source: str,
    user: str | None = None,
    user_known: bool = True,
    pool: str | None = None,
) -> None:
    """Refuse (SpecError, one line naming the field) what the deployment's policy does not allow: the pool,
    the infra
    (and every infra the task's resources name), the cluster name (`user`: who triggered the run; not
    `user_known`, as on a launching machine with a token: a name in some user's namespace passes, for the
    deployment to judge), the task's node count, ports, instance types and accelerators, and its buckets."""
    for field, value in [("infra", infra)] + [
        ("task.resources.infra", c.infra) for c in task.resources.candidates() if c.infra
    ]:
        if not infra_allowed(policy, value):
            raise SpecError(f"{source}: {field}: {value} is not allowed here; {_allowed_infras(policy)}")
    if (
        cluster_name is not None
        and not cluster_allowed(policy, cluster_name, user)
        and (user_known or SEPARATOR not in cluster_name[1:])
    ):
        raise SpecError(
            f"{source}: cluster_name: {cluster_name} is not allowed here; "
            f"{_cluster_refusal(policy, user, user_known)}"
        )
    if pool is not None and not any(fnmatch.fnmatchcase(pool, pattern) for pattern in policy.pools):
        allowed = ", ".join(policy.pools) or "none"
        raise SpecError(
            f"{source}: pool: {pool} is not allowed here; the pools runs may use: {allowed} "
            f"({setting_name('managed_pools')})"
        )
    check_resources(task, policy.ports, policy.max_nodes, policy.instance_types, policy.accelerators, source)
    if policy.buckets is None and policy.jobs_bucket is None:
        return
    own = (uploads,) if uploads else ()
    for mount in bucket_mounts(task, default_store(infra, policy.default_store)):
        refusal = _bucket_refusal(policy, mount, own)
        if refusal is not None:
            raise SpecError(
                f"{source}: task.file_mounts.{mount.destination}: bucket {mount.uri} is not allowed here; "
                f"{refusal}"
            )


def _allowed_infras(policy: ConfPolicy) -> str:
    setting = setting_name("managed_infras")
    if not policy.infras:
        return f"every infra but local is ({setting} is not set; `local` runs on the worker itself)"
    return f"allowed: {', '.join(policy.infras)} ({setting})"
