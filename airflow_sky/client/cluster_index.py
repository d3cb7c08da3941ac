"""`~/.airflow_sky/clusters.json`: which infra each cluster name was launched on, from this machine.

Only a hint that saves asking every infra: the infra is the source of truth, and a name the index lost
(a crash, a deleted file, a launch from another machine) is looked for there (client/cluster_search.py).
Writes are locked and atomic (client/record_files.py); a file that does not parse is set aside with one
line on stderr, and the commands go on without it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from airflow_sky.client import record_files
from airflow_sky.infra.home import sky_home


class IndexUnreadable(ValueError):
    """The index file holds something that is not a mapping of cluster names to infras."""


def index_path() -> Path:
    return sky_home() / "clusters.json"


def parse_index(text: str) -> dict[str, str]:
    """The index in `text`: a JSON object of cluster name -> infra name."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise IndexUnreadable(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if not isinstance(data, dict):
        raise IndexUnreadable(
            f"a JSON object of cluster name -> infra is expected, got {type(data).__name__}"
        )
    for name, infra in data.items():
        if not isinstance(infra, str) or not infra:
            raise IndexUnreadable(f"cluster {name!r}: its infra must be a non-empty string, got {infra!r}")
    return data


def index_text(index: dict[str, str]) -> str:
    return json.dumps(index, indent=1, sort_keys=True) + "\n"


def read_index() -> dict[str, str]:
    """The index as it is now (no lock needed: writers replace the whole file). An unreadable one is set
    aside, once, and counts as empty."""
    path = index_path()
    try:
        return parse_index(_read(path))
    except FileNotFoundError:
        return {}
    except IndexUnreadable:
        with record_files.locked(path):
            return _current(path)  # re-read under the lock: a writer may have fixed it meanwhile


def infra_hint(cluster_name: str) -> str | None:
    """The infra the index names for `cluster_name`; None when it has no entry."""
    return read_index().get(cluster_name)


def remember(cluster_name: str, infra: str | None) -> None:
    """Record (or, with None, drop) the infra of `cluster_name`, keeping every other entry."""
    path = index_path()
    with record_files.locked(path):
        index = _current(path)
        if infra is None:
            if cluster_name not in index:
                return
            index.pop(cluster_name)
        elif index.get(cluster_name) == infra:
            return
        else:
            index[cluster_name] = infra
        record_files.replace_atomically(path, index_text(index), mode=0o600)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise IndexUnreadable(f"not UTF-8 text (byte {e.start})") from e
    except FileNotFoundError:
        raise
    except OSError as e:  # a directory in its place, no read permission
        raise IndexUnreadable(f"cannot be read: {e.strerror or e}") from e


def _current(path: Path) -> dict[str, str]:
    """The index, read with the lock held; an unreadable file is moved aside and reported."""
    try:
        return parse_index(_read(path))
    except FileNotFoundError:
        return {}
    except IndexUnreadable as e:
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        backup = path.with_name(f"{path.name}.unreadable-{stamp}")
        path.replace(backup)
        print(
            f"airflow-sky: warning: {path}: {e}; kept as {backup.name} and started afresh "
            "(clusters it named are found through their infras)",
            file=sys.stderr,
        )
        return {}
