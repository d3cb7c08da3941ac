"""What a cancelled managed job's killed follow tasks leave of a torn-down local cluster (the managed jobs
DAG's `remove_leftovers`, operators.managed_leftovers): its folder, brought back by their last progress
records after the teardown removed it. Removed once nothing writes there any more."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from airflow_sky.infra.local import layout

QUIET_S = 10.0  # nothing written in a leftover folder for this long: its writers are gone
WAIT_S = 120.0  # the longest this task waits for that


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
