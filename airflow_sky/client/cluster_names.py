"""Cluster names: what a cluster may be called (SkyPilot's rule) and the host name label it is called here.
The one place a name is checked and normalized; everything past the CLI and the SDK gets it normalized."""

from __future__ import annotations

import getpass
import re
import secrets

from airflow_sky.errors import SpecError
from airflow_sky.gang.job import sanitize_cluster_name

CLUSTER_NAME_PATTERN = "[a-z]([-a-z0-9]*[a-z0-9])?"  # a host name label: what a cluster is called here
SKYPILOT_CLUSTER_NAME_PATTERN = "[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?"  # what `sky -c` accepts


def check_cluster_name(name: str) -> str:
    """The name a cluster `name` has here. A name SkyPilot refuses is refused; one SkyPilot accepts but that
    is no host name label (`Dev_Box`) becomes one (`dev-box`): callers say so (cluster_name_note)."""
    if not re.fullmatch(SKYPILOT_CLUSTER_NAME_PATTERN, name):
        raise SpecError(
            f"cluster name {name!r} is invalid: it must match {SKYPILOT_CLUSTER_NAME_PATTERN} (as in SkyPilot; "
            f"here it becomes {CLUSTER_NAME_PATTERN}, at most 40 characters), e.g. {sanitize_cluster_name(name)!r}"
        )
    return sanitize_cluster_name(name)


def cluster_name_note(name: str) -> str | None:
    """A line saying what a valid but changed cluster name is called here; None when unchanged."""
    here = check_cluster_name(name)
    if here == name:
        return None
    return (
        f"cluster {name!r} is named {here!r} here (cluster names are host name labels: lowercase letters, "
        "digits and '-', at most 40 characters)"
    )


def cluster_name_here(name: str) -> str:
    """The host name label `name` is here, unchecked: for a name an SDK call gives of a cluster that exists
    (`exec`), which check_cluster_name would refuse where SkyPilot's rule does."""
    return sanitize_cluster_name(name)


def task_cluster_name(task_name: str | None) -> str:
    """The SDK's cluster for a launch that names none: `sky-<task name>`."""
    return sanitize_cluster_name(f"sky-{task_name or 'job'}")


def generated_cluster_name() -> str:
    """A launch's cluster when none is named: `sky-<4 hex>-<user>`, as SkyPilot names one."""
    return sanitize_cluster_name(f"sky-{secrets.token_hex(2)}-{getpass.getuser()}")


def pipeline_cluster_name(base: str, index: int, job_id: str) -> str:
    """The cluster of a pipeline's task `index` (job `job_id`) when the pipeline is launched as `base`."""
    return sanitize_cluster_name(f"{base[:24]}-{index}-{job_id}")
