"""The local infra's StateStore: one JSON file per record in the cluster's state dir.

Writes take an exclusive flock on the cluster's state lock, compare the version on disk and replace the file
atomically; reads take no lock (a rename is atomic, so a reader sees the old or the new record, never half).
A record's write time is its file's mtime: the host's kernel clock, which every writer of a local store
shares (and which a process's patched or skewed `time.time` does not change).
The records live as long as the cluster (`terminate` removes them with it), like SkyPilot's job queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow_sky.infra.state_store import StateStore, Versioned, validate_key


class LocalStateStore(StateStore):
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{validate_key(key)}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def get(self, key: str) -> Versioned | None:
        try:
            with self._path(key).open() as f:
                written_at = os.fstat(f.fileno()).st_mtime  # of the very file read (a rename replaces it)
                raw = json.load(f)
        except FileNotFoundError:
            return None
        return Versioned(int(raw["version"]), raw["data"], written_at)

    def put(self, key: str, data: dict[str, Any], expected_version: int | None) -> Versioned | None:
        path = self._path(key)
        with self._locked():
            current = self.get(key)
            if (current.version if current else None) != expected_version:
                return None
            version = (current.version if current else 0) + 1
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "w") as f:
                json.dump({"version": version, "data": data}, f, sort_keys=True)
                f.flush()
                written_at = os.fstat(f.fileno()).st_mtime
            os.replace(tmp, path)
        return Versioned(version, data, written_at)

    def keys(self, prefix: str) -> list[str]:
        base = self.directory / validate_key(prefix)
        if not base.is_dir():
            return []
        return sorted(f"{prefix}/{p.stem}" for p in base.glob("*.json"))
