"""The last teardown of a managed job run: what a cancel can leave of a local cluster after its teardown.

`jobs cancel` marks the run failed; Airflow kills its follow tasks while the job's teardown already runs.
A follow task writes its rank's last progress record (`state/progress/<job>/<rank>`) as it stops, which
can come after the teardown removed the cluster's folder, and so brings back `<cluster>/state/progress`.
Once such a folder (a local cluster's, holding no node) has been left alone for QUIET_S, it is removed.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from airflow_sky.infra.local import layout

QUIET_S = 10.0  # nothing written in a leftover folder for this long: its writers are gone
WAIT_S = 120.0  # the longest this task waits for that
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one path segment, never `..`


def _leftover(name: str) -> Path | None:
    """The folder of local cluster `name` when it holds no node (what a teardown removed), else None."""
    folder = layout.cluster_dir(name)
    instances = folder / "instances"
    if not folder.is_dir() or (instances.is_dir() and any(instances.iterdir())):
        return None
    return folder


def _last_write(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            times.append(path.stat().st_mtime)
    return max(times)


def remove_leftover_clusters(
    names: Iterable[str],
    log: Callable[[str], object],
    quiet_s: float = QUIET_S,
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Remove the folders of the local clusters `names` that hold no node, each once nothing was written in
    it for `quiet_s` (waiting at most `wait_s` in all); returns the names removed."""
    pending = set(names)
    removed: list[str] = []
    deadline = clock() + wait_s
    while pending:
        for name in sorted(pending):
            folder = _leftover(name)
            if folder is None:
                pending.discard(name)
            elif clock() - _last_write(folder) >= quiet_s:
                shutil.rmtree(folder, ignore_errors=True)
                log(f"Removed what the stopped follow tasks left of cluster {name}: {folder}")
                removed.append(name)
                pending.discard(name)
        if not pending or clock() >= deadline:
            break
        time.sleep(min(1.0, quiet_s))
    for name in sorted(pending):
        log(f"Cluster {name}'s folder was still being written after {wait_s:.0f}s; left as it is")
    return removed


class SkyRemoveLeftoversOperator(BaseOperator):
    """Removes what the run's killed follow tasks wrote of a torn-down local cluster after its teardown
    (module docstring). Reads the clusters from the spec tasks' XCom: only those that go down, on local."""

    ui_color = "#e8eaf6"

    def __init__(self, *, spec_task_ids: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_task_ids = spec_task_ids

    def execute(self, context: Any) -> None:
        specs = [context["ti"].xcom_pull(task_ids=task_id) for task_id in self.spec_task_ids]
        names = [
            str(spec["cluster_name"])
            for spec in specs
            if isinstance(spec, dict)
            and spec.get("down")
            and str(spec.get("infra") or "").split("/")[0] == "local"
            and isinstance(spec.get("cluster_name"), str)
            and _NAME.fullmatch(spec["cluster_name"])
            and ".." not in spec["cluster_name"]
        ]
        if names:
            remove_leftover_clusters(names, self.log.info)
