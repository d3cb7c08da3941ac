"""Whose clusters a managed job may name, and the name a run's own cluster gets, as pure rules.

A cluster is shared by every run that names it: a job on it can leave files behind, see the others' processes,
and its jobs run one after the other on the same nodes. So on a shared deployment a run conf names only

- a cluster in the namespace of the user who triggered the run: `<label>--<anything>`, where `<label>` is the
  Airflow user name as a host name label (user_label); the `--` ends it, and no label holds `--`, so no
  user's namespace lies inside another's (`bob--` never covers `bob-ops--x`), or
- one of the deployment's shared names (`[sky] managed_cluster_names`, globs), which every user may name.

A run that names none gets a cluster of its own, `<dag>[-job<n>]-<16 hex>`: 64 random bits drawn once by
the run's spec task and handed to the job's tasks with its spec, never derived from the run id (a run id is
chosen by whoever triggers the run, so a name derived from it can be aimed at another run's cluster). It holds
no `--`, so it lies in no user's namespace.
"""

from __future__ import annotations

import hashlib
import re
import secrets

SEPARATOR = "--"  # ends a user's label in the names of their clusters
MAX_NAME_LEN = 40  # what a cluster name may be here (gang.job.sanitize_cluster_name)
MAX_LABEL_LEN = 20  # a user's label: a name longer than this is shortened and hashed
RANDOM_HEX = 16  # 64 bits in a run's own cluster name
_CLEAN = re.compile(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9]))*")  # a label with no `--` and no trailing `-`
_NOT_LABEL = re.compile(r"[^a-z0-9]+")


def user_label(user: str) -> str:
    """The host name label standing for Airflow user `user` in cluster names: the name itself when it is one
    already (lower case letters, digits, single `-`, a letter first, at most 20 characters: `alice`,
    `bob-ops`), else its readable part and 40 bits of its SHA-256 (`Bob.Smith` -> `bob-smit-274c9d19d9`):
    two user names never share a label unless an administrator names an account after another's label."""
    if _CLEAN.fullmatch(user) and len(user) <= MAX_LABEL_LEN:
        return user
    readable = _NOT_LABEL.sub("-", user.lower()).strip("-")[:8].rstrip("-")
    if not readable or not readable[0].isalpha():
        readable = f"u{readable}"[:8].rstrip("-")
    return f"{readable}-{hashlib.sha256(user.encode()).hexdigest()[:10]}"


def user_namespace(user: str | None) -> str | None:
    """The prefix of the cluster names `user` may use (`alice--`); None for a run without a triggering user
    (a scheduled run, one created by the scheduler itself), which has no namespace."""
    return None if not user else user_label(user) + SEPARATOR


def in_namespace(cluster_name: str, user: str | None) -> bool:
    """Whether `cluster_name` (as provision names it) lies in the namespace of `user`."""
    prefix = user_namespace(user)
    return prefix is not None and cluster_name.startswith(prefix) and len(cluster_name) > len(prefix)


def run_cluster_name(dag_id: str, job: str | None = None) -> str:
    """A fresh name for a run's own cluster (the `job` of a pipeline: `job2`): `<dag>[-<job>]-<16 hex>`,
    at most 40 characters, no `--`, 64 random bits. Drawn once per run by its spec task."""
    first = _label_part(dag_id, 16)
    if not first[:1].isalpha():
        first = _label_part(f"sky-{first}", 16)
    parts = [first, _label_part(job, 6) or "job"] if job else [first]
    return "-".join([*parts, secrets.token_hex(RANDOM_HEX // 2)])


def _label_part(text: str, length: int) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")[:length].strip("-")
